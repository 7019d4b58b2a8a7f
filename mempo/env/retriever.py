"""Retrievers' interface: `Retriever` ("search a corpus", "read a document page by page"), its
records (`Hit`, `Page`), its errors, the argument checks shared with the server and the client,
`paginate`, and the registry `RETRIEVERS` filled with `register_retriever(name)` ("bm25" in
`mempo.env.bm25`, "dense" in `mempo.env.dense`, "http" in `mempo.env.client`); build one by name
with `mempo.env.build.make_retriever`.

Pages are 0-based and `page_chars` characters long (the last may be shorter; an empty text is one
empty page). Importing this module is cheap: it needs no numpy.
"""
import abc
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from mempo.env.corpus import Document
from mempo.errors import MempoError
from mempo.utils.registry import Registry

__all__ = [
    "DEFAULT_TOPK", "DEFAULT_PAGE_CHARS", "MAX_QUERY_CHARS", "Hit", "Page", "Retriever", "RetrieverError",
    "InvalidRequestError", "DocumentNotFoundError", "PageOutOfRangeError", "RetrieverUnavailableError",
    "register_retriever", "RETRIEVERS", "paginate", "check_queries", "check_topk", "check_page", "check_page_chars",
    "check_doc_id",
]

DEFAULT_TOPK = 5
DEFAULT_PAGE_CHARS = 25_000
MAX_QUERY_CHARS = 2048  # longest query the server and the search tool accept (characters)


# ----------------------------------------------------------------------------------------------
# Records and errors
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hit:
    """One search result: the document's id, title, whole text, and its retrieval score."""
    doc_id: str
    title: str
    text: str
    score: float


@dataclass(frozen=True)
class Page:
    """One page of a document: `page` is 0-based, `num_pages` >= 1, `text` at most page_chars long."""
    doc_id: str
    title: str
    page: int
    num_pages: int
    text: str


class RetrieverError(MempoError):
    """Base class of every retrieval failure (bad request, unknown document, server unavailable)."""


class InvalidRequestError(RetrieverError, ValueError):
    """The arguments are not acceptable (empty or blank query, topk < 1, bad page, over a limit)."""


class DocumentNotFoundError(RetrieverError, LookupError):
    """No document has the requested id."""


class PageOutOfRangeError(RetrieverError, IndexError):
    """The document exists but has no page with the requested number; `num_pages` says how many it has."""

    def __init__(self, message: str, num_pages: Optional[int] = None):
        super().__init__(message)
        self.num_pages = num_pages


class RetrieverUnavailableError(RetrieverError):
    """A remote retriever could not be reached, timed out, failed (5xx) or answered garbage."""


# ----------------------------------------------------------------------------------------------
# Argument checks shared by the retrievers, the server and the client
# ----------------------------------------------------------------------------------------------

def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_queries(queries: object, *, max_queries: Optional[int] = None,
                  max_query_chars: Optional[int] = None) -> list[str]:
    """Return `queries` as a list, or raise `InvalidRequestError` saying which query is wrong."""
    if isinstance(queries, str) or not isinstance(queries, (list, tuple)):
        raise InvalidRequestError(f"queries must be a list of strings, got {type(queries).__name__}")
    if not queries:
        raise InvalidRequestError("queries is empty: give at least one query")
    if max_queries is not None and len(queries) > max_queries:
        raise InvalidRequestError(f"too many queries: {len(queries)} > limit {max_queries}")
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise InvalidRequestError(f"queries[{i}] must be a string, got {type(query).__name__}")
        if not query.strip():
            raise InvalidRequestError(f"queries[{i}] is blank")
        if max_query_chars is not None and len(query) > max_query_chars:
            raise InvalidRequestError(f"queries[{i}] is too long: {len(query)} characters > limit {max_query_chars}")
    return list(queries)


def check_topk(topk: object, *, topk_max: Optional[int] = None) -> int:
    """Return `topk` if it is an integer in [1, topk_max], else raise `InvalidRequestError`."""
    if not _is_int(topk):
        raise InvalidRequestError(f"topk must be an integer, got {type(topk).__name__}")
    if topk < 1:
        raise InvalidRequestError(f"topk must be >= 1, got {topk}")
    if topk_max is not None and topk > topk_max:
        raise InvalidRequestError(f"topk {topk} is over the limit {topk_max}")
    return topk


