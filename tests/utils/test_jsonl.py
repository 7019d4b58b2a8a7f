"""mempo.utils.jsonl: the atomic writers (`write_jsonl`, `jsonl_writer`) and reading back."""
import json

import pytest

from mempo.utils.jsonl import iter_jsonl, jsonl_writer, write_jsonl


def test_write_jsonl_round_trips_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "sub" / "a.jsonl"
    assert write_jsonl(path, [{"x": 1}, {"é": "ü"}]) == 2
    assert path.read_text(encoding="utf-8") == '{"x": 1}\n{"é": "ü"}\n'
    assert [obj for _, obj in iter_jsonl(path)] == [{"x": 1}, {"é": "ü"}]
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.jsonl"]


def test_jsonl_writer_appears_only_when_the_block_succeeds(tmp_path):
    path = tmp_path / "out" / "records.jsonl"
    with jsonl_writer(path, default=str) as writer:
        writer.write({"a": 1})
        writer.write({"b": [2, "x"]})
        writer.write({"c": tmp_path})  # not JSON: the default makes it a string
        assert not path.exists() and writer.count == 3 and writer.path == path
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 and json.loads(lines[2]) == {"c": str(tmp_path)}
    assert sorted(p.name for p in path.parent.iterdir()) == ["records.jsonl"]


def test_a_failed_block_keeps_the_old_file_and_removes_the_temporary_one(tmp_path):
    path = tmp_path / "records.jsonl"
    write_jsonl(path, [{"old": True}])
    with pytest.raises(RuntimeError, match="lost"):
        with jsonl_writer(path) as writer:
            writer.write({"new": True})
            raise RuntimeError("lost")
    assert path.read_text(encoding="utf-8") == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl"]

    def objects():
        yield {"new": True}
        raise ValueError("bad record")

    with pytest.raises(ValueError, match="bad record"):
        write_jsonl(path, objects())
    assert path.read_text(encoding="utf-8") == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl"]


def test_loads_bounded_refuses_deep_documents_without_recursing():
    """The checkpoint state, the index manifest and the HTTP client's bodies decode through
    `loads_bounded`: a document nested 5,000 deep was a RecursionError in each of them."""
    from mempo.utils.jsonl import MAX_JSON_DEPTH, loads_bounded, too_deep_at

    deep = '{"step": 1, "x": ' + "[" * 5_000 + "]" * 5_000 + "}"
    with pytest.raises(ValueError, match=f"state.json: JSON nested deeper than {MAX_JSON_DEPTH} levels"):
        loads_bounded(deep, "state.json")
    with pytest.raises(ValueError, match="b: not valid JSON"):
        loads_bounded(b'{"a": ', "b")
    assert loads_bounded(b'{"a": [[1]], "s": "[[[["}', "c") == {"a": [[1]], "s": "[[[["}
    assert too_deep_at('"' + "[" * 500 + '"') is None and too_deep_at("[" * 101) == 101


def test_deep_nesting_and_truncated_lines_name_line_and_column(tmp_path):
    """Issue 21: JSON nested 30,000 deep was a RecursionError (case 5); a truncated line's error said
    "column 1" (the position after its newline) instead of where and why it ends (case 7)."""
    from mempo.utils.jsonl import MAX_JSON_DEPTH

    def error_of(line):
        path = tmp_path / "a.jsonl"
        path.write_text('{"ok": 1}\n' + line + "\n", encoding="utf-8")
        with pytest.raises(ValueError) as error:
            list(iter_jsonl(path))
        return str(error.value)

    message = error_of("[" * 30_000 + "]" * 30_000)
    assert message == f"{tmp_path / 'a.jsonl'}:2: JSON nested deeper than {MAX_JSON_DEPTH} levels (at column " \
                      f"{MAX_JSON_DEPTH + 1})"
    assert error_of('{"id": "q1", "question": "who') == (
        f"{tmp_path / 'a.jsonl'}:2: not valid JSON: the line ends (column 30) inside the string that starts at "
        "column 26 (a truncated line?)")
    message = error_of('{"id": "q1", "golden_answers": [')
    assert "the line ends (column 33) before its value does" in message and "column 1)" not in message
    assert "(Extra data at column 9)" in error_of('{"a": 1}}')
    # brackets inside strings do not count as nesting; real nesting under the bound decodes
    path = tmp_path / "ok.jsonl"
    path.write_text(json.dumps({"q": "[" * 500, "n": [[[[1]]]]}) + "\n", encoding="utf-8")
    assert [obj for _, obj in iter_jsonl(path)] == [{"q": "[" * 500, "n": [[[[1]]]]}]
