"""The one place a generation backend is built from the configuration (training and `mempo eval`).

``rollout.backend`` chooses, and nothing else does:

* ``"hf"``: `HFBackend` over the given model object (the trainer's, or an unsharded copy under
  torchrun), with the given logits processors (the opt-in
  `mempo.rollout.backends.scaffold.ProtocolScaffold`).
* ``"sglang"`` with ``rollout.sglang_url`` null: `SGLangBackend`, an ``sglang.Engine`` in this
  process, colocated with the trainer on this rank's GPU (``base_gpu_id`` = LOCAL_RANK), loading
  `model_path` (``rollout.dtype``, else ``actor.param_dtype``, else ``model.dtype``,
  ``mem_fraction_static = rollout.sglang_mem_fraction``, ``enable_memory_saver=True`` so its
  memory is released around the trainer's stages, ``random_seed = rollout.seed``). The sglang
  package must be installed: otherwise a ConfigError naming ``rollout.backend`` at once.
* ``"sglang"`` with ``rollout.sglang_url`` set: `SGLangServerBackend` (HTTP); a ConfigError naming
  ``rollout.sglang_url`` when no server answers there. When `model_path` is a local directory the
  server is told to load it first, so it serves exactly the model in question; weight versions are
  written under `weights_dir` as HF checkpoints, streamed one safetensors file at a time
  (`mempo.model.export.save_streamed_model_dir`).

Logits processors need HF generation: asking for them with SGLang is a ConfigError naming
``rollout.protocol_scaffold`` (the config also refuses that pair).

`hf_backend` builds the ``"hf"`` backend over a model object whatever ``rollout.backend`` says:
what `mempo.eval.evaluate` generates with when its caller passes no backend.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Sequence, Union

from mempo.config import ConfigError
from mempo.model.export import save_streamed_model_dir
from mempo.rollout.backends.base import GenerationBackend
from mempo.rollout.backends.hf import HFBackend
from mempo.rollout.backends.sglang import SGLangBackend, SGLangError, SGLangServerBackend

__all__ = ["build_backend", "check_backend_config", "hf_backend", "sglang_installed"]


def sglang_installed() -> bool:
    """True when the sglang package can be imported here (it is not imported)."""
    return importlib.util.find_spec("sglang") is not None


def check_backend_config(cfg: Any, *, logits_processors: Sequence[Any] = ()) -> None:
    """The checks of `build_backend` that need no model, so a command can run them before its slow
    work: logits processors need ``"hf"`` (ConfigError naming ``rollout.protocol_scaffold``); an
    in-process ``"sglang"`` needs the sglang package (ConfigError naming ``rollout.backend``)."""
    r = cfg.rollout
    if r.backend == "hf":
        return
    if logits_processors:
        raise ConfigError("rollout.protocol_scaffold", "needs rollout.backend 'hf' (logits processors run inside "
                                                       "transformers generate)")
    if not r.sglang_url and not sglang_installed():
        raise ConfigError("rollout.backend", "'sglang' needs the sglang package (its own environment on a GPU "
                                             "machine: pip install '.[sglang]', docs/TRAINING.md \"GPU\"), which is "
                                             "not installed here; use 'hf', or an SGLang server via rollout.sglang_url")


def hf_backend(model: Any, tokenizer: Any, *, logits_processors: Sequence[Any] = ()) -> GenerationBackend:
    """`HFBackend` generating with the model object `model` (transformers ``generate``)."""
    return HFBackend(model, tokenizer, logits_processors=logits_processors)


def build_backend(cfg: Any, model: Any, tokenizer: Any, *, model_path: Union[str, os.PathLike, None] = None,
                  logits_processors: Sequence[Any] = (), weights_dir: Union[str, os.PathLike, None] = None
                  ) -> GenerationBackend:
    """The backend ``rollout.backend`` asks for: ``"hf"``: `HFBackend` on `model`; ``"sglang"``:
    `SGLangBackend` in this process, or `SGLangServerBackend` when ``rollout.sglang_url`` is set.

    model: the HF model the ``"hf"`` backend generates with (and the server backend saves weight
    versions through). model_path: the checkpoint SGLang loads (a directory or hub id; None or
    ``"builtin-tiny"``: there is none). weights_dir: where a server backend writes weight versions.
    """
    r = cfg.rollout
    check_backend_config(cfg, logits_processors=logits_processors)
    if r.backend == "hf":
        return hf_backend(model, tokenizer, logits_processors=logits_processors)
    path = None if model_path in (None, "builtin-tiny") else str(model_path)
    if r.sglang_url:
        def save_weights(weights, directory: Path) -> None:  # one file at a time: never the whole state
            save_streamed_model_dir(directory, model, weights, tokenizer)

        local = path if path is not None and Path(path).is_dir() else None
        try:
            return SGLangServerBackend(r.sglang_url, tokenizer, save_weights=save_weights,
                                       weights_dir=weights_dir, model_dir=local)
        except SGLangError as error:
            raise ConfigError("rollout.sglang_url", str(error)) from None
    if path is None:
        raise ConfigError("model.path", "the in-process SGLang engine loads a model directory or hub id; "
                                        f"got {model_path!r} (save the model with save_pretrained first)")
    dtype = r.dtype or cfg.actor.param_dtype or cfg.model.dtype  # the generation copy: half precision by default
    kwargs = dict(dtype=dtype, mem_fraction_static=r.sglang_mem_fraction, enable_memory_saver=True,
                  base_gpu_id=int(os.environ.get("LOCAL_RANK", "0")), random_seed=int(r.seed))
    return SGLangBackend(path, tokenizer, engine_kwargs=kwargs, release_memory=True)
