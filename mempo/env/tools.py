"""The agent's tools: `search` and `access`, answering inside ``<information>...</information>``.

A tool is called with the raw text between the action tags (``<search> query </search>``,
``<access> doc-id [page] </access>``) and returns a `ToolResult`. It never raises into the agent
loop: a bad call or a failing retriever gives ``ok=False`` and an ``<information>Error: ...
</information>`` text telling the agent what was wrong (details in ``metadata["error"]``). Tools
work unchanged with an in-process retriever and with `HTTPRetriever`; build them by name with
`make_tool` / `make_tools` (add one with `register_tool`).
"""
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from mempo.protocol import grammar as protocol
from mempo.utils.registry import Registry
from mempo.env.retriever import (
    DEFAULT_PAGE_CHARS, DEFAULT_TOPK, MAX_QUERY_CHARS, DocumentNotFoundError, InvalidRequestError,
    PageOutOfRangeError, Retriever, RetrieverError,
)

__all__ = ["ToolResult", "SearchTool", "AccessTool", "register_tool", "make_tool", "make_tools",
           "available_tools", "parse_access_argument", "information"]

logger = logging.getLogger(__name__)

SEARCH_KIND = "search_results"
WEBPAGE_KIND = "webpage"


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returns to the agent loop.

    `text` is the full ``<information>...</information>`` segment; `kind` is "search_results" or
    "webpage"; `ok` is False for a failed call (then metadata["error"] holds the detail).
    """
    text: str
    kind: str
    ok: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)


def information(body: str) -> str:
    """Wrap a tool answer in the protocol's information tags.

    A literal ``</information>`` inside the body (a retrieved page quoting the protocol) would end
    the block early for the scanner and `validate_format`; it is defused as ``</ information>``.
    """
    return "<information>" + body.replace("</information>", "</ information>") + "</information>"


def _failure(kind: str, message: str, **metadata: Any) -> ToolResult:
    metadata.setdefault("error", message)
    return ToolResult(information(f"Error: {message}"), kind, ok=False, metadata=metadata)


def _unexpected(kind: str, tool: str, exc: Exception) -> ToolResult:
    logger.exception("%s tool failed unexpectedly", tool)
    return _failure(kind, f"the {tool} tool failed unexpectedly; try again or answer with what you know.",
                    error=f"{type(exc).__name__}: {exc}")


TOOLS = Registry("tool")


def register_tool(name: str):
    """Decorator registering a tool class (constructor: retriever first, then keywords) under `name`."""
    return TOOLS.register(name)


def make_tool(name: str, retriever: Retriever, **kwargs: Any):
    """The tool registered under `name`, bound to `retriever`."""
    return TOOLS.get(name)(retriever, **kwargs)


def make_tools(retriever: Retriever, names: Optional[list[str]] = None,
               options: Optional[dict[str, dict[str, Any]]] = None) -> dict[str, Any]:
    """{name: tool} for `names` (default: every registered tool); `options[name]` are its keywords."""
    options = options or {}
    return {name: make_tool(name, retriever, **options.get(name, {})) for name in (names or available_tools())}


def available_tools() -> list[str]:
    """Names accepted by `make_tool`."""
    return TOOLS.names()


@register_tool("search")
class SearchTool:
    """Top-k search over the retriever, each document cut to its first `doc_chars` characters.

    The argument, stripped, is the query (1 to `max_query_chars` = 2048 characters). The answer
    lists the top-k documents, each starting a line::

        <information>Doc 1 (ID: d7, Title: Ada Lovelace) <first doc_chars characters of the text>
        Doc 2 (ID: d9, Title: ...) ...</information>

    The title is not counted in `doc_chars`; the ID lets the agent `access` the whole document. No
    match gives "No results found for this query.". kind = "search_results"; metadata: query, topk,
    doc_ids, scores, truncated (one flag per hit).
    """

    name = "search"
    kind = SEARCH_KIND

    def __init__(self, retriever: Retriever, topk: int = DEFAULT_TOPK, doc_chars: int = 5000,
                 max_query_chars: int = MAX_QUERY_CHARS):
        if topk < 1 or doc_chars < 1 or max_query_chars < 1:
            raise ValueError("topk, doc_chars and max_query_chars must be >= 1")
        self.retriever, self.topk, self.doc_chars, self.max_query_chars = retriever, topk, doc_chars, max_query_chars

    def __call__(self, argument: str) -> ToolResult:
        query = argument.strip() if isinstance(argument, str) else ""
        if not query:
            return _failure(self.kind, "empty search query. Write the query between <search> and </search>.",
                            query=query)
        if len(query) > self.max_query_chars:
            return _failure(self.kind, f"search query too long ({len(query)} characters; the limit is "
                                       f"{self.max_query_chars}). Use a shorter query.", query=query[:200])
        try:
            hits = self.retriever.search([query], self.topk)[0]
        except InvalidRequestError as exc:
            return _failure(self.kind, f"invalid search query ({exc}).", query=query, error=str(exc))
        except RetrieverError as exc:
            return _failure(self.kind, "the search service is unavailable right now; try again later.",
                            query=query, error=str(exc))
        except Exception as exc:  # the agent loop must never see an exception
            return _unexpected(self.kind, self.name, exc)
        if not hits:
            body = "No results found for this query."
        else:
            body = "\n".join(f"Doc {rank} (ID: {hit.doc_id}, Title: {hit.title}) {hit.text[:self.doc_chars]}"
                             for rank, hit in enumerate(hits, 1))
        metadata = {"query": query, "topk": self.topk, "doc_ids": [h.doc_id for h in hits],
                    "scores": [h.score for h in hits], "truncated": [len(h.text) > self.doc_chars for h in hits]}
        return ToolResult(information(body), self.kind, ok=True, metadata=metadata)


def parse_access_argument(argument: str) -> tuple[str, int]:
    """``"<doc-id> [page]"`` -> (doc_id, page), split as `mempo.protocol.grammar.parse_access_argument` does
    (the page is a bare or bracketed ASCII integer, default 0); document ids hold no white space.
    Raises `InvalidRequestError` with an agent-readable reason."""
    if not isinstance(argument, str) or not argument.strip():
        raise InvalidRequestError("empty access request. Write <access> doc-id [page] </access>.")
    if len(argument.split()) > 2:
        raise InvalidRequestError(f"malformed access request {argument.strip()[:200]!r}. "
                                  "Write <access> doc-id [page] </access>, e.g. <access> d7 1 </access>.")
    doc_id, page = protocol.parse_access_argument(argument)
    words = doc_id.split()
    if len(words) == 2:  # a second word that is no page number
        raise InvalidRequestError(f"malformed page {words[1][:50]!r}: the page is a whole number counted from 0.")
    return doc_id, 0 if page is None else page


@register_tool("access")
class AccessTool:
    """One page of a document (pages of `page_chars` characters, counted from 0).

    The argument is ``<doc-id>`` or ``<doc-id> <page>`` (`parse_access_argument`). The answer::

        <information>Document d7 (Title: Ada Lovelace), page 0 of pages 0-2
        <page text, at most page_chars characters></information>

    kind = "webpage"; metadata: doc_id, title, page, num_pages.
    """

    name = "access"
    kind = WEBPAGE_KIND

    def __init__(self, retriever: Retriever, page_chars: int = DEFAULT_PAGE_CHARS):
        if page_chars < 1:
            raise ValueError("page_chars must be >= 1")
        self.retriever, self.page_chars = retriever, page_chars

    def __call__(self, argument: str) -> ToolResult:
        try:
            doc_id, page_number = parse_access_argument(argument)
        except InvalidRequestError as exc:
            return _failure(self.kind, str(exc), argument=str(argument)[:200])
        try:
            page = self.retriever.access(doc_id, page_number, self.page_chars)
        except DocumentNotFoundError as exc:
            return _failure(self.kind, f"no document with ID {doc_id!r}. Use an ID shown in search results.",
                            doc_id=doc_id, page=page_number, error=str(exc))
        except PageOutOfRangeError as exc:
            hint = (f"Its pages are numbered 0 to {exc.num_pages - 1}." if exc.num_pages
                    else "Pages are numbered from 0.")
            return _failure(self.kind, f"document {doc_id!r} has no page {page_number}. {hint}",
                            doc_id=doc_id, page=page_number, error=str(exc))
        except InvalidRequestError as exc:
            return _failure(self.kind, f"invalid access request ({exc}).", doc_id=doc_id, page=page_number,
                            error=str(exc))
        except RetrieverError as exc:
            return _failure(self.kind, "the document service is unavailable right now; try again later.",
                            doc_id=doc_id, page=page_number, error=str(exc))
        except Exception as exc:  # the agent loop must never see an exception
            return _unexpected(self.kind, self.name, exc)
        header = (f"Document {page.doc_id} (Title: {page.title}), page {page.page} of pages "
                  f"0-{page.num_pages - 1}")
        metadata = {"doc_id": page.doc_id, "title": page.title, "page": page.page, "num_pages": page.num_pages}
        return ToolResult(information(header + "\n" + page.text), self.kind, ok=True, metadata=metadata)

