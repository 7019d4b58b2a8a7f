"""mempo.utils.buckets: consecutive items in bounded buckets."""
from mempo.utils.buckets import plan_buckets


def test_plan_buckets_keeps_order_and_puts_a_large_item_alone():
    assert plan_buckets({"a": 3, "b": 3, "c": 10, "d": 1}, 6) == [["a", "b"], ["c"], ["d"]]
