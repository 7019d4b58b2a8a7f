"""``mempo serve-retriever``: serve a BM25 index over a jsonl corpus on the Search-R1 HTTP API
(``/retrieve``, plus ``/access`` and ``/health``; `mempo.env.server`).

    mempo serve-retriever [--corpus CORPUS.jsonl] [--index-dir DIR] [--rebuild] [--host H] [--port P] ...

The index is loaded from ``--index-dir`` when it holds one built from the same corpus file, else
built (and saved there); its files are checked against the digests in its manifest before the
server says it is ready (an index of format 1, without digests, is rebuilt when --corpus is given,
else refused: rebuild it with --rebuild). Connections are bounded (--request-timeout,
--keep-alive, --max-connections; out of file descriptors: one log line per 10 s). A bad flag, a
missing or malformed corpus or a damaged index is a `mempo.errors.MempoError` (one line, exit 2,
printed by `mempo.apps.cli.main`).
"""
from __future__ import annotations

import argparse
import math
import time

from mempo.config import ConfigError
from mempo.env.corpus import CorpusError
from mempo.env.bm25 import load_or_build_bm25
from mempo.env.retriever import DEFAULT_PAGE_CHARS, DEFAULT_TOPK, MAX_QUERY_CHARS
from mempo.env.server import (
    DEFAULT_HOST, DEFAULT_KEEP_ALIVE, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_DOC_CHARS, DEFAULT_MAX_QUERIES,
    DEFAULT_MAX_RESPONSE_CHARS, DEFAULT_PORT, DEFAULT_REQUEST_TIMEOUT, DEFAULT_TOPK_MAX, serve,
)
from mempo.utils.log import log

__all__ = ["HELP", "add_arguments", "add_connection_arguments", "run"]

HELP = "serve a BM25 index over a jsonl corpus (Search-R1 /retrieve API, plus /access and /health)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", help="jsonl corpus ({id, title, text} per line); optional when "
                                         "--index-dir already holds an index")
    parser.add_argument("--index-dir", help="load the BM25 index from here if present (and built from the "
                                            "same corpus file), else build it and save it here")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the index even if --index-dir holds one")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}, loopback "
                                                             "only; anything else is reachable by others)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT}; 0 picks a free one, shown on the readiness line)")
    parser.add_argument("--topk-default", type=int, default=DEFAULT_TOPK,
                        help=f"topk when a request gives none (default {DEFAULT_TOPK})")
    parser.add_argument("--topk-max", type=int, default=DEFAULT_TOPK_MAX,
                        help=f"largest topk a request may ask for (default {DEFAULT_TOPK_MAX})")
    parser.add_argument("--max-queries", type=int, default=DEFAULT_MAX_QUERIES,
                        help=f"most queries per request (default {DEFAULT_MAX_QUERIES})")
    parser.add_argument("--max-query-chars", type=int, default=MAX_QUERY_CHARS,
                        help=f"longest query in characters (default {MAX_QUERY_CHARS})")
    parser.add_argument("--page-chars", type=int, default=DEFAULT_PAGE_CHARS,
                        help=f"default /access page size in characters (default {DEFAULT_PAGE_CHARS})")
    parser.add_argument("--max-doc-chars", type=int, default=DEFAULT_MAX_DOC_CHARS,
                        help="/retrieve cuts each document's title and text to this many characters (default "
                             f"{DEFAULT_MAX_DOC_CHARS}; keep it >= the search tool's doc_chars)")
    parser.add_argument("--max-response-chars", type=int, default=DEFAULT_MAX_RESPONSE_CHARS,
                        help="a /retrieve or /access answer carrying more document characters than this is "
                             f"refused with HTTP 413 (default {DEFAULT_MAX_RESPONSE_CHARS})")
    add_connection_arguments(parser)


def add_connection_arguments(parser: argparse.ArgumentParser, *, keep_alive: int = DEFAULT_KEEP_ALIVE) -> None:
    """The connection bounds and log level of a server command (`mempo.env.server.uvicorn_server`):
    --request-timeout, --keep-alive (default `keep_alive`), --max-connections, --log-level."""
    parser.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT,
                        help="a connection that takes longer than this many seconds to send one whole request "
                             f"is closed (default {DEFAULT_REQUEST_TIMEOUT:g})")
    parser.add_argument("--keep-alive", type=int, default=keep_alive,
                        help=f"seconds an idle keep-alive connection is kept open (default {keep_alive})")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help="requests arriving while this many connections are open are answered 503 "
                             f"(default {DEFAULT_MAX_CONNECTIONS}, lowered to fit the file descriptor limit)")
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn log level (default warning)")


def _check_flags(args: argparse.Namespace) -> None:
    """ConfigError for flags that cannot work together (before the index is opened)."""
    if args.corpus is None and args.index_dir is None:
        raise ConfigError("", "serve-retriever needs --corpus, --index-dir, or both")
    if not 0 <= args.port <= 65535:
        raise ConfigError("--port", f"must be in 0..65535, got {args.port}")
    if not 1 <= args.topk_default <= args.topk_max:
        raise ConfigError("", f"need 1 <= --topk-default ({args.topk_default}) <= --topk-max ({args.topk_max})")
    if min(args.max_queries, args.max_query_chars, args.page_chars, args.max_doc_chars, args.max_response_chars) < 1:
        raise ConfigError("", "--max-queries, --max-query-chars, --page-chars, --max-doc-chars and "
                              "--max-response-chars must be >= 1")
    if not (args.request_timeout > 0 and math.isfinite(args.request_timeout)):
        raise ConfigError("--request-timeout", f"must be a number of seconds > 0, got {args.request_timeout}")
    if min(args.keep_alive, args.max_connections) < 1:
        raise ConfigError("", "--keep-alive and --max-connections must be >= 1")



def run(args: argparse.Namespace) -> int:
    """Open (or build) the index and serve it until interrupted; exit 1 when the address cannot be
    bound. Prints one readiness line to stdout once serving:
    ``mempo-retriever ready url=... retriever=bm25 docs=N startup_s=...``."""
    _check_flags(args)
    started = time.perf_counter()
    try:
        retriever = load_or_build_bm25(args.corpus, args.index_dir, rebuild=args.rebuild,
                                       page_chars=args.page_chars, log=log)
    except OSError as exc:  # an unreadable corpus or index directory (CorpusError is a MempoError already)
        raise CorpusError(f"cannot open the corpus/index: {exc}") from None

    def ready(url: str) -> None:
        print(f"mempo-retriever ready url={url} retriever={retriever.name} docs={retriever.num_docs} "
              f"startup_s={time.perf_counter() - started:.2f}", flush=True)

    try:
        serve(retriever, args.host, args.port, on_ready=ready, log_level=args.log_level,
              default_topk=args.topk_default, topk_max=args.topk_max, max_queries=args.max_queries,
              max_query_chars=args.max_query_chars, max_doc_chars=args.max_doc_chars,
              max_response_chars=args.max_response_chars, request_timeout=args.request_timeout,
              keep_alive=args.keep_alive, max_connections=args.max_connections)
    except OSError as exc:
        log(f"cannot serve on {args.host}:{args.port}: {exc}")
        return 1
    finally:
        retriever.close()
    return 0