def check_page(page: object) -> int:
    """Return `page` if it is an integer >= 0, else raise `InvalidRequestError`."""
    if not _is_int(page):
        raise InvalidRequestError(f"page must be an integer, got {type(page).__name__}")
    if page < 0:
        raise InvalidRequestError(f"page must be >= 0, got {page}")
    return page


def check_page_chars(page_chars: object, *, limit: Optional[int] = None) -> int:
    """Return `page_chars` if it is an integer in [1, limit], else raise `InvalidRequestError`."""
    if not _is_int(page_chars) or page_chars < 1:
        raise InvalidRequestError(f"page_chars must be a positive integer, got {page_chars!r}")
    if limit is not None and page_chars > limit:
        raise InvalidRequestError(f"page_chars {page_chars} is over the limit {limit}")
    return page_chars


def check_doc_id(doc_id: object) -> str:
    """Return `doc_id` if it is a non-empty string, else raise `InvalidRequestError`."""
    if not isinstance(doc_id, str):
        raise InvalidRequestError(f"doc_id must be a string, got {type(doc_id).__name__}")
    if not doc_id:
        raise InvalidRequestError("doc_id is empty")
    return doc_id


def paginate(doc: Document, page: int, page_chars: int) -> Page:
    """Cut `doc.text` into pages of `page_chars` characters and return page `page` (0-based)."""
    page, page_chars = check_page(page), check_page_chars(page_chars)
    num_pages = max(1, math.ceil(len(doc.text) / page_chars))
    if page >= num_pages:
        raise PageOutOfRangeError(
            f"page {page} is out of range for document {doc.id!r}: it has {num_pages} page(s), "
            f"numbered 0 to {num_pages - 1}", num_pages=num_pages)
    start = page * page_chars
    return Page(doc.id, doc.title, page, num_pages, doc.text[start:start + page_chars])


# ----------------------------------------------------------------------------------------------
# The interface and its registry
# ----------------------------------------------------------------------------------------------

class Retriever(abc.ABC):
    """What the tools need from a corpus: ranked search and paged access.

    Every failure is a `RetrieverError`: bad arguments (empty query list, blank or non-string query,
    topk < 1, negative or non-integer page) raise `InvalidRequestError`, an unknown id
    `DocumentNotFoundError`, a page past the end `PageOutOfRangeError`. The HTTP client
    (`mempo.env.client`) raises the same classes for its server's answers, plus
    `RetrieverUnavailableError`, so in-process and HTTP retrievers are interchangeable.
    """

    name: str = "retriever"
    page_chars: int = DEFAULT_PAGE_CHARS

    @property
    @abc.abstractmethod
    def num_docs(self) -> int:
        """Number of documents in the corpus."""

    @abc.abstractmethod
    def search(self, queries: Sequence[str], topk: int = DEFAULT_TOPK) -> list[list[Hit]]:
        """One ranked list per query, best first, at most `topk` hits each (fewer when fewer documents
        match). A `Hit` carries the document's whole text; cutting it for the agent (5,000
        characters by default) is the search tool's job."""

    @abc.abstractmethod
    def access(self, doc_id: str, page: int = 0, page_chars: Optional[int] = None) -> Page:
        """Page `page` (0-based) of document `doc_id`, cut into pages of `page_chars` characters
        (default self.page_chars, 25,000). A document has at least one page (an empty text is one
        empty page)."""

    def check_health(self) -> Optional[dict]:
        """Raise `RetrieverUnavailableError` (naming where) if the retriever cannot serve now.

        Call once before work that needs it (training, evaluation). An in-process retriever is
        always ready (None); `HTTPRetriever` asks its server (`/health`) and returns the answer.
        """
        return None

    def close(self) -> None:
        """Release files or connections held by the retriever (no-op by default)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


RETRIEVERS = Registry("retriever")


def register_retriever(name: str):
    """Decorator registering a retriever factory (class or function returning a Retriever) under `name`."""
    return RETRIEVERS.register(name)
