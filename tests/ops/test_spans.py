"""Span scanner (`mempo.ops.spans`): hand-written trajectories, input forms, validation, SpanBatch.

The large randomised comparison with the Python reference is in test_spans_differential.py; the
C++ unit tests and fuzz smoke test run through ctest in tests/csrc/test_span_scanner.py.
"""
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from support import toy_tokenizers
from mempo.ops.reference.spans import find_spans_reference
from mempo.ops.spans import JSON_TAG_SET, TAGS, Span, SpanBatch, TokenTable, find_spans, marker_strings


@pytest.fixture(scope="module")
def byte_tok():
    return toy_tokenizers.byte_level_tokenizer()


@pytest.fixture(scope="module")
def special_tok():
    return toy_tokenizers.special_tag_tokenizer()


# A vocabulary written by hand: ids 0-11 are the markers in marker-code order, then some words.
HAND_VOCAB = list(marker_strings()) + ["m", "t", "q", "doc", "\n", ""]


def hand_ids(tokens):
    return [HAND_VOCAB.index(t) for t in tokens]


THREE_ROUNDS = [
    "<mem>", "m", "</mem>", "<think>", "t", "</think>", "<search>", "q", "</search>",
    "<information>", "doc", "</information>",
    "<mem>", "m", "</mem>", "<think>", "t", "</think>", "<access>", "q", "</access>",
    "<information>", "doc", "</information>",
    "<mem>", "m", "</mem>", "<think>", "t", "</think>", "<answer>", "q", "</answer>",
]  # fmt: skip

THREE_ROUNDS_SPANS = [
    Span("mem", 0, 3, 0, True),
    Span("think", 3, 6, 0, True),
    Span("search", 6, 9, 0, True),
    Span("information", 9, 12, 0, True),
    Span("mem", 12, 15, 1, True),
    Span("think", 15, 18, 1, True),
    Span("access", 18, 21, 1, True),
    Span("information", 21, 24, 1, True),
    Span("mem", 24, 27, 2, True),
    Span("think", 27, 30, 2, True),
    Span("answer", 30, 33, 2, True),
]


@pytest.mark.parametrize("fast_path", [True, False])
def test_three_round_trajectory_by_hand(fast_path):
    table = TokenTable.from_token_bytes([t.encode() for t in HAND_VOCAB], fast_path=fast_path)
    assert table.fast_path is fast_path
    batch = find_spans([hand_ids(THREE_ROUNDS)], table)
    assert batch.spans_of(0) == THREE_ROUNDS_SPANS
    assert batch.tag.tolist() == [TAGS.index(s.tag) for s in THREE_ROUNDS_SPANS]
    assert batch.round.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("fast_path", [True, False])
def test_truncated_and_malformed_by_hand(fast_path):
    table = TokenTable.from_token_bytes([t.encode() for t in HAND_VOCAB], fast_path=fast_path)
    truncated = hand_ids(THREE_ROUNDS[:29])  # cut inside round 2's <think>
    nested = hand_ids(["<mem>", "m", "<think>", "t", "</mem>", "</think>", "", "<answer>", "q", ""])
    opaque = hand_ids(["<information>", "<mem>", "</information>", "</mem>", "<think>", "\n"])
    batch = find_spans([truncated, nested, opaque], table)
    assert batch.spans_of(0)[-1] == Span("think", 27, 29, 2, False)
    assert batch.spans_of(0)[:-1] == THREE_ROUNDS_SPANS[:9]
    # <mem> cut by <think> (unclosed); the stray </mem> inside think is ignored; the trailing
    # zero-byte token does not end the truncated answer.
    assert batch.spans_of(1) == [
        Span("mem", 0, 2, 0, False),
        Span("think", 2, 6, 0, True),
        Span("answer", 7, 9, 0, False),
    ]
    assert batch.spans_of(2) == [Span("information", 0, 3, 0, True), Span("think", 4, 6, 0, False)]


