"""The built-in tools `search` and `access`, written as any user's tool is (`mempo.tools.Tool`).

In the tags format the agent calls them as ``<search> query </search>`` and ``<access> doc-id [page]
</access>``; in the json format as ``{"name": "search", "arguments": {"query": ...}}`` and ``{"name":
"access", "arguments": {"doc_id": ..., "page": 0}}``. A bad call or a failing retriever raises
`mempo.tools.ToolError` with a message telling the agent what was wrong (details in the result's
``metadata["error"]``), so the agent reads ``Error: ...`` and the rollout goes on (`mempo.tools.Toolset`).
Tools work unchanged with an in-process retriever and with `HTTPRetriever`; build them by name with
`make_tool` / `make_tools` (add one with `register_tool`); `Tool.run` answers one tags-format call.
"""
import logging
from typing import Any, Optional

from mempo.protocol import grammar as protocol
from mempo.protocol.tags import TAG_SET
from mempo.tools import Tool, ToolError, ToolOutput, ToolResult
from mempo.utils.registry import Registry
from mempo.env.retriever import (
    DEFAULT_PAGE_CHARS, DEFAULT_TOPK, MAX_QUERY_CHARS, DocumentNotFoundError, InvalidRequestError,
    PageOutOfRangeError, Retriever, RetrieverError,
)

__all__ = ["ToolResult", "SearchTool", "AccessTool", "BUILTIN_TOOLS", "register_tool", "make_tool", "make_tools",
           "available_tools", "parse_access_argument", "information"]

logger = logging.getLogger(__name__)

SEARCH_KIND = "search_results"
WEBPAGE_KIND = "webpage"
#: the tools `make_tools` builds by default, and the names a config's ``env.tools`` may give without an import path
BUILTIN_TOOLS = ("search", "access")


def information(body: str) -> str:
    """Wrap a tool answer in the tags format's information tags (`TagSet.wrap_tool_result`: a literal
    ``</information>`` inside the body is defused as ``</ information>``)."""
    return TAG_SET.wrap_tool_result(body)


TOOLS = Registry("tool")


def register_tool(name: str):
    """Decorator registering a tool class (constructor: retriever first, then keywords) under `name`."""
    return TOOLS.register(name)


def make_tool(name: str, retriever: Retriever, **kwargs: Any) -> Tool:
    """The tool registered under `name`, bound to `retriever`."""
    return TOOLS.get(name)(retriever, **kwargs)


def make_tools(retriever: Retriever, names: Optional[list[str]] = None,
               options: Optional[dict[str, dict[str, Any]]] = None) -> dict[str, Tool]:
    """{name: tool} for `names` (default: `BUILTIN_TOOLS`); `options[name]` are its keywords."""
    options = options or {}
    return {name: make_tool(name, retriever, **options.get(name, {})) for name in (names or BUILTIN_TOOLS)}


def available_tools() -> list[str]:
    """Names accepted by `make_tool`."""
    return TOOLS.names()


def _unexpected(tool: str, exc: Exception) -> ToolError:
    logger.exception("%s tool failed unexpectedly", tool)
    return ToolError(f"the {tool} tool failed unexpectedly; try again or answer with what you know.",
                     error=f"{type(exc).__name__}: {exc}")


