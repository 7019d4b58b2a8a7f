"""The environment a command runs in, from the configuration: the retriever (`build_retriever`,
`make_retriever`) and the agent's tools (`build_tools`: the built-in ``search`` / ``access`` and a
user's tools named by import path in ``env.tools``). `mempo train`, `mempo sft`, `mempo eval`, `mempo
serve` and the demo all build theirs here, so they agree on it (the synthetic world itself:
`mempo.synthetic.build`).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from mempo.config import ConfigError, MempoConfig
from mempo.env.bm25 import BM25Retriever, load_or_build_bm25
from mempo.env.client import HTTPRetriever
from mempo.env.closed_book import ClosedBookRetriever
from mempo.env.corpus import corpus_file_problem
from mempo.env.dense import DenseRetriever
from mempo.env.retriever import RETRIEVERS, Retriever, RetrieverUnavailableError
from mempo.env.tools import BUILTIN_TOOLS, make_tool
from mempo.protocol.tags import tag_set_for
from mempo.tools import Tool, Toolset, load_tools

__all__ = ["build_retriever", "build_tools", "make_retriever", "available_retrievers", "needs_retriever",
           "qa_prompt_style"]


def qa_prompt_style(cfg: MempoConfig) -> str:
    """The prompt style of episodes composed from QA files (`mempo.env.data.make_episode_prompt`):
    ``"numbered"`` (its instructions name search and access) for the built-in tools in the tags
    format, else ``"tools"`` (instructions that name no tool: a user's tools, the json format)."""
    builtin_only = set(cfg.env.tools) <= set(BUILTIN_TOOLS)
    return "numbered" if builtin_only and cfg.rollout.action_format == "tags" else "tools"


def needs_retriever(cfg: MempoConfig) -> bool:
    """Whether ``env.tools`` holds a built-in tool (``search`` / ``access`` query the retriever)."""
    return any(spec in BUILTIN_TOOLS for spec in cfg.env.tools)


def build_retriever(cfg: MempoConfig, world: Any = None, *,
                    log: Optional[Callable[[str], None]] = None) -> Retriever:
    """The retriever of ``cfg.env``; every check runs before any index is built.

    ``retriever: http``: an `HTTPRetriever` at ``retriever_url`` that passed
    `HTTPRetriever.check_health` (a ConfigError naming ``env.retriever_url`` for a malformed URL, a
    `RetrieverUnavailableError` naming it when the server does not answer); else BM25 over
    ``corpus_path`` (`load_or_build_bm25`; a ConfigError naming ``env.corpus_path`` when the file
    does not exist); else BM25 over `world`'s documents (a ConfigError naming ``env.corpus_path``
    when there is no world, i.e. QA-file data).

    When no built-in tool is configured (``env.tools`` names only a user's tools) nothing reads a
    retriever: a `ClosedBookRetriever` (finds nothing), and none of the checks above.

    world: the synthetic world (anything whose ``documents()`` yields `Document` records; None:
    QA-file data). log: progress lines of a BM25 index build or load (None: silent)."""
    env = cfg.env
    if not needs_retriever(cfg):
        return ClosedBookRetriever()
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


def build_tools(cfg: MempoConfig, retriever: Retriever) -> Toolset:
    """The `Toolset` of ``env.tools``, in order, calls bounded by ``env.tool_timeout`` and
    ``env.tool_result_chars``: a built-in name is that tool over `retriever` with the ``env`` section's
    limits (search returns ``env.topk`` results cut to ``env.doc_chars``; access returns pages of
    ``env.page_chars``); an import path is the user's tools (`mempo.tools.load_tools`). A ConfigError
    names ``env.tools[i]`` for a path that does not import or names no tool, and ``env.tools`` for two
    tools of one name or, with ``rollout.action_format: tags``, a name that cannot be a tag."""
    env = cfg.env
    options = {"search": {"topk": env.topk, "doc_chars": env.doc_chars}, "access": {"page_chars": env.page_chars}}
    tools: list[Tool] = []
    for i, spec in enumerate(env.tools):
        if spec in BUILTIN_TOOLS:
            tools.append(make_tool(spec, retriever, **options[spec]))
            continue
        try:
            tools.extend(load_tools(spec))
        except ValueError as error:
            raise ConfigError(f"env.tools[{i}]", str(error)) from None
    try:
        toolset = Toolset(tools, timeout=env.tool_timeout, max_chars=env.tool_result_chars)
        tag_set_for(cfg.rollout.action_format, toolset.names)
    except ValueError as error:
        raise ConfigError("env.tools", str(error)) from None
    return toolset