TRAJECTORY_TEXT = (
    "<mem></mem>\n<think>\nI need the founding year.\n</think>\n<search>museum founded Paris"
    "</search>\n\n<information>Doc 1: the museum <b>opened</b> in 1889 <mem>x</mem>"
    "</information>\n\n<mem>Museum: Paris, opened 1889; need director.</mem>\n<think>\nOpen the "
    "page.\n</think>\n<access>http://example.org/page</access>\n\n<information>director: Curie"
    "</information>\n\n<mem>opened 1889, director Curie.</mem>\n<think>\ndone\n</think>\n"
    "<answer>Curie</answer>"
)
TRAJECTORY_TAGS = [
    "mem", "think", "search", "information", "mem", "think", "access", "information", "mem",
    "think", "answer",
]  # fmt: skip
TRAJECTORY_ROUNDS = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]


def block_texts(text):
    """The text of each block of a well-formed trajectory, in order."""
    import re

    return [m.group(0) for m in re.finditer(r"<(\w+)>.*?</\1>", text, flags=re.S)]


@pytest.mark.parametrize("which", ["byte_level", "special_tags"])
def test_three_round_trajectory_tokenized(which, byte_tok, special_tok):
    tok = byte_tok if which == "byte_level" else special_tok
    ids = tok.encode(TRAJECTORY_TEXT).ids
    table = TokenTable.from_tokenizer(tok)
    spans = find_spans([ids], tok).spans_of(0)
    assert [s.tag for s in spans] == TRAJECTORY_TAGS
    assert [s.round for s in spans] == TRAJECTORY_ROUNDS
    assert all(s.closed for s in spans)
    # Each span is the smallest token range whose bytes contain the block's text.
    for span, block in zip(spans, block_texts(TRAJECTORY_TEXT)):
        block = block.encode()
        assert block in table.decode_bytes(ids[span.start : span.end])
        assert block not in table.decode_bytes(ids[span.start + 1 : span.end])
        assert block not in table.decode_bytes(ids[span.start : span.end - 1])
    if which == "special_tags":  # markers are whole tokens: spans start and end on them
        for span in spans:
            assert tok.id_to_token(ids[span.start]) == f"<{span.tag}>"
            assert tok.id_to_token(ids[span.end - 1]) == f"</{span.tag}>"
    # Truncated in the middle of the last <think>.
    cut = TRAJECTORY_TEXT.index("done")
    cut_ids = tok.encode(TRAJECTORY_TEXT[:cut]).ids
    cut_spans = find_spans([cut_ids], tok).spans_of(0)
    assert cut_spans[-1].tag == "think" and not cut_spans[-1].closed
    assert cut_spans[-1].end == len(cut_ids) and cut_spans[-1].round == 2
    assert cut_spans[:-1] == spans[: len(cut_spans) - 1]


def test_fast_path_equals_byte_path_on_special_token_tokenizer(special_tok):
    fast = TokenTable.from_tokenizer(special_tok)
    forced_bytes = TokenTable.from_tokenizer(special_tok, fast_path=False)
    assert fast.fast_path and not forced_bytes.fast_path
    assert fast is not forced_bytes
    assert fast.markers_are_single_tokens
    marker_ids = [special_tok.token_to_id(m) for m in marker_strings()]
    assert list(fast.marker_token_ids) == marker_ids
    rng = random.Random(3)
    texts = [toy_tokenizers.random_text(rng) for _ in range(500)]
    texts += [toy_tokenizers.well_formed_trajectory(rng, 4) for _ in range(100)]
    ids = [e.ids for e in special_tok.encode_batch(texts)]
    assert find_spans(ids, fast).to_lists() == find_spans(ids, forced_bytes).to_lists()


def test_byte_level_tokenizer_table(byte_tok):
    table = TokenTable.from_tokenizer(byte_tok)
    assert table.fast_path and table.source == "byte_level"
    assert not table.markers_are_single_tokens  # tags are plain text: "<mem" + ">"...
    assert table.vocab_size == byte_tok.get_vocab_size(with_added_tokens=True)
    assert table.token_bytes_of(byte_tok.token_to_id("Ġthe")) == b" the"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        table.token_bytes_of(table.vocab_size)


def test_table_is_cached_and_rebuilt_when_the_vocabulary_grows(byte_tok):
    from tokenizers import Tokenizer

    assert TokenTable.from_tokenizer(byte_tok) is TokenTable.from_tokenizer(byte_tok)
    grown = Tokenizer.from_str(byte_tok.to_str())
    before = TokenTable.from_tokenizer(grown)
    grown.add_special_tokens(list(marker_strings()))
    after = TokenTable.from_tokenizer(grown)
    assert after is not before
    assert after.vocab_size == before.vocab_size + 12
    assert after.markers_are_single_tokens and not before.markers_are_single_tokens


