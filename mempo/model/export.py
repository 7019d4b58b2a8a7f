"""Model directories: a plain Hugging Face directory (``save_pretrained`` of model and tokenizer),
written whole also when the model is FSDP2-sharded under torchrun.

A model directory holds the model's ``config.json``, its weights (safetensors), the tokenizer's
files and ``mempo_provenance.json`` (`PROVENANCE_FILE`: the command, the base model, steps). The
provenance is a record for people: no code reads it, so an SFT output, a trained policy and any HF
checkpoint are used the same way (``model.path``, ``mempo eval --model``).
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from mempo.utils.atomic import atomic_directory
from mempo.utils.types import PathLike

__all__ = ["PROVENANCE_FILE", "STREAMED_FILE_BYTES", "full_state_dict", "save_model_dir", "save_streamed_model_dir",
           "export_model", "safetensors_names", "write_safetensors_index"]

PROVENANCE_FILE = "mempo_provenance.json"
STREAMED_FILE_BYTES = 1 << 30  # one safetensors file of `save_streamed_model_dir` (the most it holds at once)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's full (unsharded) parameters and buffers as CPU tensors, named as in the plain
    model's ``state_dict``. Collective under torch.distributed (every rank must call it;
    ``get_model_state_dict(full_state_dict=True, cpu_offload=True)``): the tensors land on rank 0,
    other ranks get an empty dict."""
    if not _distributed():
        return {name: tensor.detach().cpu() for name, tensor in module.state_dict().items()}
    full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    full = {name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu() for name, t in full.items()}
    # tied parameters (one Parameter under several names) come back as separate copies: alias them
    # again, so save_pretrained drops the tied duplicate as it does for an unsharded model
    names_of: dict[int, list[str]] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(parameter), []).append(name)
    for names in names_of.values():
        present = [n for n in names if n in full]
        for name in present[1:]:
            full[name] = full[present[0]]
    return full


def save_model_dir(directory: PathLike, model: Any, tokenizer: Any = None, *,
                   state_dict: Optional[Mapping[str, torch.Tensor]] = None,
                   provenance: Optional[Mapping[str, Any]] = None, phase: Optional[str] = None) -> Path:
    """Write a plain HF model directory (this process only; ``save_pretrained(state_dict=...)``).

    Written atomically (`mempo.utils.atomic.atomic_directory`: a temporary sibling, fsync, rename),
    so an interrupted export never leaves a half-written model; an existing directory is replaced
    only when it is empty or mempo wrote it (its ``.mempo-written`` marker lists everything in it),
    else `mempo.utils.atomic.OutputPathError`, as for a file there.

    state_dict: the weights to write (default: the model's own); provenance: recorded in
    `PROVENANCE_FILE` (JSON-serialisable values); phase: the `mempo.utils.atomic.fault_point` reached
    before the rename (fault-injection tests)."""
    path = Path(directory)
    with atomic_directory(path, phase=phase) as staging:
        model.save_pretrained(staging, state_dict=dict(state_dict) if state_dict is not None else None)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if provenance is not None:
            (staging / PROVENANCE_FILE).write_text(
                json.dumps(dict(provenance), indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    return path


def safetensors_names(count: int) -> list[str]:
    """``save_pretrained``'s weight file names for `count` files: ``model.safetensors`` alone, else
    ``model-0000i-of-0000n.safetensors``."""
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_safetensors_index(directory: Path, total_size: int, weight_map: Mapping[str, str]) -> None:
    """``model.safetensors.index.json`` (``{"metadata": {"total_size"}, "weight_map"}``) of a
    directory of several weight files."""
    index = {"metadata": {"total_size": int(total_size)}, "weight_map": dict(weight_map)}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def save_streamed_model_dir(directory: PathLike, model: Any, weights: Iterable[tuple[str, torch.Tensor]],
                            tokenizer: Any = None, *, max_file_bytes: int = STREAMED_FILE_BYTES,
                            phase: Optional[str] = None) -> Path:
    """Write a plain HF model directory from a stream of ``(name, whole tensor)`` (this process only;
    e.g. `mempo.train.step.streamed_weights`, flattened), one safetensors file at a time: a file is
    written as soon as its tensors reach `max_file_bytes` (a larger tensor alone), so at most one
    file's tensors are held, never the whole model. Consumes the whole stream (collective streams
    stay in step on every rank). model: gives ``config.json`` (its dtype set to the tensors'); a
    tied output head (``lm_head.weight`` with ``tie_word_embeddings``) is not written, as
    ``save_pretrained`` does. Layout and atomicity as `save_model_dir` (``model.safetensors``, or
    ``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``)."""
    config = copy.deepcopy(model.config)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    path = Path(directory)
    with atomic_directory(path, phase=phase) as staging:
        parts: list[list[str]] = []
        batch: dict[str, torch.Tensor] = {}
        held, total, dtype = 0, 0, None

        def write_part() -> None:
            nonlocal batch, held
            save_file(batch, str(staging / f"part-{len(parts):05d}"), metadata={"format": "pt"})
            parts.append(list(batch))
            batch, held = {}, 0

        for name, tensor in weights:
            if tied and name == "lm_head.weight":
                continue
            size = tensor.numel() * tensor.element_size()
            if batch and held + size > max_file_bytes:
                write_part()
            batch[name] = tensor.detach().to("cpu").contiguous().clone()  # safetensors refuses shared storage
            held, total = held + size, total + size
            dtype = dtype or (tensor.dtype if tensor.is_floating_point() else None)
        if batch or not parts:
            write_part()
        names = safetensors_names(len(parts))
        for index, name in enumerate(names):
            os.replace(staging / f"part-{index:05d}", staging / name)
        if len(parts) > 1:
            write_safetensors_index(staging, total, {key: name for name, keys in zip(names, parts) for key in keys})
        if dtype is not None:
            config.dtype = dtype  # what from_pretrained(dtype="auto") loads as
        config.save_pretrained(staging)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
    return path


def export_model(model: Any, tokenizer: Any, directory: PathLike, *,
                 provenance: Optional[Mapping[str, Any]] = None, phase: Optional[str] = None) -> Optional[Path]:
    """Write the model's full weights as a plain HF directory (`save_model_dir`). Collective when
    distributed: all ranks gather, rank 0 writes, all wait at a barrier, so the directory is
    complete when any rank returns. Returns the directory on rank 0, None on other ranks."""
    weights = full_state_dict(model)
    written = None
    if not _distributed() or dist.get_rank() == 0:
        written = save_model_dir(directory, model, tokenizer, state_dict=weights, provenance=provenance, phase=phase)
    if _distributed():
        dist.barrier()
    return written
