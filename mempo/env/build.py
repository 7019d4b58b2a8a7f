"""The environment a command runs in, from the configuration: the retriever (`build_retriever`,
`make_retriever`) and the agent's tools (`build_tools`). `mempo train`, `mempo sft`, `mempo eval` and
the demo all build theirs here, so they agree on it (the synthetic world itself: `mempo.synthetic.build`).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from mempo.config import ConfigError, MempoConfig
from mempo.env.bm25 import BM25Retriever, load_or_build_bm25
from mempo.env.client import HTTPRetriever
from mempo.env.corpus import corpus_file_problem
from mempo.env.dense import DenseRetriever
from mempo.env.retriever import RETRIEVERS, Retriever, RetrieverUnavailableError
from mempo.env.tools import make_tools

__all__ = ["build_retriever", "build_tools", "make_retriever", "available_retrievers"]


def build_retriever(cfg: MempoConfig, world: Any = None, *,
                    log: Optional[Callable[[str], None]] = None) -> Retriever:
    """The retriever of ``cfg.env``; every check runs before any index is built.

    ``retriever: http``: an `HTTPRetriever` at ``retriever_url`` that passed
    `HTTPRetriever.check_health` (a ConfigError naming ``env.retriever_url`` for a malformed URL, a
    `RetrieverUnavailableError` naming it when the server does not answer); else BM25 over
    ``corpus_path`` (`load_or_build_bm25`; a ConfigError naming ``env.corpus_path`` when the file
    does not exist); else BM25 over `world`'s documents (a ConfigError naming ``env.corpus_path``
    when there is no world, i.e. QA-file data).

    world: the synthetic world (anything whose ``documents()`` yields `Document` records; None:
    QA-file data). log: progress lines of a BM25 index build or load (None: silent)."""
    env = cfg.env
    if env.retriever == "http":
        try:
            retriever = HTTPRetriever(env.retriever_url)
        except ValueError as error:
            raise ConfigError("env.retriever_url", str(error)) from None
        try:
            retriever.check_health()
        except RetrieverUnavailableError as error:
            raise RetrieverUnavailableError(f"env.retriever_url: {error}") from None
        return retriever
    if env.corpus_path:
        problem = corpus_file_problem(env.corpus_path)
        if problem is not None:
            raise ConfigError("env.corpus_path", f"{env.corpus_path}: {problem}")
        return load_or_build_bm25(env.corpus_path, None, page_chars=env.page_chars, log=log)
    if world is None:
        raise ConfigError("env.corpus_path", "must name a corpus jsonl ({id, title, text} per line; "
                                             "mempo.env.corpus) when env.retriever is 'bm25' and the data are "
                                             "QA files (mempo eval --corpus FILE), or use env.retriever=http "
                                             "with env.retriever_url")
    return BM25Retriever.build(list(world.documents()))


_REGISTERING = (load_or_build_bm25, DenseRetriever, HTTPRetriever)  # imported for RETRIEVERS: "bm25", "dense", "http"


def make_retriever(name: str, **kwargs: Any) -> Retriever:
    """Build the retriever registered under `name` (`mempo.env.retriever.RETRIEVERS`: "bm25" from
    `mempo.env.bm25`, "dense" from `mempo.env.dense`, "http" from `mempo.env.client`; this module
    imports all three) with keyword arguments `kwargs`."""
    return RETRIEVERS.get(name)(**kwargs)


def available_retrievers() -> list[str]:
    """Names accepted by `make_retriever`."""
    return RETRIEVERS.names()


def build_tools(cfg: MempoConfig, retriever: Retriever) -> dict[str, Any]:
    """The ``search`` / ``access`` tools over `retriever` with the ``env`` section's limits: search
    returns ``env.topk`` results cut to ``env.doc_chars``; access returns pages of ``env.page_chars``."""
    env = cfg.env
    return make_tools(retriever, options={"search": {"topk": env.topk, "doc_chars": env.doc_chars},
                                          "access": {"page_chars": env.page_chars}})