def test_transformers_tokenizer_gives_the_same_table(byte_tok, special_tok):
    transformers = pytest.importorskip("transformers")
    for tok in (byte_tok, special_tok):
        wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tok)
        direct = TokenTable.from_tokenizer(tok)
        via = TokenTable.from_tokenizer(wrapped)
        assert np.array_equal(via.token_offsets, direct.token_offsets)
        assert np.array_equal(via.token_bytes, direct.token_bytes)
        assert via.markers_are_single_tokens == direct.markers_are_single_tokens
        ids = tok.encode(TRAJECTORY_TEXT).ids
        assert find_spans([ids], wrapped).to_lists() == find_spans_reference([ids], wrapped)


class SlowLikeTokenizer:
    """Duck-typed stand-in for a slow (pure-Python) transformers tokenizer: no backend_tokenizer;
    optionally a GPT-2-style `byte_decoder`."""

    def __init__(self, tokenizer, with_byte_decoder):
        self._tokenizer = tokenizer
        self.added_tokens_decoder = tokenizer.get_added_tokens_decoder()
        if with_byte_decoder:
            from mempo.ops.reference.spans import _gpt2_unicode_to_byte

            self.byte_decoder = _gpt2_unicode_to_byte()

    def __len__(self):
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        return [self._tokenizer.id_to_token(i) for i in ids]

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("with_byte_decoder", [True, False])
def test_slow_tokenizer_routes(special_tok, with_byte_decoder):
    slow = SlowLikeTokenizer(special_tok, with_byte_decoder)
    table = TokenTable.from_tokenizer(slow)
    fast_table = TokenTable.from_tokenizer(special_tok)
    assert table.source == ("byte_level" if with_byte_decoder else "decode_per_id")
    assert table.markers_are_single_tokens
    if with_byte_decoder:
        assert np.array_equal(table.token_bytes, fast_table.token_bytes)
    ids = special_tok.encode(TRAJECTORY_TEXT).ids
    expected = find_spans([ids], special_tok).to_lists()
    assert find_spans([ids], slow).to_lists() == expected == find_spans_reference([ids], slow)


def test_tokenizer_without_byte_level_decoder_uses_decode_per_id(byte_tok):
    from tokenizers import Tokenizer, decoders

    plain = Tokenizer.from_str(byte_tok.to_str())
    plain.decoder = decoders.Metaspace()  # not ByteLevel: per-id decode is the only safe route
    table = TokenTable.from_tokenizer(plain)
    assert table.source == "decode_per_id"
    rng = random.Random(17)
    ids = [e.ids for e in plain.encode_batch([toy_tokenizers.random_text(rng) for _ in range(200)])]
    assert find_spans(ids, plain).to_lists() == find_spans_reference(ids, plain)


def test_table_bytes_equal_the_tokenizer_decode(byte_tok, special_tok):
    rng = random.Random(11)
    texts = [toy_tokenizers.random_text(rng) for _ in range(300)]
    for tok in (byte_tok, special_tok):
        table = TokenTable.from_tokenizer(tok)
        for encoding, text in zip(tok.encode_batch(texts), texts):
            expected = tok.decode(encoding.ids, skip_special_tokens=False).encode("utf-8")
            assert table.decode_bytes(encoding.ids) == expected == text.encode("utf-8")


# ---- input forms --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_ids(byte_tok):
    rng = random.Random(5)
    texts = [toy_tokenizers.random_text(rng) for _ in range(200)] + ["", "<mem>", ""]
    return [e.ids for e in byte_tok.encode_batch(texts)]


