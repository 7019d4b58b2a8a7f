"""The agent `mempo serve` and `mempo ask` run, from a model directory and a configuration: the
retriever, the model, the backend and the `AgentService`, each built as `mempo eval` builds it."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from mempo.config import ConfigError, MempoConfig
from mempo.env.bm25 import load_or_build_bm25
from mempo.env.build import build_retriever, needs_retriever
from mempo.model.loading import check_model_fits, load_model_dir
from mempo.rollout.backends.factory import build_backend, check_backend_config
from mempo.serve.agent import AgentService
from mempo.synthetic.build import synthetic_world

__all__ = ["LoadedAgent", "load_agent", "open_retriever"]


@dataclass
class LoadedAgent:
    """A running `AgentService` and what it holds: `close` stops the service and the retriever."""

    service: AgentService
    retriever: Any
    model_id: str
    source: str  # what the retriever searches, in words

    def close(self) -> None:
        self.service.close()
        close = getattr(self.retriever, "close", None)
        if close is not None:
            close()


def open_retriever(cfg: MempoConfig, *, index_dir: Optional[str] = None,
                   log: Optional[Callable[[str], None]] = None) -> tuple[Any, str]:
    """(retriever, what it searches): a BM25 index loaded from (or built into) `index_dir` (with
    ``env.corpus_path`` as its corpus when set), else ``cfg.env``'s (`build_retriever`: an HTTP
    server, BM25 over ``env.corpus_path``, or, with ``data.source: synthetic``, BM25 over the
    synthetic world's documents, the corpus the demo's model was trained on). With no built-in tool in
    ``env.tools`` (a user's tools only) nothing searches: `build_retriever`'s empty one."""
    if not needs_retriever(cfg):
        return build_retriever(cfg, None, log=log), "no retriever (env.tools holds no built-in tool)"
    if index_dir is not None:
        if cfg.env.retriever == "http":
            raise ConfigError("--index-dir", "give --index-dir or --retriever-url, not both")
        retriever = load_or_build_bm25(cfg.env.corpus_path, index_dir, page_chars=cfg.env.page_chars, log=log)
        return retriever, f"bm25 index {index_dir}"
    if cfg.env.retriever == "http":
        return build_retriever(cfg, None, log=log), f"http {cfg.env.retriever_url}"
    if cfg.env.corpus_path:
        return build_retriever(cfg, None, log=log), f"bm25 over {cfg.env.corpus_path}"
    if cfg.data.source != "synthetic":
        raise ConfigError("env.corpus_path", "the agent needs a retriever: --corpus FILE, --index-dir DIR or "
                                             "--retriever-url URL (or data.source: synthetic for the demo's world)")
    return build_retriever(cfg, synthetic_world(cfg), log=log), "bm25 over the synthetic world's documents"


def load_agent(cfg: MempoConfig, model_dir: str, *, index_dir: Optional[str] = None, model_id: Optional[str] = None,
               log: Optional[Callable[[str], None]] = None, **service_options: Any) -> LoadedAgent:
    """The retriever first (its errors come before the slow model load), then the model directory
    (``model.dtype``; `check_model_fits`), the backend ``rollout.backend`` names (`build_backend`:
    HF on CPU, SGLang on GPU), and the service (`AgentService.from_config`, `service_options` its
    keywords). model_id: the name clients ask for (default: the directory's name). A user error is
    a `mempo.errors.MempoError`."""
    check_backend_config(cfg)
    if not os.path.isdir(model_dir):
        raise ConfigError("--model", f"{model_dir!r} is not a directory")
    retriever, source = open_retriever(cfg, index_dir=index_dir, log=log)
    try:
        model, tokenizer = load_model_dir(model_dir, cfg.model.dtype,
                                          allow_pickle_weights=cfg.model.allow_pickle_weights)
        check_model_fits(model, tokenizer, vocab_field="--model")
        backend = build_backend(cfg, model, tokenizer, model_path=model_dir)
        service = AgentService.from_config(cfg, model, tokenizer, retriever, backend, **service_options)
    except BaseException:
        close = getattr(retriever, "close", None)
        if close is not None:
            close()
        raise
    name = model_id or os.path.basename(os.path.normpath(os.path.abspath(model_dir)))
    return LoadedAgent(service, retriever, name, source)
