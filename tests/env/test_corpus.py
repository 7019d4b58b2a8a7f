"""Corpus files (`mempo.env.corpus`): the jsonl round trip, Search-R1 fields, and errors that name
the file and line. The small generated corpus shared with the other env tests lives in
tests/support/corpus.py.
"""
import json

import pytest

from mempo.env.corpus import CorpusError, Document, corpus_fingerprint, load_corpus, write_corpus

# ------------------------------------------------------------------------------------------------
# corpus files
# ------------------------------------------------------------------------------------------------

def test_corpus_roundtrip(tmp_path, corpus):
    path = tmp_path / "corpus.jsonl"
    assert write_corpus(path, corpus) == len(corpus)
    assert load_corpus(path) == corpus
    assert len(corpus_fingerprint(path)) == 64


def test_corpus_accepts_search_r1_contents_and_integer_ids(tmp_path):
    path = tmp_path / "wiki.jsonl"
    path.write_text(json.dumps({"id": 7, "contents": '"Aaron"\nAaron is a prophet.\nSecond line.'}) + "\n\n"
                    + json.dumps({"id": "x", "text": "no title"}) + "\n", encoding="utf-8")
    assert load_corpus(path) == [Document("7", "Aaron", "Aaron is a prophet.\nSecond line."),
                                 Document("x", "", "no title")]


@pytest.mark.parametrize("lines, message", [
    (['{"id": "a", "text": "ok"}', "{not json"], ":2: not valid JSON"),
    (['[1, 2]'], ":1: expected a JSON object"),
    (['{"title": "t", "text": "x"}'], ":1: missing field 'id'"),
    (['{"id": "a"}'], ":1: missing field 'text'"),
    (['{"id": "a b", "text": "x"}'], ":1: field 'id' contains white space"),
    (['{"id": "", "text": "x"}'], ":1: field 'id' is empty"),
    (['{"id": "a", "text": 3}'], ":1: field 'text' must be a string"),
    (['{"id": "a", "text": "x", "title": null}'], ":1: field 'title' must be a string"),
    (['{"id": "a", "text": "x"}', "", '{"id": "a", "text": "y"}'], ":3: duplicate id 'a' (first seen on line 1)"),
    # a lone surrogate was accepted, to fail later when the text is tokenised or sent
    (['{"id": "a", "title": "A\\udc80", "text": "x"}'], ":1: field 'title' is not encodable text"),
    (['{"id": "a", "text": "x\\ud800y"}'], ":1: field 'text' is not encodable text"),
])
def test_corpus_errors_name_file_and_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError) as info:
        load_corpus(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value)


@pytest.mark.parametrize("bad_line", [150, 1, 400])
def test_non_utf8_corpus_error_names_the_right_line(tmp_path, bad_line):
    """The reader decodes each line alone: a text-mode reader decodes 8 KB ahead and blamed line 130
    for a bad byte on line 151 (issue 10, case 11). Lines end at b"\\n" only; CRLF files count alike."""
    good = [json.dumps({"id": f"d{i}", "text": "x" * 100}).encode() for i in range(400)]
    good[bad_line - 1] = b'{"id": "bad", "text": "caf\xe9"}'
    for newline in (b"\n", b"\r\n"):
        path = tmp_path / "latin1.jsonl"
        path.write_bytes(newline.join(good) + newline)
        with pytest.raises(CorpusError) as info:
            load_corpus(path)
        assert f"{path}:{bad_line}: not valid UTF-8" in str(info.value), str(info.value)
        assert "at byte 27 of the line" in str(info.value)
    # A bare \r (JSON white space) is no line end: universal newlines split this line in two.
    path.write_bytes(b'{"id": "a",\r "text": "x"}\n{"id": "b", "text": "y"}\n{not json\n')
    with pytest.raises(CorpusError, match=":3: not valid JSON"):
        load_corpus(path)


def test_corpus_missing_file_and_bad_write(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        load_corpus(tmp_path / "absent.jsonl")
    target = tmp_path / "out.jsonl"
    with pytest.raises(CorpusError, match="duplicate id"):
        write_corpus(target, [Document("a", "", "x"), Document("a", "", "y")])
    assert not target.exists() and list(tmp_path.iterdir()) == []  # no partial file, no temp file left


def test_a_directory_given_as_the_corpus_says_it_is_a_directory(tmp_path):
    from mempo.config import ConfigError, config_from_dict
    from mempo.env.bm25 import load_or_build_bm25
    from mempo.env.build import build_retriever

    with pytest.raises(CorpusError, match="is a directory, not a corpus file"):
        load_or_build_bm25(tmp_path, None)
    cfg = config_from_dict({"env": {"retriever": "bm25", "corpus_path": str(tmp_path)}, "data": {"source": "files"}})
    with pytest.raises(ConfigError, match=r"env.corpus_path: .* is a directory, not a corpus file"):
        build_retriever(cfg, None)
    with pytest.raises(ConfigError, match="corpus file not found"):
        build_retriever(config_from_dict({"env": {"retriever": "bm25", "corpus_path": str(tmp_path / "none.jsonl")},
                                          "data": {"source": "files"}}), None)