def test_input_forms_agree(sample_ids, byte_tok):
    expected = find_spans(sample_ids, byte_tok).to_lists()
    assert expected == find_spans_reference(sample_ids, byte_tok)
    lengths = [len(s) for s in sample_ids]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.concatenate([np.asarray(s, dtype=np.int64) for s in sample_ids])
    width = max(lengths) + 3
    padded = np.full((len(sample_ids), width), -100, dtype=np.int64)  # padding is never read
    for i, s in enumerate(sample_ids):
        padded[i, : len(s)] = s
    forms = {
        "flat numpy + offsets": dict(ids=flat, offsets=offsets),
        "flat int32 tensor + tensor offsets": dict(
            ids=torch.from_numpy(flat).to(torch.int32), offsets=torch.from_numpy(offsets)
        ),
        "padded tensor + lengths": dict(
            ids=torch.from_numpy(padded), lengths=torch.tensor(lengths)
        ),
        "padded uint16 numpy + list lengths": dict(
            ids=np.where(padded < 0, 0, padded).astype(np.uint16), lengths=lengths
        ),
        "list of tensors": dict(ids=[torch.tensor(s, dtype=torch.int64) for s in sample_ids]),
        "tuple of tuples": dict(ids=tuple(tuple(s) for s in sample_ids)),
    }
    for name, kwargs in forms.items():
        got = find_spans(tokenizer_or_table=byte_tok, **kwargs)
        assert got.to_lists() == expected, name


def test_padded_without_lengths_uses_full_rows(byte_tok):
    ids = byte_tok.encode("<mem>a</mem><think>b").ids
    padded = torch.tensor([ids, ids])
    assert find_spans(padded, byte_tok).to_lists() == find_spans([ids, ids], byte_tok).to_lists()


def test_empty_batch_and_empty_sequences(byte_tok):
    for empty in ([], np.zeros((0, 7), dtype=np.int64), torch.zeros(0, dtype=torch.long)):
        kwargs = {"offsets": [0]} if isinstance(empty, torch.Tensor) else {}
        batch = find_spans(empty, byte_tok, **kwargs)
        assert batch.num_sequences == 0 and len(batch) == 0
        assert batch.offsets.tolist() == [0]
    ids = byte_tok.encode("<answer>x</answer>").ids
    batch = find_spans([[], ids, [], []], byte_tok)
    assert batch.offsets.tolist() == [0, 0, 1, 1, 1]
    assert batch.spans_of(1) == [Span("answer", 0, len(ids), 0, True)]
    padded = find_spans(np.array([ids, ids]), byte_tok, lengths=[0, len(ids)])
    assert padded.offsets.tolist() == [0, 0, 1]


# ---- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(ids=np.arange(6), offsets=[1, 6]), r"offsets\[0\] must be 0"),
        (dict(ids=np.arange(6), offsets=[0, 4, 2, 6]), r"non-decreasing: offsets\[1\]=4"),
        (dict(ids=np.arange(6), offsets=[0, 5]), r"offsets\[-1\] must equal len\(ids\) = 6"),
        (dict(ids=np.arange(6), offsets=[0, 7]), r"offsets\[-1\] must equal len\(ids\) = 6"),
        (dict(ids=np.arange(6), offsets=[[0, 6]]), r"offsets must be 1-D"),
        (dict(ids=np.arange(6), offsets=[0.0, 6.0]), r"offsets must have an integer dtype"),
        (dict(ids=np.arange(6)), r"flat 1-D ids need offsets"),
        (dict(ids=np.arange(6), lengths=[6]), r"lengths is for padded 2-D ids"),
        (dict(ids=np.zeros((2, 3), np.int64), lengths=[3, 4]), r"lengths\[1\]=4 exceeds"),
        (dict(ids=np.zeros((2, 3), np.int64), lengths=[3, -1]), r"lengths must be >= 0"),
        (dict(ids=np.zeros((2, 3), np.int64), lengths=[3]), r"one entry per row \(N=2\)"),
        (dict(ids=np.zeros((2, 3), np.int64), offsets=[0, 6]), r"offsets is for flat 1-D ids"),
        (dict(ids=np.zeros((2, 3), np.int64), lengths=[1.5, 2]), r"lengths must have an integer"),
        (dict(ids=np.zeros((2, 3, 1), np.int64)), r"got 3-D"),
        (dict(ids=np.zeros(4, np.float32), offsets=[0, 4]), r"ids must have an integer dtype"),
        (dict(ids=torch.zeros(2, 4)), r"ids must have an integer dtype, got torch.float32"),
        (dict(ids=torch.zeros(2, 4, dtype=torch.bool)), r"integer dtype, got torch.bool"),
        (dict(ids=[[1, 2], [0.5]]), r"ids\[1\] must have an integer dtype"),
        (dict(ids=[1, 2, 3]), r"list of sequences"),
        (dict(ids=[[1, 2]], offsets=[0, 2]), r"a list of sequences carries its own lengths"),
    ],
)
def test_bad_inputs_raise_value_errors_naming_the_problem(byte_tok, kwargs, message):
    with pytest.raises(ValueError, match=message):
        find_spans(tokenizer_or_table=byte_tok, **kwargs)


