"""Differential tests: the C++ scanner against the Python reference (decode + regex) on >= 10,000
seeded random texts per tokenizer, on random id sequences no tokenizer would produce, and on raw
byte strings; then the same with the JSON tool-call tag table (`JSON_TAG_SET`), where the C++ token
path, the C++ byte path, the Python reference and the text grammar (`mempo.protocol.grammar`) must all
agree. Every comparison batches all sequences into one `find_spans` call."""
import random

import numpy as np
import pytest

from support import toy_tokenizers
from mempo import _scanner
from mempo.ops.reference.spans import blocks_of_text_reference, find_spans_reference
from mempo.ops.spans import TokenTable, find_spans
from mempo.protocol.grammar import find_blocks
from mempo.protocol.tags import JSON_TAG_SET, TAG_SET

NUM_TEXTS = 10_000


@pytest.fixture(scope="module")
def texts():
    rng = random.Random(20260301)
    return [toy_tokenizers.random_text(rng) for _ in range(NUM_TEXTS)]


TOKENIZERS = {
    "byte_level": toy_tokenizers.byte_level_tokenizer,
    "special_tags": toy_tokenizers.special_tag_tokenizer,
    "whole_text": toy_tokenizers.whole_text_tokenizer,
}


@pytest.fixture(scope="module")
def encoded(texts):
    """ids per tokenizer name (tokenised once for the whole module)."""
    return {name: [e.ids for e in make().encode_batch(texts)] for name, make in TOKENIZERS.items()}


def first_mismatch(got, expected, texts):
    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            return f"sequence {i}: text={texts[i]!r}\n got={g}\nwant={e}"
    return None


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_cpp_equals_reference_on_random_texts(name, texts, encoded):
    tokenizer = TOKENIZERS[name]()
    ids = encoded[name]
    got = find_spans(ids, tokenizer).to_lists()
    expected = find_spans_reference(ids, tokenizer)
    assert len(got) == NUM_TEXTS
    assert first_mismatch(got, expected, texts) is None, first_mismatch(got, expected, texts)
    # The texts exercise the grammar: many spans, unclosed ones and several rounds.
    spans = [s for seq in got for s in seq]
    assert len(spans) > 5 * NUM_TEXTS
    assert sum(not s.closed for s in spans) > NUM_TEXTS // 2
    assert max(s.round for s in spans) >= 5
    assert {s.tag for s in spans} == {"mem", "think", "search", "access", "answer", "information"}


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_token_path_and_byte_path_agree(name, encoded):
    tokenizer = TOKENIZERS[name]()
    ids = encoded[name]
    fast = TokenTable.from_tokenizer(tokenizer)
    assert fast.fast_path
    assert fast.markers_are_single_tokens == (name == "special_tags")
    forced_bytes = TokenTable.from_tokenizer(tokenizer, fast_path=False)
    got = find_spans(ids, fast).to_lists()
    assert got == find_spans(ids, forced_bytes).to_lists()


def test_block_structure_does_not_depend_on_the_tokenizer(encoded):
    """Blocks are defined on the text, so tags, rounds and closed flags agree across tokenizers."""
    structures = {}
    for name in TOKENIZERS:
        batch = find_spans(encoded[name], TOKENIZERS[name]())
        structures[name] = (
            batch.offsets.tolist(), batch.tag.tolist(), batch.round.tolist(),
            batch.closed.tolist(),
        )  # fmt: skip
    first = structures.pop("byte_level")
    for name, structure in structures.items():
        assert structure == first, name


def test_table_bytes_joined_equal_decode(texts, encoded):
    tokenizer = toy_tokenizers.byte_level_tokenizer()
    table = TokenTable.from_tokenizer(tokenizer)
    decoded = tokenizer.decode_batch(encoded["byte_level"])
    # The table's bytes, joined, are exactly the tokenizer's own decode (and the original text).
    ids = encoded["byte_level"]
    lengths = np.diff(table.token_offsets)
    for i in range(0, NUM_TEXTS, 7):
        joined = table.decode_bytes(ids[i])
        assert len(joined) == int(lengths[np.asarray(ids[i], dtype=np.int64)].sum())
        assert joined == decoded[i].encode("utf-8") == texts[i].encode("utf-8")


@pytest.mark.parametrize("name", ["special_tags", "whole_text"])
def test_random_id_sequences(name):
    """Ids no tokenizer would produce: markers split across arbitrary tokens, marker tokens mixed
    with '<'-pieces (the fast path must fall back to bytes), zero-length sequences."""
    tokenizer = TOKENIZERS[name]()
    table = TokenTable.from_tokenizer(tokenizer)
    vocab = table.vocab_size
    interesting = [
        i
        for i in range(vocab)
        if any(c in table.token_bytes_of(i) for c in (b"<", b">", b"/", b"mem", b"think", b"an"))
    ]
    rng = random.Random(7)
    sequences = []
    for _ in range(3000):
        n = rng.randint(0, 60)
        pool = interesting if rng.random() < 0.7 else range(vocab)
        sequences.append([rng.choice(pool) for _ in range(n)])
    got = find_spans(sequences, table).to_lists()
    assert got == find_spans_reference(sequences, tokenizer)
    forced_bytes = TokenTable.from_tokenizer(tokenizer, fast_path=False)
    assert got == find_spans(sequences, forced_bytes).to_lists()
    assert sum(len(s) for s in got) > 1000


