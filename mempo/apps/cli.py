"""The `mempo` command line: ``mempo <command> [options]`` (also ``python -m mempo.apps.cli``).

Commands are registered with `register_command`: a name, a one-line help, a function adding the
command's arguments to its argparse sub-parser, and a function running it (``run(args) -> exit
code``). Adding a command is one small function pair and one `register_command(...)` call; heavy
imports belong inside the run function, so ``mempo --help`` stays fast.

Exit codes: 0 success, 1 runtime failure (e.g. the port is taken), 2 usage or input error (argparse
errors, and every `mempo.errors.MempoError` a command raises: a bad config value, a missing or
malformed file, a damaged checkpoint, an unreachable retriever; printed as one line
``mempo <command>: <message>``, never a traceback), 130 interrupted.

Commands:
  serve-retriever   serve a BM25 index over a jsonl corpus on the Search-R1 HTTP API (`mempo.env.server`)
  sft, train        SFT cold start and MemPO RL (`mempo.apps.train_commands`)
  eval, demo        k-objective evaluation and the CPU demo (`mempo.apps.eval_command`)
"""
import argparse
import sys
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from mempo.errors import MempoError

__all__ = ["main", "register_command", "build_parser", "Command"]


@dataclass(frozen=True)
class Command:
    """One sub-command: its name, help line, argument declarations and runner."""
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


_COMMANDS: dict[str, Command] = {}


def register_command(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None],
                     run: Callable[[argparse.Namespace], int]) -> Command:
    """Register a sub-command (see the module docstring); returns the `Command`."""
    if name in _COMMANDS:
        raise ValueError(f"command {name!r} is already registered")
    command = _COMMANDS[name] = Command(name, help, add_arguments, run)
    return command


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per registered command."""
    from mempo import __version__

    parser = argparse.ArgumentParser(prog="mempo", description="MemPO: memory policy optimisation for LLM agents.")
    parser.add_argument("--version", action="version", version=f"mempo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in sorted(_COMMANDS.values(), key=lambda c: c.name):
        command_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(command_parser)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the chosen command, return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command].run(args)
    except MempoError as error:  # a user-fixable error: one line, no traceback
        print(f"mempo {args.command}: {_one_line(str(error)) or type(error).__name__}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130


def _one_line(message: str) -> str:
    """`message` with its white space (newlines included) collapsed to single spaces."""
    return " ".join(message.split())


def _log(message: str) -> None:
    print(f"mempo: {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# serve-retriever
# ------------------------------------------------------------------------------------------------

def _serve_retriever_arguments(parser: argparse.ArgumentParser) -> None:
    from mempo.env.retriever import DEFAULT_PAGE_CHARS, DEFAULT_TOPK, MAX_QUERY_CHARS
    from mempo.env.server import (
        DEFAULT_HOST, DEFAULT_MAX_DOC_CHARS, DEFAULT_MAX_QUERIES, DEFAULT_MAX_RESPONSE_CHARS, DEFAULT_PORT,
        DEFAULT_TOPK_MAX,
    )

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
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn log level (default warning)")


def _serve_retriever(args: argparse.Namespace) -> int:
    import time

    from mempo.env.corpus import CorpusError
    from mempo.env.retriever import load_or_build_bm25
    from mempo.env.server import serve

    if args.corpus is None and args.index_dir is None:
        _log("serve-retriever needs --corpus, --index-dir, or both")
        return 2
    if not 0 <= args.port <= 65535:
        _log(f"--port must be in 0..65535, got {args.port}")
        return 2
    if not 1 <= args.topk_default <= args.topk_max:
        _log(f"need 1 <= --topk-default ({args.topk_default}) <= --topk-max ({args.topk_max})")
        return 2
    if min(args.max_queries, args.max_query_chars, args.page_chars, args.max_doc_chars,
           args.max_response_chars) < 1:
        _log("--max-queries, --max-query-chars, --page-chars, --max-doc-chars and --max-response-chars "
             "must be >= 1")
        return 2
    started = time.perf_counter()
    try:
        retriever = load_or_build_bm25(args.corpus, args.index_dir, rebuild=args.rebuild,
                                       page_chars=args.page_chars, log=_log)
    except (CorpusError, OSError) as exc:
        _log(f"cannot open the corpus/index: {exc}")
        return 2

    def ready(url: str) -> None:
        print(f"mempo-retriever ready url={url} retriever={retriever.name} docs={retriever.num_docs} "
              f"startup_s={time.perf_counter() - started:.2f}", flush=True)

    try:
        serve(retriever, args.host, args.port, on_ready=ready, log_level=args.log_level,
              default_topk=args.topk_default, topk_max=args.topk_max, max_queries=args.max_queries,
              max_query_chars=args.max_query_chars, max_doc_chars=args.max_doc_chars,
              max_response_chars=args.max_response_chars)
    except OSError as exc:
        _log(f"cannot serve on {args.host}:{args.port}: {exc}")
        return 1
    finally:
        retriever.close()
    return 0


register_command("serve-retriever", "serve a BM25 index over a jsonl corpus (Search-R1 /retrieve API, "
                                    "plus /access and /health)", _serve_retriever_arguments, _serve_retriever)

import mempo.apps.train_commands  # noqa: E402,F401  (registers `sft` and `train`)

import mempo.apps.eval_command  # noqa: E402,F401  (registers `eval` and `demo`)


if __name__ == "__main__":
    # `python -m mempo.apps.cli` runs this file as `__main__`, a second module object; the commands
    # register themselves on `mempo.apps.cli`, so run that module's `main`.
    from mempo.apps.cli import main as _cli_main

    sys.exit(_cli_main())