def test_out_of_vocabulary_ids_are_named(byte_tok):
    vocab = TokenTable.from_tokenizer(byte_tok).vocab_size
    with pytest.raises(ValueError, match=rf"token id {vocab + 5} at \(sequence 1, position 1\)"):
        find_spans([[1, 2], [3, vocab + 5, 4, -1]], byte_tok)
    with pytest.raises(ValueError, match=r"token id -1 at \(sequence 0, position 2\)"):
        find_spans(torch.tensor([[1, 2, -1, 0]]), byte_tok, lengths=[4])
    with pytest.raises(ValueError, match=rf"token id {vocab} at \(sequence 2, position 0\)"):
        find_spans(np.array([5, vocab, 3]), byte_tok, offsets=[0, 1, 1, 3])
    # Ids of other dtypes are checked before their cast to int64 (reported as given).
    with pytest.raises(ValueError, match=rf"token id {2**64 - 1} at \(sequence 1, position 0\)"):
        find_spans([[0], np.array([2**64 - 1], dtype=np.uint64)], byte_tok)
    with pytest.raises(ValueError, match=rf"token id {2**64 - 2} at \(sequence 0, position 1\)"):
        find_spans(np.array([[1, 2**64 - 2]], dtype=np.uint64), byte_tok)
    with pytest.raises(ValueError, match=rf"token id {vocab} at \(sequence 1, position 2\)"):
        ids = torch.tensor([1, 2, 3, 4, vocab], dtype=torch.int32)
        find_spans(ids, byte_tok, offsets=[0, 2, 5])
    # Padding beyond `lengths` is not checked.
    find_spans(torch.tensor([[1, 2, -100]]), byte_tok, lengths=[2])


def test_raw_binding_is_safe_on_out_of_vocabulary_ids_and_bad_offsets(byte_tok):
    scanner = TokenTable.from_tokenizer(byte_tok)._scanner
    mem = byte_tok.encode("<mem>x").ids
    ids = np.array([-5, 2**62, *mem, -(2**63), 2**63 - 1], dtype=np.int64)
    offsets, tag, start, end, round_, closed = scanner.scan(ids, np.array([0, ids.size]))
    assert offsets.tolist() == [0, 1] and tag.tolist() == [0]
    assert start.tolist() == [2] and end.tolist() == [2 + len(mem)]
    assert closed.tolist() == [0]
    with pytest.raises(ValueError, match=r"token id -5 at \(sequence 0, position 0\)"):
        scanner.scan(ids, np.array([0, ids.size]), reject_out_of_vocab=True)
    with pytest.raises(ValueError, match=r"seq_offsets\[-1\]"):
        scanner.scan(ids, np.array([0, ids.size + 1]), reject_out_of_vocab=True)
    with pytest.raises(ValueError, match=r"non-decreasing"):
        scanner.scan(ids, np.array([0, 3, 1, ids.size]))
    with pytest.raises(ValueError, match=r"seq_offsets must have N\+1 >= 1"):
        scanner.scan(ids, np.zeros(0, dtype=np.int64))
    from mempo import _scanner

    with pytest.raises(ValueError, match=r"token_offsets\[-1\]"):
        _scanner.Scanner(np.zeros(3, np.uint8), np.array([0, 2]), False)
    with pytest.raises(ValueError, match=r"non-decreasing"):
        _scanner.Scanner(np.zeros(3, np.uint8), np.array([0, 2, 1, 3]), False)