def test_raw_bytes_grammar_matches_reference():
    rng = random.Random(13)
    alphabet = [m.encode() for m in toy_tokenizers.MARKERS] + [
        b"<", b">", b"/", b"mem", b"answer", b"information", b"x", b" ", b"\n", b"\xff", b"<<",
    ]
    for _ in range(5000):
        text = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert _scanner.scan_text(text) == blocks_of_text_reference(text), text


# ---------------------------------------------------------------------------------------------
# The JSON tool-call tag table
# ---------------------------------------------------------------------------------------------

NUM_JSON_TEXTS = 4_000
JSON_TOKENIZERS = {
    "byte_level": toy_tokenizers.byte_level_tokenizer,
    "json_special_tags": toy_tokenizers.json_special_tag_tokenizer,
    "whole_text": toy_tokenizers.whole_text_tokenizer,
}


@pytest.fixture(scope="module")
def json_texts():
    rng = random.Random(20260817)
    return [toy_tokenizers.json_random_text(rng) for _ in range(NUM_JSON_TEXTS)]


@pytest.mark.parametrize("name", list(JSON_TOKENIZERS))
def test_json_table_cpp_paths_reference_and_text_grammar_agree(name, json_texts):
    tokenizer = JSON_TOKENIZERS[name]()
    ids = [e.ids for e in tokenizer.encode_batch(json_texts)]
    fast = TokenTable.from_tokenizer(tokenizer)
    got = find_spans(ids, fast, tags=JSON_TAG_SET)
    assert got.tag_names == JSON_TAG_SET.names
    spans = got.to_lists()
    assert first_mismatch(spans, find_spans_reference(ids, tokenizer, JSON_TAG_SET), json_texts) is None
    forced_bytes = TokenTable.from_tokenizer(tokenizer, fast_path=False)
    assert spans == find_spans(ids, forced_bytes, tags=JSON_TAG_SET).to_lists()
    # the id-only fast path applies where the JSON markers are single tokens
    assert all(i >= 0 for i in fast.marker_ids(JSON_TAG_SET)) == (name == "json_special_tags")
    # the text grammar finds the same blocks (tags, rounds, closed) on the decoded text
    for i in range(0, NUM_JSON_TEXTS, 3):
        blocks = find_blocks(json_texts[i], JSON_TAG_SET)
        assert [(b.tag, b.round, b.closed) for b in blocks] == [(s.tag, s.round, s.closed) for s in spans[i]], \
            json_texts[i]
    flat = [s for seq in spans for s in seq]
    assert {s.tag for s in flat} == set(JSON_TAG_SET.names) and max(s.round for s in flat) >= 3
    assert sum(not s.closed for s in flat) > NUM_JSON_TEXTS // 4
    # the default table reads the same ids differently: tool calls are text there
    assert find_spans(ids, fast).to_lists() == find_spans_reference(ids, tokenizer, TAG_SET)


def test_json_table_random_id_sequences():
    tokenizer = toy_tokenizers.json_special_tag_tokenizer()
    table = TokenTable.from_tokenizer(tokenizer)
    interesting = [i for i in range(table.vocab_size)
                   if any(c in table.token_bytes_of(i) for c in (b"<", b">", b"/", b"tool", b"_call", b"resp", b"{"))]
    rng = random.Random(11)
    sequences = [[rng.choice(interesting if rng.random() < 0.7 else range(table.vocab_size))
                  for _ in range(rng.randint(0, 60))] for _ in range(3000)]
    got = find_spans(sequences, table, tags=JSON_TAG_SET).to_lists()
    assert got == find_spans_reference(sequences, tokenizer, JSON_TAG_SET)
    assert got == find_spans(sequences, TokenTable.from_tokenizer(tokenizer, fast_path=False),
                             tags=JSON_TAG_SET).to_lists()
    assert sum(len(s) for s in got) > 1000


def test_json_table_raw_bytes_grammar_matches_reference():
    rng = random.Random(17)
    alphabet = [m.encode() for m in toy_tokenizers.JSON_MARKERS + toy_tokenizers.MARKERS] + [
        b"<", b">", b"/", b"tool", b"_call", b"tool_response", b"{", b'"', b"x", b" ", b"\n", b"\xff"]
    table = (list(JSON_TAG_SET.names), list(JSON_TAG_SET.action_codes), JSON_TAG_SET.tool_result_code)
    for _ in range(5000):
        text = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert _scanner.scan_text(text, *table) == blocks_of_text_reference(text, JSON_TAG_SET), text
