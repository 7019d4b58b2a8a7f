"""The environment a command runs in, from the configuration: the synthetic world, the retriever and
the agent's tools. `mempo train`, `mempo sft`, `mempo eval` and the demo all build theirs here, so
they agree on it.

Conventions
-----------
* World (`synthetic_world`): ``data.world_seed``, ``data.world_entities`` (or exactly
  ``data.world_documents`` documents), ``data.article_fillers`` and the small-world options
  ``data.world_*`` (`mempo.config.DataConfig`).
* Retriever (`build_retriever`), by ``env``: ``retriever: http``: an `HTTPRetriever` at
  ``retriever_url`` that passed `HTTPRetriever.check_health` (a ConfigError naming
  ``env.retriever_url`` for a malformed URL, a `RetrieverUnavailableError` naming it when the server
  does not answer); else BM25 over ``corpus_path`` (`load_or_build_bm25`; a ConfigError naming
  ``env.corpus_path`` when the file does not exist); else BM25 over the given world's documents (a
  ConfigError naming ``env.corpus_path`` when there is no world, i.e. QA-file data). Every check runs
  before any index is built.
* By name (`make_retriever`): the factory registered under the name (`mempo.env.retriever.RETRIEVERS`:
  "bm25" from `mempo.env.bm25`, "dense" from `mempo.env.dense`, "http" from `mempo.env.client`; this
  module imports all three).
* Tools (`build_tools`): ``search`` (``env.topk`` results cut to ``env.doc_chars``) and ``access``
  (pages of ``env.page_chars``) over the retriever.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

from mempo.config import ConfigError, MempoConfig
from mempo.env.bm25 import BM25Retriever, load_or_build_bm25
from mempo.env.client import HTTPRetriever
from mempo.env.dense import DenseRetriever
from mempo.env.retriever import RETRIEVERS, Retriever, RetrieverUnavailableError
from mempo.env.tools import make_tools
from mempo.env.world import World

__all__ = ["SyntheticEnv", "synthetic_world", "build_retriever", "build_tools", "build_world", "make_retriever",
           "available_retrievers"]


class SyntheticEnv(NamedTuple):
    """`build_world`'s result: the synthetic world and the retriever of the ``env`` section."""

    world: World
    retriever: Retriever


def synthetic_world(cfg: MempoConfig) -> World:
    """The synthetic world ``cfg.data`` describes (module conventions)."""
    data = cfg.data
    fillers = tuple(data.article_fillers) if data.article_fillers is not None else None
    return World.generate(data.world_seed, data.world_entities, num_documents=data.world_documents,
                          article_fillers=fillers, relations=data.world_relations, names=data.world_names,
                          article_style=data.world_article_style, chronicles=data.world_chronicles,
                          chronicle_fraction=0.15 if data.world_chronicles else 0.0,
                          distractor_ratio=data.world_distractor_ratio,
                          question_hops=data.world_question_hops, prompt_style=data.world_prompt_style)


def build_retriever(cfg: MempoConfig, world: Optional[World] = None, *,
                    log: Optional[Callable[[str], None]] = None) -> Retriever:
    """The retriever of ``cfg.env`` (module conventions). world: the synthetic world whose documents a
    BM25 retriever indexes when ``env.corpus_path`` is not set (None: QA-file data). log: progress
    lines of a BM25 index build or load (None: silent)."""
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
        if not Path(env.corpus_path).is_file():
            raise ConfigError("env.corpus_path", f"{env.corpus_path}: corpus file not found")
        return load_or_build_bm25(env.corpus_path, None, page_chars=env.page_chars, log=log)
    if world is None:
        raise ConfigError("env.corpus_path", "must name a corpus jsonl ({id, title, text} per line; "
                                             "mempo.env.corpus) when env.retriever is 'bm25' and the data are "
                                             "QA files (mempo eval --corpus FILE), or use env.retriever=http "
                                             "with env.retriever_url")
    return BM25Retriever.build(list(world.documents()))


_REGISTERING = (load_or_build_bm25, DenseRetriever, HTTPRetriever)  # imported for RETRIEVERS: "bm25", "dense", "http"


def make_retriever(name: str, **kwargs: Any) -> Retriever:
    """Build the retriever registered under `name` with keyword arguments `kwargs` (module conventions)."""
    return RETRIEVERS.get(name)(**kwargs)


def available_retrievers() -> list[str]:
    """Names accepted by `make_retriever`."""
    return RETRIEVERS.names()


def build_tools(cfg: MempoConfig, retriever: Retriever) -> dict[str, Any]:
    """The ``search`` / ``access`` tools over `retriever` with the ``env`` section's limits."""
    env = cfg.env
    return make_tools(retriever, options={"search": {"topk": env.topk, "doc_chars": env.doc_chars},
                                          "access": {"page_chars": env.page_chars}})


def build_world(cfg: MempoConfig, *, log: Optional[Callable[[str], None]] = None) -> SyntheticEnv:
    """`synthetic_world(cfg)` and `build_retriever(cfg, world)` (BM25 over the world's documents
    unless ``env`` names a corpus or a server)."""
    world = synthetic_world(cfg)
    return SyntheticEnv(world, build_retriever(cfg, world, log=log))
