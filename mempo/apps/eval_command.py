"""The ``mempo eval`` command: evaluate a saved model (`mempo.eval.evaluate`).

    mempo eval --model MODEL_DIR --out OUT_DIR [--config CONFIG.yaml] [section.field=value ...]
               [--data synthetic|files] [--files QA_FILE ...] [--corpus CORPUS.jsonl | --retriever-url URL]
               [--name NAME] [--episodes N] [--no-trajectories] [--no-progress]

Overrides go anywhere among the options (but not right after ``--files``, which takes every word
after it); the flags are shorthands
applied over the config file and the overrides (`_eval_config`). A user error is a
`mempo.errors.MempoError`: `mempo.apps.cli.main` prints it as one line ``mempo eval: ...`` and exits
with code 2.
"""
from __future__ import annotations

import argparse
import os
import sys

from mempo.config import ConfigError, MempoConfig, config_from_dict, config_to_dict, load_config
from mempo.utils.atomic import check_output_folder

__all__ = ["HELP", "add_arguments", "run"]

HELP = ("evaluate a saved model on k-objective episodes of the synthetic world or of QA files "
        "(EM, F1, prompt tokens per dataset and k; memory vs full context; trajectories)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="training/eval YAML (MempoConfig); default: all defaults")
    parser.add_argument("--model", required=True, help="directory with a saved HF causal LM and its tokenizer")
    parser.add_argument("--out", required=True, help="output directory for <name>.json, <name>.md and "
                                                     "<name>_trajectories.jsonl")
    parser.add_argument("--name", default="eval", help="output file stem (default eval; not empty, no leading dot "
                                                       "or path separator)")
    parser.add_argument("--data", choices=["synthetic", "files"], default=None,
                        help="what to evaluate on: the synthetic world or QA files (sets data.source)")
    parser.add_argument("--files", nargs="+", default=None, metavar="QA_FILE",
                        help="Search-R1 style QA files, .jsonl or .parquet (sets data.eval_files)")
    parser.add_argument("--corpus", default=None, help="jsonl corpus searched with in-process BM25 "
                                                       "(sets env.retriever=bm25, env.corpus_path)")
    parser.add_argument("--retriever-url", default=None, help="a retrieval server, e.g. http://127.0.0.1:8000 "
                                                              "(sets env.retriever=http, env.retriever_url)")
    parser.add_argument("--episodes", type=int, default=None, help="episodes per dataset and number of "
                                                                   "objectives (default: eval.episodes)")
    parser.add_argument("--no-trajectories", action="store_true", help="do not write <name>_trajectories.jsonl")
    parser.add_argument("--no-progress", action="store_true", help="no progress display")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. eval.objectives=[2,4]")


def _eval_config(args: argparse.Namespace) -> MempoConfig:
    """The config file and the overrides, then the shorthand flags over them: ``--data`` sets
    ``data.source``, ``--files`` ``data.eval_files`` (and ``data.source: files``), ``--corpus``
    ``env.retriever: bm25`` and ``env.corpus_path``, ``--retriever-url`` ``env.retriever: http`` and
    ``env.retriever_url`` (a Search-R1 retrieval server works as is). Contradicting flags are a
    ConfigError (``--files`` with ``--data synthetic``; ``--corpus`` with ``--retriever-url``)."""
    for path in args.files or []:
        if "=" in path and "." in path.split("=", 1)[0] and not path.endswith((".jsonl", ".json", ".parquet")):
            raise ConfigError("data.eval_files", f"--files {path!r} looks like a config override; --files takes "
                                                 "every word after it, so put the overrides before it")
    if args.corpus is not None and args.retriever_url is not None:
        raise ConfigError("env.retriever", "give --corpus (BM25) or --retriever-url (HTTP), not both")
    if args.files is not None and args.data == "synthetic":
        raise ConfigError("data.source", "--files lists QA files but --data is 'synthetic'")
    cfg = load_config(args.config, args.overrides)
    raw = config_to_dict(cfg)
    if args.data is not None:
        raw["data"]["source"] = args.data
    if args.files is not None:
        raw["data"]["source"] = "files"
        raw["data"]["eval_files"] = list(args.files)
    if args.corpus is not None:
        raw["env"]["retriever"], raw["env"]["corpus_path"] = "bm25", args.corpus
    if args.retriever_url is not None:
        raw["env"]["retriever"], raw["env"]["retriever_url"] = "http", args.retriever_url
    return config_from_dict(raw)


def _check_outputs(args: argparse.Namespace) -> None:
    """``--out`` must be a directory or not exist yet (it is made), and ``--name`` a plain visible
    file stem (not empty, no path separator, not starting with a dot); the files it names must not be
    directories (`mempo.utils.atomic.check_output_folder`). A MempoError otherwise, before the model
    loads."""
    name = args.name
    if not name.strip() or name != name.strip() or name.startswith(".") or any(c in name for c in "/\\\0"):
        raise ConfigError("--name", f"{name!r} is not a plain file stem (not empty, no leading dot, no "
                                    "path separator or surrounding spaces)")
    check_output_folder(args.out, "--out", [name + suffix for suffix in (".json", ".md", "_trajectories.jsonl")])


def run(args: argparse.Namespace) -> int:
    """Evaluate the model directory ``args.model`` and write ``<name>.json``, ``<name>.md`` (tables
    and example episodes) and, unless ``--no-trajectories``, ``<name>_trajectories.jsonl`` (one
    `mempo.eval.EpisodeRecord` per episode and policy) under ``args.out``; returns 0.

    The model directory holds a saved HF causal LM and its tokenizer (``save_pretrained``, e.g.
    ``demo_out/model_rl``); it generates through the backend ``rollout.backend`` names (`build_backend`:
    HF, or SGLang loading the directory). Data: ``data.source: synthetic`` (the world of
    ``cfg.synthetic``, episodes from ``cfg.eval``: `eval_episodes`, of the split ``eval.split`` names,
    recorded as the report's ``split``) or ``files`` (``data.eval_files``,
    one table per dataset and k: `qa_eval_episodes`); the retriever is the ``env`` section's
    (`build_retriever`, as in training). Outputs, flags, data and retriever are checked before the
    slow model load. Every row counts its tool calls and the failed ones; when every call failed the
    report is written and a ConfigError (exit code 2) says so, unless ``eval.allow_failed_tools``.
    A user error (a missing or empty file, a bad field, k above a dataset's size, no corpus for BM25,
    an unreachable retriever, a bad flag) raises a `mempo.errors.MempoError`."""
    # reason: the parser module stays light (`mempo --help` imports no torch)
    from mempo.env.build import build_retriever
    from mempo.synthetic.build import synthetic_world
    from mempo.eval import eval_episodes, evaluate, qa_eval_episodes
    from mempo.model.loading import check_model_fits, load_model_dir
    from mempo.rollout.backends.factory import build_backend, check_backend_config

    cfg = _eval_config(args)
    _check_outputs(args)  # a path that cannot be written fails before any slow work
    check_backend_config(cfg)  # a backend that cannot work here fails before any slow work
    if not os.path.isdir(args.model):
        raise ConfigError("--model", f"{args.model!r} is not a directory")
    if args.episodes is not None and args.episodes < 1:
        raise ConfigError("--episodes", f"must be >= 1, got {args.episodes}")

    def log(line: str) -> None:
        print(f"mempo eval: {line}", file=sys.stderr, flush=True)

    # data and retriever first: their errors come before the (slow) model load
    if cfg.data.source == "files":
        sets = qa_eval_episodes(cfg, args.episodes)
        episodes, datasets = sets.episodes, sets.datasets
        retriever = build_retriever(cfg, None, log=log)
    else:
        world = synthetic_world(cfg)
        episodes, datasets = eval_episodes(world, cfg, args.episodes), {}
        retriever = build_retriever(cfg, world, log=log)
    model, tokenizer = load_model_dir(args.model, cfg.model.dtype,
                                      allow_pickle_weights=cfg.model.allow_pickle_weights)
    check_model_fits(model, tokenizer, vocab_field="--model")  # before any rollout (eval bounds the context)
    backend = build_backend(cfg, model, tokenizer, model_path=args.model)  # as in training
    trajectories = None if args.no_trajectories else os.path.join(args.out, f"{args.name}_trajectories.jsonl")
    try:
        report = evaluate(model, tokenizer, episodes, retriever, cfg, backend=backend, label=args.name,
                          show_progress=not args.no_progress, trajectories_path=trajectories)
    finally:
        close = getattr(retriever, "close", None)
        if close is not None:
            close()
    if cfg.env.retriever == "http":
        source = cfg.env.retriever_url
    else:
        source = cfg.env.corpus_path or "the synthetic world's documents"
    report.metadata.update(model_dir=os.path.abspath(args.model), data=cfg.data.source, datasets=datasets,
                           retriever=f"{cfg.env.retriever} over {source}")
    if cfg.data.source == "synthetic":  # which held-out split the numbers are of (eval.split)
        report.metadata["split"] = cfg.eval.split
    paths = report.write(args.out, args.name, title=f"Evaluation of {args.model}")
    if trajectories is not None:
        paths["trajectories"] = report.metadata["trajectories"]["path"]
    print(report.markdown(f"Evaluation of {args.model}", examples=False))
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    if report.all_tool_calls_failed() and not cfg.eval.allow_failed_tools:
        raise ConfigError("eval.allow_failed_tools", f"every tool call failed ({report.metadata['tool_calls']} "
                          f"calls, {report.metadata['tools_name']}); the numbers in "
                          f"{paths['json']} measure the model without its tools' results (set "
                          "eval.allow_failed_tools=true to accept them)")
    return 0
