"""Outcome scoring (`mempo.protocol.reward`): normalisation, EM, F1, multi-objective episodes."""
import numpy as np
import pytest

from mempo.protocol.reward import memory_keeps as reward_memory_keeps
from mempo.protocol.reward import memory_kept_share, response_retrieved_objectives, retrieved_objectives
from mempo.protocol.reward import (
    compute_score,
    em_check,
    f1_score,
    normalize_answer,
    objectives_from_golds,
    split_answer,
)
from mempo.protocol.tags import JSON_TAG_SET


def respond(answer: str) -> str:
    """A well-formed two-round response ending with ``answer``."""
    return ("<mem></mem><think>look it up</think><search>q</search>"
            "<information>doc</information>"
            f"<mem>found it</mem><think>answer now</think><answer>{answer}</answer>")


@pytest.mark.parametrize("raw, normalized", [
    ("The Hurt Locker", "hurt locker"),
    ("  Kathryn   BIGELOW. ", "kathryn bigelow"),
    ("an apple, a pear & the fig!", "apple pear fig"),
    ("Theatre anthem", "theatre anthem"),  # articles only as whole words
    ("U.S.A.", "usa"),
    ("", ""),
    ("The", ""),
])
def test_normalize_answer(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_em_check_aliases_and_string_golds():
    assert em_check("the Hurt Locker", ["Avatar", "Hurt Locker"])
    assert not em_check("Hurt", ["Hurt Locker"])
    assert em_check("Paris", "paris.")
    assert not em_check("a", "abc")  # a string gold is one alias, never its characters
    assert not em_check(None, ["x"])
    assert not em_check("x", [])


def test_f1_score():
    assert f1_score("Kathryn Bigelow", ["Kathryn Bigelow"]) == 1.0
    # 1 common token of 2 predicted and 3 gold: P=1/2, R=1/3, F1=0.4
    assert f1_score("Bigelow film", ["Kathryn Ann Bigelow"]) == pytest.approx(0.4)
    assert f1_score("Bigelow film", ["nobody", "Kathryn Ann Bigelow"]) == pytest.approx(0.4)
    assert f1_score("apple apple", ["apple"]) == pytest.approx(2 / 3)
    assert f1_score("something", ["else"]) == 0.0


def test_f1_empty_cases():
    assert f1_score(None, ["x"]) == 0.0
    assert f1_score("The", ["a"]) == 1.0 and em_check("The", ["a"])
    assert f1_score("", ["x"]) == 0.0
    assert f1_score("x", [""]) == 0.0
    assert f1_score("x", []) == 0.0


def test_split_answer():
    assert split_answer("Paris; Rome", 2) == ["Paris", "Rome"]
    assert split_answer("Paris; France", 1) == ["Paris; France"]
    assert split_answer(" Paris ", 1) == ["Paris"]
    assert split_answer("Paris", 3) == ["Paris", None, None]
    assert split_answer("Paris;;Rome", 3) == ["Paris", None, "Rome"]
    assert split_answer("a;b;c;d", 2) == ["a", "b"]
    assert split_answer(None, 2) == [None, None]
    with pytest.raises(ValueError):
        split_answer("a", 0)


def test_objectives_from_golds_forms():
    assert objectives_from_golds("Paris") == [["Paris"]]
    assert objectives_from_golds(["Paris", "paris, france"]) == [["Paris", "paris, france"]]
    assert objectives_from_golds([["Paris"], ("Rome", "Roma")]) == [["Paris"], ["Rome", "Roma"]]
    aliases = np.array(["Paris", "City of Light"])
    assert objectives_from_golds(aliases) == [["Paris", "City of Light"]]
    ragged = np.empty(2, dtype=object)
    ragged[0], ragged[1] = np.array(["Paris"]), np.array(["Rome", "Roma"])
    assert objectives_from_golds(ragged) == [["Paris"], ["Rome", "Roma"]]
    with pytest.raises(ValueError):
        objectives_from_golds([])
    with pytest.raises(ValueError):
        objectives_from_golds(["Paris", ["Rome"]])


def test_compute_score_single_objective():
    right = compute_score(respond("The Hurt Locker"), ["Hurt Locker"])
    assert right["score"] == 1.0 and right["em"] == 1.0 and right["f1"] == 1.0
    assert right["format_ok"] and right["failed_rules"] == ()
    assert right["num_objectives"] == 1 and right["answer"] == "The Hurt Locker"
    assert right["per_objective"] == [
        {"prediction": "The Hurt Locker", "golds": ["Hurt Locker"], "em": 1.0, "f1": 1.0}]
    wrong = compute_score(respond("Avatar"), ["Hurt Locker"])
    assert wrong["score"] == 0.0 and wrong["em"] == 0.0 and wrong["format_ok"]


def test_wrong_format_scores_zero_but_reports_em_and_f1():
    text = "Final: " + respond("Hurt Locker")
    result = compute_score(text, ["Hurt Locker"])
    assert result["score"] == 0.0
    assert not result["format_ok"] and result["failed_rules"] == ("no_text_outside_tags",)
    assert result["em"] == 1.0 and result["f1"] == 1.0
    lenient = compute_score(text, ["Hurt Locker"], format_kwargs={"allow_text_outside_tags": True})
    assert lenient["score"] == 1.0 and lenient["format_ok"]


def test_no_answer_scores_zero():
    text = "<mem></mem><think>t</think><search>q</search><information>doc</information>"
    result = compute_score(text, ["x"])
    assert result["answer"] is None and result["score"] == 0.0 and result["f1"] == 0.0
    assert result["failed_rules"] == ("ends_with_answer",)


def test_multi_objective_modes():
    golds = [["Paris"], ["Rome", "Roma"], ["Berlin"]]
    text = respond("paris; Roma; Bonn")
    mean = compute_score(text, golds)
    assert mean["num_objectives"] == 3
    assert [o["em"] for o in mean["per_objective"]] == [1.0, 1.0, 0.0]
    assert mean["score"] == pytest.approx(2 / 3) and mean["em"] == pytest.approx(2 / 3)
    assert compute_score(text, golds, mode="all")["score"] == 0.0
    assert compute_score(text, golds, mode="sum")["score"] == 2.0
    all_right = respond("Paris; Rome; Berlin")
    assert compute_score(all_right, golds, mode="all")["score"] == 1.0
    with pytest.raises(ValueError):
        compute_score(text, golds, mode="max")


def test_multi_objective_missing_sub_answer_scores_zero_for_its_objective():
    result = compute_score(respond("Paris"), [["Paris"], ["Rome"]])
    assert [o["prediction"] for o in result["per_objective"]] == ["Paris", None]
    assert [o["em"] for o in result["per_objective"]] == [1.0, 0.0]
    assert [o["f1"] for o in result["per_objective"]] == [1.0, 0.0]
    assert result["score"] == 0.5 and result["f1"] == 0.5


def test_no_gold_scores_zero_as_documented():
    """Issue 10, case 11: compute_score(text, []) raised although an empty alias list scores 0."""
    result = compute_score(respond("Paris"), [])
    assert result["score"] == 0.0 and result["em"] == 0.0 and result["f1"] == 0.0 and result["format_ok"]
    assert result["num_objectives"] == 1 and result["per_objective"][0]["golds"] == []
    assert compute_score(respond("Paris"), iter(["Paris"]))["score"] == 1.0  # a one-shot iterator is read once
    with pytest.raises(ValueError):
        objectives_from_golds([])  # callers that need an alias (answer templates) still get an error


def test_numeric_golds_are_aliases_in_their_string_form():
    """Issue 10, case 11: golds [5, 6] gave "'int' object is not iterable"."""
    assert objectives_from_golds([5, 6]) == [["5", "6"]]
    assert objectives_from_golds(5) == [["5"]]
    assert objectives_from_golds([[5], ["six", 6.0]]) == [["5"], ["six", "6"]]
    assert objectives_from_golds(np.array([5, 6])) == [["5", "6"]]
    assert (objectives_from_golds([np.float32(2.5), np.int64(7), 1e15, 1e20])
            == [["2.5", "7", "1000000000000000", "1e+20"]])
    assert compute_score(respond("5"), [5, 6])["score"] == 1.0
    assert compute_score(respond("6"), 6)["score"] == 1.0
    assert compute_score(respond("5; 6"), [[5], [6]])["score"] == 1.0
    assert em_check("5", 5) and f1_score("2.5", [2.5]) == 1.0


@pytest.mark.parametrize("golds, fragment", [
    (None, "got NoneType None"),
    ([None], "got NoneType None"),
    ([True], "got bool True"),
    (True, "got bool True"),
    ({"answer": "Paris"}, "got a dict"),
    ([["Paris"], [None]], "got NoneType"),
])
def test_golds_of_no_usable_type_are_rejected_by_name(golds, fragment):
    with pytest.raises(ValueError, match=fragment):
        compute_score(respond("Paris"), golds)


def test_memory_keeps():
    seen = "<information>Tamor was born in the city of Belis.</information>"
    golds = [["Belis"], ["Rome"]]
    assert reward_memory_keeps("Q1: Tamor was born in the city of Belis.\nQ2: ?", seen, golds) is True
    assert reward_memory_keeps("Q1: done\nQ2: ?", seen, golds) is False
    assert reward_memory_keeps("Q1: Belisar", seen, golds) is False  # whole words only
    assert reward_memory_keeps("Q1: ?", "<information>nothing yet</information>", golds) is None
    assert reward_memory_keeps("Belis and Rome", seen + " Rome", golds) is True


def test_memory_kept_share_is_the_graded_memory_keeps():
    golds = [["Belis"], ["Rome", "Roma"], ["Nefu"], ["Sokol"]]
    seen = "Tamor was born in Belis. The river is the Roma. Bevat studied at Nefu."  # three retrieved
    assert memory_kept_share("Q1: Belis\nQ2: Roma\nQ3: Nefu\nQ4: ?", seen, golds) == 1.0
    assert memory_kept_share("Q1: Belis\nQ2: done\nQ3: Nefu\nQ4: ?", seen, golds) == pytest.approx(2 / 3)
    assert memory_kept_share("Q1: Belisar\nQ2: Rome", seen, golds) == pytest.approx(1 / 3)  # whole words, any alias
    assert memory_kept_share("nothing kept", seen, golds) == 0.0
    assert memory_kept_share("Q4: Sokol", seen, golds) == 0.0  # a gold not yet retrieved is not counted
    assert memory_kept_share("Q1: Belis", "nothing read yet", golds) is None
    for mem in ("Q1: Belis Roma Nefu", "Q1: Belis", ""):  # 1.0 exactly where memory_keeps is True
        assert (memory_kept_share(mem, seen, golds) == 1.0) is reward_memory_keeps(mem, seen, golds)


def test_retrieved_objectives():
    golds = [["Belis"], ["Rome", "Roma"], ["New York"]]
    assert retrieved_objectives("<information>Tamor was born in Belis.</information>", golds) == [0]
    assert retrieved_objectives("born in Belis; later Roma and new york", golds) == [0, 1, 2]
    assert retrieved_objectives("Belisar of Romans", golds) == []  # whole words only
    assert retrieved_objectives("", "Paris") == []
    assert retrieved_objectives("the capital is Paris", ["Paris", "paris"]) == [0]  # one objective, two aliases


def test_response_retrieved_objectives_reads_only_the_tool_results():
    golds = [["Belis"], ["Roma"]]
    response = ("<mem>Q1: ? Q2: Roma</mem><think>Roma, I guess</think><search>Tamor born</search>"
                "<information>Tamor was born in Belis.</information>"
                "<mem>Q1: Belis</mem><think>t</think><answer>Belis; Roma</answer>")
    assert response_retrieved_objectives(response, golds) == [0]  # Roma only in the agent's own text
    assert response_retrieved_objectives(response.replace("Belis.", "Belis, Roma."), golds) == [0, 1]
    assert response_retrieved_objectives("<mem>m</mem><think>t</think><answer>Belis</answer>", golds) == []
    json_response = response.replace("<search>Tamor born</search>", '<tool_call>{"name": "search"}</tool_call>') \
        .replace("information>", "tool_response>")
    assert response_retrieved_objectives(json_response, golds, JSON_TAG_SET) == [0]  # the tag set's result tag
