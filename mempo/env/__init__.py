"""The agent's environment: corpus files, retrievers (BM25, dense, HTTP), the retrieval server, tools.

- `mempo.env.corpus`: jsonl corpora as `Document` records (`load_corpus`, `write_corpus`).
- `mempo.env.retriever`: the `Retriever` interface (`search`, `access`), its errors, the registry
  (`register_retriever`); `mempo.env.local`: what in-process retrievers share (document stores,
  paged access); `mempo.env.bm25`: `BM25Retriever`, `Tokenizer`; `mempo.env.dense`: `DenseRetriever`.
- `mempo.env.client`: `HTTPRetriever`, the same interface over HTTP (stdlib http.client).
- `mempo.env.server`: `create_app` (Search-R1 `/retrieve`, `/access`, `/health`), `RetrieverServer`
  (background thread) and `serve` (what `mempo serve-retriever` runs).
- `mempo.env.tools`: the `search` and `access` tools answering in ``<information>`` blocks.
- `mempo.env.data`: Search-R1-style QA loaders (jsonl, parquet) and MEM1-style multi-objective
  `Episode` composition (import it directly).
- `mempo.env.build`: the retriever and the tools from the configuration (one builder each, for
  every command; import it directly); a retriever by name (`make_retriever("bm25" |
  "http" | "dense", ...)`).

Importing `mempo.env` is cheap: bm25s, numpy, fastapi and uvicorn are imported only where used.
"""
from mempo.env.client import HTTPRetriever
from mempo.env.corpus import CorpusError, Document, corpus_fingerprint, iter_corpus, load_corpus, write_corpus
from mempo.env.bm25 import BM25Retriever, Tokenizer, load_or_build_bm25
from mempo.env.dense import DenseRetriever
from mempo.env.retriever import (
    DEFAULT_PAGE_CHARS, DEFAULT_TOPK, MAX_QUERY_CHARS, DocumentNotFoundError, Hit, InvalidRequestError, Page,
    PageOutOfRangeError, Retriever, RetrieverError, RetrieverUnavailableError, register_retriever,
)
from mempo.env.server import RetrieverServer, create_app, serve
from mempo.env.tools import (
    AccessTool, SearchTool, ToolResult, available_tools, make_tool, make_tools, parse_access_argument, register_tool,
)

__all__ = [
    "Document", "CorpusError", "load_corpus", "iter_corpus", "write_corpus", "corpus_fingerprint",
    "DEFAULT_TOPK", "DEFAULT_PAGE_CHARS", "MAX_QUERY_CHARS", "Hit", "Page", "Retriever", "RetrieverError",
    "InvalidRequestError", "DocumentNotFoundError", "PageOutOfRangeError", "RetrieverUnavailableError",
    "register_retriever", "Tokenizer", "BM25Retriever",
    "load_or_build_bm25", "DenseRetriever", "HTTPRetriever", "create_app", "RetrieverServer", "serve",
    "ToolResult", "SearchTool", "AccessTool", "register_tool", "make_tool", "make_tools", "available_tools",
    "parse_access_argument",
]
