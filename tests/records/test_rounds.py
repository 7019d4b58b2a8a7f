"""mempo.records.rounds: which rounds are scored, and the <mem> span rule on well-formed and malformed rounds."""
from mempo.records.rounds import FIRST_SCORED_ROUND, is_scored, round_mem_span
from mempo.ops.spans import Span


def mem(start, end, closed=True, round_=0):
    return Span("mem", start, end, round_, closed)


def test_round_one_is_never_scored():
    assert FIRST_SCORED_ROUND == 1
    assert not is_scored(0, (0, 4))
    assert is_scored(1, (10, 14)) and is_scored(7, (3, 5))
    assert not is_scored(1, None) and not is_scored(0, None)


def test_well_formed_round_gets_the_scanner_span():
    assert round_mem_span(10, 30, "<mem>facts</mem><think>t</think>", [mem(2, 6), mem(10, 15)]) == (10, 15)


def test_span_is_clipped_to_the_round_end():
    assert round_mem_span(10, 20, "<mem>facts</mem>", [mem(10, 25)]) == (10, 20)


def test_first_span_starting_in_the_round_wins():
    text = "<mem>a</mem><mem>b</mem>"
    assert round_mem_span(10, 30, text, [mem(12, 16), mem(18, 22)]) == (12, 16)


def test_malformed_rounds_have_no_span():
    spans = [mem(10, 15)]
    assert round_mem_span(10, 30, "<think>no memory</think>", []) is None  # no <mem> in the round
    assert round_mem_span(16, 30, "<mem>x</mem>", spans) is None  # the span starts in an earlier round
    assert round_mem_span(0, 10, "<mem>x</mem>", spans) is None  # ... or in a later one
    assert round_mem_span(10, 30, "<mem>x", [mem(10, 30, closed=False)]) is None  # never closed (scanner)
    assert round_mem_span(10, 30, "<mem>x", spans) is None  # never closed (text)
    assert round_mem_span(10, 30, "<mem>  \n </mem><think>t</think>", spans) is None  # blank memory
    assert round_mem_span(10, 30, "<mem></mem>", spans) is None  # empty memory
