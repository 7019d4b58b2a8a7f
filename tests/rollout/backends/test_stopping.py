"""Round stop detection on token bytes: the action-closing marker under the span grammar, split over
tokens, merged with following characters, inside other blocks; checked against mempo.protocol.grammar."""
import random

import pytest

from mempo.protocol.grammar import find_blocks
from mempo.rollout.backends import ActionStopScanner, TokenBytes, action_closing_token_ids, cut_round
from mempo.protocol.tags import ACTION_TAGS, JSON_TAG_SET, TAG_SET
from support.toy_tokenizers import (byte_level_tokenizer, json_random_text, json_special_tag_tokenizer, random_text,
                                    special_tag_tokenizer, whole_text_tokenizer)


def first_action_close(text: str, tags=TAG_SET):
    """Byte offset just past the first closed action block (the protocol's parse), or None."""
    ends = [b.end for b in find_blocks(text, tags) if b.tag in tags.actions and b.closed]
    return len(text[:min(ends)].encode()) if ends else None


@pytest.mark.parametrize("text, expected", [
    ("<mem>a</mem><think>b</think><search>q</search>tail", "<search>q</search>"),
    ("<think>I will write </search> later</think><answer>x</answer>", "<answer>x</answer>"),
    ("<information><search>x</search></information><access>d 1</access>", "<access>d 1</access>"),
    ("<mem>m <search>q</search> rest", "<search>q</search>"),  # an opening marker ends <mem> unclosed
    ("<search>q<answer>a</answer>", "<answer>a</answer>"),
    ("<mem><<mem>>x</mem><think></think><answer><b>y</b></answer>", "</answer>"),
])
def test_scanner_stops_where_the_grammar_closes_an_action(text, expected):
    data = text.encode()
    stop = data.index(expected.encode()) + len(expected)
    for split in range(len(data) + 1):  # every split of the text into two feeds
        scanner = ActionStopScanner()
        first = scanner.feed(data[:split])
        assert first == (split >= stop)
        if not first:
            assert scanner.feed(data[split:])
    for step in (1, 2, 3):  # byte by byte and in small pieces: True exactly at the closing piece
        scanner = ActionStopScanner()
        closed_at = next(i for i in range(0, len(data), step) if scanner.feed(data[i:i + step]))
        assert closed_at <= stop - 1 < closed_at + step


def test_no_action_no_stop():
    scanner = ActionStopScanner()
    assert not scanner.feed(b"<mem>a</mem><think></search></answer></think><information></answer>")
    assert scanner.open_tag == "information" and scanner.closed_action is None


@pytest.mark.parametrize("make", [byte_level_tokenizer, special_tag_tokenizer, whole_text_tokenizer])
def test_cut_round_matches_the_protocol_on_random_texts(make):
    tok = make()
    token_bytes = TokenBytes.of(tok)
    rng = random.Random(7)
    checked = 0
    for _ in range(300):
        text = random_text(rng)
        ids = tok.encode(text).ids
        cut = cut_round(ids, token_bytes)
        boundary = first_action_close(text)
        if boundary is None:
            assert cut.reason == "length" and cut.token_ids == ids
            continue
        checked += 1
        kept = token_bytes.join(cut.token_ids)
        assert cut.reason == "action"
        # the kept ids end with the token that completes the closing marker
        assert len(kept) >= boundary > len(token_bytes.join(cut.token_ids[:-1]))
        assert cut.action == next(b.tag for b in find_blocks(text) if b.tag in ACTION_TAGS and b.closed
                                  and len(text[:b.end].encode()) == boundary)
    assert checked > 100


def test_cut_round_prefix_stop_ids_and_limit():
    tok = byte_level_tokenizer()
    token_bytes = TokenBytes.of(tok)
    enc = lambda s: tok.encode(s).ids  # noqa: E731
    prefix = enc("<search>")
    # the prefix opened the action: its closing marker alone stops the round
    assert cut_round(enc("query</search> more"), token_bytes, prefix_ids=prefix).reason == "action"
    assert cut_round(enc("query</search> more"), token_bytes).reason == "length"
    body = enc("</mem><think>x") + [0] + enc("y</think>")
    cut = cut_round(body, token_bytes, stop_token_ids=[0])
    assert cut.reason == "eos" and cut.token_ids[-1] == 0 and len(cut.token_ids) == body.index(0) + 1
    cut = cut_round(body, token_bytes, max_new_tokens=3)
    assert cut == (body[:3], "length", None)
    assert token_bytes[10 ** 6] == b""  # ids beyond the tokenizer have no bytes


def test_action_closing_token_ids():
    special = TokenBytes.of(special_tag_tokenizer())
    ids = action_closing_token_ids(special)
    assert {special.pieces[i] for i in ids} >= {b"</search>", b"</access>", b"</answer>"}
    assert all(any(m in special.pieces[i] for m in (b"</search>", b"</access>", b"</answer>")) for i in ids)


@pytest.mark.parametrize("make", [byte_level_tokenizer, json_special_tag_tokenizer, whole_text_tokenizer])
def test_json_tags_stop_at_the_closing_tool_call(make):
    """Under the JSON tool-call tags a round stops where the grammar closes <tool_call> or <answer>, on
    texts of that format (markers split over tokens, merged with what follows, inside <tool_response>)."""
    tok = make()
    token_bytes = TokenBytes.of(tok)
    rng = random.Random(11)
    checked = 0
    for _ in range(300):
        text = json_random_text(rng)
        ids = tok.encode(text).ids
        cut = cut_round(ids, token_bytes, tags=JSON_TAG_SET)
        boundary = first_action_close(text, JSON_TAG_SET)
        if boundary is None:
            assert cut.reason == "length" and cut.token_ids == ids
            continue
        checked += 1
        kept = token_bytes.join(cut.token_ids)
        assert cut.reason == "action" and len(kept) >= boundary > len(token_bytes.join(cut.token_ids[:-1]))
    assert checked > 100
    scanner = ActionStopScanner(JSON_TAG_SET)
    assert not scanner.feed(b"<mem>a</mem><think>t</think><search>q</search><tool_response></tool_call>")
    assert scanner.feed(b"</tool_response><tool_call>{}</tool_call>") and scanner.closed_action == "tool_call"
    json_ids = action_closing_token_ids(TokenBytes.of(json_special_tag_tokenizer()), JSON_TAG_SET)
    assert {TokenBytes.of(json_special_tag_tokenizer()).pieces[i] for i in json_ids} >= {b"</tool_call>", b"</answer>"}
