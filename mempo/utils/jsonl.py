"""JSON-lines files, read and written one way everywhere (corpora, QA data, episodes, trajectories).

* Writing is atomic: a temporary file in the target's folder, renamed over the target when every
  object is written; on any error (also one raised by the objects' generator, e.g. a validation
  error) the target is left untouched and the temporary file removed. `write_jsonl` writes an
  iterable; `jsonl_writer` is the same writer held open while objects arrive one at a time.
* Reading streams the file; blank lines are skipped; every error names the file and the 1-based
  line (missing file, invalid UTF-8, invalid JSON with its column or "the line ends before its value
  does" for a truncated line, nesting deeper than `MAX_JSON_DEPTH`, and whatever the record parser
  rejects), raised as the caller's error type.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Optional, TypeVar, Union

from mempo.utils.types import PathLike
T = TypeVar("T")

__all__ = ["MAX_JSON_DEPTH", "too_deep_at", "loads_bounded", "iter_jsonl", "iter_jsonl_records", "write_jsonl",
           "jsonl_writer", "JsonlWriter"]


class JsonlWriter:
    """The open file of `jsonl_writer`: `write` appends one object as one line; ``path`` is the
    target, ``count`` the lines written so far."""

    def __init__(self, path: Path, handle: IO[str], default: Optional[Callable[[Any], Any]] = None):
        self.path, self.count = path, 0
        self._handle, self._default = handle, default

    def write(self, obj: Any) -> None:
        self._handle.write(json.dumps(obj, ensure_ascii=False, default=self._default) + "\n")
        self.count += 1


@contextlib.contextmanager
def jsonl_writer(path: PathLike, *, default: Optional[Callable[[Any], Any]] = None) -> Iterator[JsonlWriter]:
    """Yield a `JsonlWriter` over a temporary file next to `path`, renamed over `path` when the
    block ends without an error, removed otherwise. default: `json.dumps`'s, for values JSON lacks."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a fresh name, created exclusively, with the umask's mode like every other file written here
    temp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    handle = open(temp, "x", encoding="utf-8")
    try:
        with handle:
            yield JsonlWriter(path, handle, default)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def write_jsonl(path: PathLike, objects: Iterable[Any]) -> int:
    """Write one JSON object per line, atomically; returns the number written."""
    with jsonl_writer(path) as writer:
        for obj in objects:
            writer.write(obj)
    return writer.count


def iter_jsonl(path: PathLike, error: type[Exception] = ValueError, *,
               missing: str = "file not found") -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON value) for every non-blank line of `path`.

    Lines end at b"\\n" (as `wc -l` and editors count them) and are decoded one at a time, so an
    invalid UTF-8 byte is reported on its own line (a text-mode reader decodes ahead in blocks and
    would blame an earlier line).
    """
    path = Path(path)
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    with handle:
        for lineno, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise error(f"{path}:{lineno}: not valid UTF-8 ({exc.reason} at byte {exc.start + 1} of the line)") \
                    from None
            if not line.strip():
                continue
            yield lineno, _decode_line(line.rstrip("\r\n"), path, lineno, error)


#: The deepest nesting of arrays and objects a jsonl line may have (records nest a few levels).
MAX_JSON_DEPTH = 100
_NESTING_RE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def too_deep_at(text: str, limit: int = MAX_JSON_DEPTH) -> Optional[int]:
    """The 1-based column where the ``[`` / ``{`` nesting of `text` (outside double-quoted strings)
    first passes `limit`, or None: checked before decoding, since JSON and YAML decoders recurse once
    per level (a deep enough document is a RecursionError deep inside them)."""
    if text.count("[") + text.count("{") <= limit:
        return None
    depth = 0
    for match in _NESTING_RE.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                return match.start() + 1
        elif token in "]}":
            depth -= 1
    return None


def loads_bounded(text: Union[str, bytes], what: str, error: type[Exception] = ValueError) -> Any:
    """``json.loads(text)``, with `error` naming `what` for nesting deeper than `MAX_JSON_DEPTH` (no
    RecursionError) and for invalid JSON."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    column = too_deep_at(text)
    if column is not None:
        raise error(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH} levels (at column {column})")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise error(f"{what}: not valid JSON ({exc})") from None


def _decode_line(line: str, path: Path, lineno: int, error: type[Exception]) -> Any:
    """One line's JSON value; `error` naming file, line and column for invalid JSON (a line that ends
    before its value does says so, instead of pointing past its end), and for nesting deeper than
    `MAX_JSON_DEPTH` (checked before decoding: the decoder would recurse once per level)."""
    column = too_deep_at(line)
    if column is not None:
        raise error(f"{path}:{lineno}: JSON nested deeper than {MAX_JSON_DEPTH} levels (at column {column})")
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unterminated string"):
            raise error(f"{path}:{lineno}: not valid JSON: the line ends (column {len(line) + 1}) inside the "
                        f"string that starts at column {exc.colno} (a truncated line?)") from None
        if exc.pos >= len(line.rstrip()):
            raise error(f"{path}:{lineno}: not valid JSON: the line ends (column {len(line) + 1}) before its "
                        f"value does ({exc.msg}; a truncated line?)") from None
        raise error(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise error(f"{path}:{lineno}: JSON nested too deeply") from None


def iter_jsonl_records(path: PathLike, parse: Callable[[Any, int], T], error: type[Exception] = ValueError, *,
                       unique_ids: bool = False, missing: str = "file not found",
                       rejects: tuple[type[Exception], ...] = ()) -> Iterator[T]:
    """Records `parse(obj, lineno)` of every line; a rejection (`error` or one of `rejects`) is
    re-raised as `error` naming file and line. With `unique_ids`, a record whose `.id` was seen on
    an earlier line is an error naming both lines."""
    first_line_of: dict[Any, int] = {}
    for lineno, obj in iter_jsonl(path, error, missing=missing):
        try:
            record = parse(obj, lineno)
        except (error, *rejects) as exc:
            raise error(f"{path}:{lineno}: {exc}") from None
        if unique_ids:
            first = first_line_of.setdefault(record.id, lineno)
            if first != lineno:
                raise error(f"{path}:{lineno}: duplicate id {record.id!r} (first seen on line {first})")
        yield record