@register_tool("search")
class SearchTool(Tool):
    """Top-k search over the retriever, each document cut to its first `doc_chars` characters.

    The argument ``query``, stripped, is the query (1 to `max_query_chars` = 2048 characters). The
    answer lists the top-k documents, each starting a line::

        Doc 1 (ID: d7, Title: Ada Lovelace) <first doc_chars characters of the text>
        Doc 2 (ID: d9, Title: ...) ...

    The title is not counted in `doc_chars`; the ID lets the agent `access` the whole document. No
    match gives "No results found for this query.". result_kind = "search_results"; metadata: query,
    topk, doc_ids, scores, truncated (one flag per hit).
    """

    name = "search"
    description = ("Search the document collection; returns the top documents, each with its ID, title and the "
                   "start of its text.")
    parameters = {"type": "object", "properties": {"query": {"type": "string", "description": "what to search for"}},
                  "required": ["query"]}
    result_kind = SEARCH_KIND

    def __init__(self, retriever: Retriever, topk: int = DEFAULT_TOPK, doc_chars: int = 5000,
                 max_query_chars: int = MAX_QUERY_CHARS):
        if topk < 1 or doc_chars < 1 or max_query_chars < 1:
            raise ValueError("topk, doc_chars and max_query_chars must be >= 1")
        self.retriever, self.topk, self.doc_chars, self.max_query_chars = retriever, topk, doc_chars, max_query_chars

    def call(self, query: Any = "") -> ToolOutput:
        query = query.strip() if isinstance(query, str) else ""
        if not query:
            raise ToolError("empty search query. Write the query between <search> and </search>.", query=query)
        if len(query) > self.max_query_chars:
            raise ToolError(f"search query too long ({len(query)} characters; the limit is "
                            f"{self.max_query_chars}). Use a shorter query.", query=query[:200])
        try:
            hits = self.retriever.search([query], self.topk)[0]
        except InvalidRequestError as exc:
            raise ToolError(f"invalid search query ({exc}).", query=query, error=str(exc)) from None
        except RetrieverError as exc:
            raise ToolError("the search service is unavailable right now; try again later.", query=query,
                            error=str(exc)) from None
        except Exception as exc:  # reason: the agent reads a plain message; the detail goes to the metadata
            raise _unexpected(self.name, exc) from None
        if not hits:
            body = "No results found for this query."
        else:
            body = "\n".join(f"Doc {rank} (ID: {hit.doc_id}, Title: {hit.title}) {hit.text[:self.doc_chars]}"
                             for rank, hit in enumerate(hits, 1))
        metadata = {"query": query, "topk": self.topk, "doc_ids": [h.doc_id for h in hits],
                    "scores": [h.score for h in hits], "truncated": [len(h.text) > self.doc_chars for h in hits]}
        return ToolOutput(body, metadata)


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
class AccessTool(Tool):
    """One page of a document (pages of `page_chars` characters, counted from 0).

    The arguments are ``doc_id`` and ``page`` (default 0); in the tags format the text ``<doc-id>`` or
    ``<doc-id> <page>`` (`parse_access_argument`). The answer::

        Document d7 (Title: Ada Lovelace), page 0 of pages 0-2
        <page text, at most page_chars characters>

    result_kind = "webpage"; metadata: doc_id, title, page, num_pages.
    """

    name = "access"
    description = "Read one page of a document by its ID (as search results show it); pages are counted from 0."
    parameters = {"type": "object", "properties": {"doc_id": {"type": "string"},
                                                   "page": {"type": "integer", "minimum": 0, "default": 0}},
                  "required": ["doc_id"]}
    result_kind = WEBPAGE_KIND

    def __init__(self, retriever: Retriever, page_chars: int = DEFAULT_PAGE_CHARS):
        if page_chars < 1:
            raise ValueError("page_chars must be >= 1")
        self.retriever, self.page_chars = retriever, page_chars

    def arguments_from_text(self, text: str) -> dict[str, Any]:
        try:
            doc_id, page = parse_access_argument(text)
        except InvalidRequestError as exc:
            raise ToolError(str(exc), argument=str(text)[:200]) from None
        return {"doc_id": doc_id, "page": page}

    def call(self, doc_id: Any = "", page: Any = 0) -> ToolOutput:
        if not isinstance(doc_id, str) or not doc_id.strip() or len(doc_id.split()) != 1:
            raise ToolError(f"malformed document ID {str(doc_id)[:100]!r}: give one ID as search results show it.")
        if isinstance(page, bool) or not isinstance(page, int) or page < 0:
            raise ToolError(f"malformed page {str(page)[:50]!r}: the page is a whole number counted from 0.")
        doc_id = doc_id.strip()
        try:
            found = self.retriever.access(doc_id, page, self.page_chars)
        except DocumentNotFoundError as exc:
            raise ToolError(f"no document with ID {doc_id!r}. Use an ID shown in search results.",
                            doc_id=doc_id, page=page, error=str(exc)) from None
        except PageOutOfRangeError as exc:
            hint = (f"Its pages are numbered 0 to {exc.num_pages - 1}." if exc.num_pages
                    else "Pages are numbered from 0.")
            raise ToolError(f"document {doc_id!r} has no page {page}. {hint}", doc_id=doc_id, page=page,
                            error=str(exc)) from None
        except InvalidRequestError as exc:
            raise ToolError(f"invalid access request ({exc}).", doc_id=doc_id, page=page, error=str(exc)) from None
        except RetrieverError as exc:
            raise ToolError("the document service is unavailable right now; try again later.", doc_id=doc_id,
                            page=page, error=str(exc)) from None
        except Exception as exc:  # reason: the agent reads a plain message; the detail goes to the metadata
            raise _unexpected(self.name, exc) from None
        header = (f"Document {found.doc_id} (Title: {found.title}), page {found.page} of pages "
                  f"0-{found.num_pages - 1}")
        metadata = {"doc_id": found.doc_id, "title": found.title, "page": found.page, "num_pages": found.num_pages}
        return ToolOutput(header + "\n" + found.text, metadata)