def test_raw_binding_takes_a_tag_table_and_refuses_a_bad_one():
    from mempo import _scanner

    pieces = [b"<lookup>", b"k", b"</lookup>", b"<information>", b"</information>"]
    table = TokenTable.from_token_bytes(pieces)
    bytes_, offsets = table.token_bytes, table.token_offsets
    custom = _scanner.Scanner(bytes_, offsets, True, ["mem", "lookup", "answer", "information"], [1, 2], 3)
    assert custom.tag_names == ["mem", "lookup", "answer", "information"]
    assert custom.marker_token_ids == [-1, -1, 0, 2, -1, -1, 3, 4]
    assert custom.scan(np.array([0, 1, 2]), np.array([0, 3]))[1].tolist() == [1]
    assert table._scanner.scan(np.array([0, 1, 2]), np.array([0, 3]))[1].tolist() == []  # not a default tag
    for args, message in [
        ((["a", "a"], [], -1), "repeated"), ((["a<"], [], -1), "may only hold"), ((["a"], [3], -1), "action tag"),
        ((["a"], [], 0 + 1), "opaque tag code 1"), ((["a"], [0], 0), "cannot be an action"), (([], [], -1), "1 to 64"),
    ]:
        with pytest.raises(ValueError, match=message):
            _scanner.Scanner(bytes_, offsets, True, *args)
    with pytest.raises(ValueError, match="together, or none"):
        _scanner.Scanner(bytes_, offsets, True, ["a"])
    with pytest.raises(TypeError, match="must be a mempo.protocol.tags.TagSet"):
        find_spans([[0]], table, tags=("mem",))


def test_json_tag_set_spans_and_select():
    table = TokenTable.from_token_bytes([b"<mem>", b"m", b"</mem>", b"<tool_call>", b'{"name": "f"}',
                                         b"</tool_call>", b"<tool_response>", b"r", b"</tool_response>"])
    assert table.marker_ids(JSON_TAG_SET) == (0, 2, -1, -1, 3, 5, -1, -1, 6, 8)
    assert table.markers_are_single_tokens is False  # of the default set
    batch = find_spans([[0, 1, 2, 3, 4, 5, 6, 7, 8, 0]], table, tags=JSON_TAG_SET)
    assert batch.tag_names == JSON_TAG_SET.names
    assert batch.spans_of(0) == [Span("mem", 0, 3, 0, True), Span("tool_call", 3, 6, 0, True),
                                 Span("tool_response", 6, 9, 0, True), Span("mem", 9, 10, 1, False)]
    assert [s.tag for s in batch.select(["tool_call", "tool_response"]).spans_of(0)] == ["tool_call", "tool_response"]
    with pytest.raises(ValueError, match="unknown tag 'search'"):
        batch.select("search")


# ---- SpanBatch ----------------------------------------------------------------------------


def test_span_batch_fields_select_and_spans_of():
    table = TokenTable.from_token_bytes([t.encode() for t in HAND_VOCAB])
    assert table.markers_are_single_tokens
    ids = hand_ids(THREE_ROUNDS)
    batch = find_spans([ids, [], ids[:5]], table)
    assert isinstance(batch, SpanBatch)
    assert batch.num_sequences == 3 and len(batch) == 11 + 2
    for name in ("offsets", "tag", "start", "end", "round"):
        assert getattr(batch, name).dtype == torch.int64
        assert getattr(batch, name).device.type == "cpu"
    assert batch.closed.dtype == torch.bool
    assert batch.offsets.tolist() == [0, 11, 11, 13]
    assert batch.sequence_index().tolist() == [0] * 11 + [2, 2]
    assert batch.spans_of(-1) == [Span("mem", 0, 3, 0, True), Span("think", 3, 5, 0, False)]
    with pytest.raises(IndexError):
        batch.spans_of(3)

    mem = batch.select("mem")
    assert mem.offsets.tolist() == [0, 3, 3, 4]
    assert [s.start for s in mem.spans_of(0)] == [0, 12, 24]
    assert mem.spans_of(2) == [Span("mem", 0, 3, 0, True)]
    actions = batch.select(["search", "access", TAGS.index("answer")])
    assert [s.tag for s in actions.spans_of(0)] == ["search", "access", "answer"]
    assert actions.offsets.tolist() == [0, 3, 3, 3]
    assert len(batch.select([])) == 0
    with pytest.raises(ValueError, match="unknown tag 'memory'"):
        batch.select("memory")
    with pytest.raises(ValueError, match="unknown tag 9"):
        batch.select(9)


def test_import_is_light():
    code = (
        "import sys, mempo.ops.spans; "
        "heavy = [m for m in ('transformers', 'tokenizers', 'triton') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
