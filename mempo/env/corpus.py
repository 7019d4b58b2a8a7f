"""Corpus files: one JSON object per non-blank line (jsonl, UTF-8), read and written as `Document`
records (fields: `document_from_json`)::

    {"id": "doc-17", "title": "Ada Lovelace", "text": "Augusta Ada King, Countess of Lovelace, ..."}

A bad line raises `CorpusError` naming the file and the 1-based line number.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

from mempo.errors import MempoError
from mempo.utils.jsonl import iter_jsonl_records, write_jsonl
from mempo.utils.digest import sha256_file
from mempo.utils.types import PathLike

__all__ = ["Document", "CorpusError", "load_corpus", "iter_corpus", "write_corpus", "document_from_json",
           "corpus_fingerprint", "corpus_file_problem"]


@dataclass(frozen=True)
class Document:
    """One corpus document: a unique id without white space, a title and the full text."""
    id: str
    title: str
    text: str

    def to_json(self) -> dict:
        """The canonical corpus-line object ``{"id", "title", "text"}``."""
        return {"id": self.id, "title": self.title, "text": self.text}


class CorpusError(MempoError, ValueError):
    """A corpus file (or a document record) that does not follow the format of `document_from_json`."""


def document_from_json(obj: object) -> Document:
    """Build a `Document` from one decoded corpus line; raises `CorpusError` (without location).

    `id` is required: a non-empty string (a JSON integer is converted with `str`) with no white
    space, because the access tool's argument is ``"<doc-id> [page]"``. `text` is required (a
    string, possibly empty); `title` is optional (a string, default ""). Search-R1 / FlashRAG lines
    (``{"id", "contents"}`` with the title on the first line of `contents`, often in double quotes)
    are accepted too: the first line becomes the title (outer quotes removed), the rest the text.
    Other keys are ignored.
    """
    if not isinstance(obj, dict):
        raise CorpusError(f"expected a JSON object, got {type(obj).__name__}")
    if "id" not in obj:
        raise CorpusError("missing field 'id'")
    doc_id = obj["id"]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise CorpusError(f"field 'id' must be a string, got {type(doc_id).__name__}")
    doc_id = str(doc_id)
    if not doc_id:
        raise CorpusError("field 'id' is empty")
    if any(ch.isspace() for ch in doc_id):
        raise CorpusError(f"field 'id' contains white space: {doc_id!r}")
    if "text" in obj:
        text, title = obj["text"], obj.get("title", "")
        if not isinstance(text, str):
            raise CorpusError(f"field 'text' must be a string, got {type(text).__name__}")
        if not isinstance(title, str):
            raise CorpusError(f"field 'title' must be a string, got {type(title).__name__}")
    elif "contents" in obj:
        contents = obj["contents"]
        if not isinstance(contents, str):
            raise CorpusError(f"field 'contents' must be a string, got {type(contents).__name__}")
        title, _, text = contents.partition("\n")
        title = title.strip()
        if len(title) >= 2 and title[0] == title[-1] == '"':
            title = title[1:-1]
    else:
        raise CorpusError("missing field 'text' (or Search-R1 'contents')")
    for name, value in (("id", doc_id), ("title", title), ("text", text)):
        try:  # a lone surrogate (JSON's "\ud800") would fail later, when the text is tokenised or sent
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CorpusError(f"field {name!r} is not encodable text ({exc.reason} at character {exc.start + 1})") \
                from None
    return Document(doc_id, title, text)


def iter_corpus(path: PathLike) -> Iterator[Document]:
    """Stream the documents of a jsonl corpus in file order, checking every line and id uniqueness
    (blank lines are skipped)."""
    return iter_jsonl_records(path, lambda obj, _: document_from_json(obj), CorpusError, unique_ids=True,
                              missing="corpus file not found")


def corpus_file_problem(path: PathLike) -> Optional[str]:
    """What keeps `path` from being read as a corpus file, in words (None: it is a file)."""
    path = Path(path)
    if path.is_file():
        return None
    if path.is_dir():
        return "is a directory, not a corpus file (jsonl: one {id, title, text} object per line)"
    return "corpus file not found"


def load_corpus(path: PathLike) -> list[Document]:
    """Read a whole jsonl corpus into a list of `Document`."""
    return list(iter_corpus(path))


def write_corpus(path: PathLike, documents: Iterable[Document]) -> int:
    """Write `documents` as a canonical ``{"id", "title", "text"}`` jsonl corpus (atomic replace: a
    reader never sees a half-written corpus); returns the number written.

    Raises `CorpusError` for duplicate or malformed ids (the file is then left untouched).
    """
    seen: set[str] = set()

    def checked_documents() -> Iterator[dict]:
        for count, doc in enumerate(documents):
            checked = document_from_json(doc.to_json())
            if checked.id in seen:
                raise CorpusError(f"duplicate id {checked.id!r} (document {count})")
            seen.add(checked.id)
            yield checked.to_json()

    return write_jsonl(path, checked_documents())


def corpus_fingerprint(path: PathLike) -> str:
    """SHA-256 of a corpus file's bytes (hex), used to tell whether a saved index is stale."""
    return sha256_file(path)
