"""``mempo serve``: the trained agent behind an OpenAI-compatible endpoint (`mempo.serve`).

    mempo serve [section.field=value ...] --model MODEL_DIR [--config CONFIG.yaml]
                [--corpus CORPUS.jsonl | --retriever-url URL | --index-dir DIR] [--host H] [--port P]
                [--api-key KEY] [--max-in-flight N] [--request-deadline S] ...

Overrides go anywhere among the options. The agent runs as `mempo eval` runs it
(`mempo.serve.agent.serving_rollout_config`); the retriever is the ``env`` section's, or the
synthetic world's documents for ``data.source: synthetic`` (the demo:
``--config demo_out/config.yaml``). A user error is a `mempo.errors.MempoError` (one line, exit 2); a
port that cannot be bound exits 1.
"""
from __future__ import annotations

import argparse
import math
import os
import time

from mempo.config import ConfigError, MempoConfig, config_from_dict, config_to_dict, load_config
from mempo.apps.serve_retriever_command import add_connection_arguments
from mempo.env.server import DEFAULT_HOST
from mempo.serve.defaults import (
    DEFAULT_KEEP_ALIVE, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_IN_FLIGHT, DEFAULT_PORT, DEFAULT_REQUEST_DEADLINE,
)

__all__ = ["HELP", "add_arguments", "run", "add_agent_arguments", "agent_config", "API_KEY_ENV"]

HELP = ("serve a trained agent on an OpenAI-compatible endpoint (/v1/chat/completions with streamed rounds, "
        "/v1/models, /health)")
API_KEY_ENV = "MEMPO_API_KEY"


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags `mempo serve` and `mempo ask` share: the model, the config and the retriever."""
    parser.add_argument("--model", required=True, help="directory with a saved HF causal LM and its tokenizer "
                                                       "(e.g. demo_out/model_rl)")
    parser.add_argument("--config", default=None, help="the YAML the model was trained or evaluated with (e.g. "
                                                       "demo_out/config.yaml); default: all defaults")
    parser.add_argument("--corpus", default=None, help="jsonl corpus searched with in-process BM25 "
                                                       "(sets env.retriever=bm25, env.corpus_path)")
    parser.add_argument("--retriever-url", default=None, help="a retrieval server, e.g. http://127.0.0.1:8000 "
                                                              "(sets env.retriever=http, env.retriever_url)")
    parser.add_argument("--index-dir", default=None, help="a BM25 index directory (mempo serve-retriever "
                                                          "--index-dir), loaded, or built there from --corpus")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. eval.max_turns=8")


def agent_config(args: argparse.Namespace) -> MempoConfig:
    """The config file and the overrides, then ``--corpus`` (``env.retriever: bm25``,
    ``env.corpus_path``) and ``--retriever-url`` (``env.retriever: http``, ``env.retriever_url``)
    over them; both together, or ``--retriever-url`` with ``--index-dir``, is a ConfigError."""
    if args.corpus is not None and args.retriever_url is not None:
        raise ConfigError("env.retriever", "give --corpus (BM25) or --retriever-url (HTTP), not both")
    if args.index_dir is not None and args.retriever_url is not None:
        raise ConfigError("--index-dir", "give --index-dir (BM25) or --retriever-url (HTTP), not both")
    cfg = load_config(args.config, args.overrides)
    raw = config_to_dict(cfg)
    if args.corpus is not None:
        raw["env"]["retriever"], raw["env"]["corpus_path"] = "bm25", args.corpus
    if args.retriever_url is not None:
        raw["env"]["retriever"], raw["env"]["retriever_url"] = "http", args.retriever_url
    return config_from_dict(raw)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_agent_arguments(parser)
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}, loopback "
                                                             "only; anything else is reachable by others)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT}; 0 picks a free one, shown on the readiness line)")
    parser.add_argument("--model-name", default=None, help="the model id clients send and /v1/models lists "
                                                           "(default: the model directory's name)")
    parser.add_argument("--api-key", default=None, help=f"require 'Authorization: Bearer KEY' on every route but "
                                                        f"/health (default: ${API_KEY_ENV} if set, else no key)")
    parser.add_argument("--max-in-flight", type=int, default=DEFAULT_MAX_IN_FLIGHT,
                        help=f"requests running or waiting at once; more get HTTP 429 "
                             f"(default {DEFAULT_MAX_IN_FLIGHT})")
    parser.add_argument("--max-batch", type=int, default=None,
                        help="most episodes per generation batch (default: every waiting one)")
    parser.add_argument("--max-turns-limit", type=int, default=None,
                        help="the most rounds a request may ask for with max_turns (default: eval.max_turns)")
    parser.add_argument("--request-deadline", type=float, default=DEFAULT_REQUEST_DEADLINE,
                        help="seconds a request may run before it fails with HTTP 504 (default "
                             f"{DEFAULT_REQUEST_DEADLINE:g}; set client timeouts above it)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help=f"larger request bodies get HTTP 413 (default {DEFAULT_MAX_BODY_BYTES})")
    add_connection_arguments(parser, keep_alive=DEFAULT_KEEP_ALIVE)  # 30 s: above httpx's 5 s pool expiry


def _check_flags(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ConfigError("--port", f"must be in 0..65535, got {args.port}")
    for flag, value in (("--max-in-flight", args.max_in_flight), ("--max-body-bytes", args.max_body_bytes),
                        ("--keep-alive", args.keep_alive), ("--max-connections", args.max_connections),
                        ("--max-batch", args.max_batch), ("--max-turns-limit", args.max_turns_limit)):
        if value is not None and value < 1:
            raise ConfigError(flag, f"must be >= 1, got {value}")
    for flag, value in (("--request-deadline", args.request_deadline), ("--request-timeout", args.request_timeout)):
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(flag, f"must be a number of seconds > 0, got {value}")
    if args.api_key is not None and not args.api_key.strip():
        raise ConfigError("--api-key", "must not be empty")


def run(args: argparse.Namespace) -> int:
    """Load the agent (`mempo.serve.load.load_agent`) and serve it until interrupted; prints one
    readiness line to stdout: ``mempo-agent ready url=... model=... retriever=... startup_s=...``."""
    # reason: the parser module stays light (`mempo --help` imports no torch)
    from mempo.serve.load import load_agent
    from mempo.serve.openai_api import serve_agent
    from mempo.utils.log import log

    _check_flags(args)
    cfg = agent_config(args)
    started = time.perf_counter()
    api_key = args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None)
    agent = load_agent(cfg, args.model, index_dir=args.index_dir, model_id=args.model_name, log=log,
                       max_batch_size=args.max_batch, max_turns_limit=args.max_turns_limit,
                       deadline_s=args.request_deadline)

    def ready(url: str) -> None:
        print(f"mempo-agent ready url={url} model={agent.model_id} retriever={agent.source.replace(' ', '_')} "
              f"api_key={'yes' if api_key else 'no'} startup_s={time.perf_counter() - started:.2f}", flush=True)

    try:
        serve_agent(agent.service, args.host, args.port, model_id=agent.model_id, on_ready=ready,
                    log_level=args.log_level, max_in_flight=args.max_in_flight, max_body_bytes=args.max_body_bytes,
                    api_key=api_key, request_timeout=args.request_timeout, keep_alive=args.keep_alive,
                    max_connections=args.max_connections)
    except OSError as exc:
        log(f"cannot serve on {args.host}:{args.port}: {exc}")
        return 1
    finally:
        agent.close()
    return 0
