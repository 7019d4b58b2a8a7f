"""Model directories: a plain Hugging Face directory (``save_pretrained`` of model and tokenizer),
written whole also when the model is FSDP2-sharded under torchrun.

Conventions
-----------
* What a model directory holds: the model's ``config.json``, its weights (safetensors), the
  tokenizer's files, and ``mempo_provenance.json`` (what wrote it: the command, the base model,
  steps; `PROVENANCE_FILE`). The provenance is a record for people: no code reads it to decide
  anything, so an SFT output, a trained policy and any HF checkpoint are used the same way
  (``model.path``, ``mempo eval --model``).
* `full_state_dict(module)`: the module's full (unsharded) parameters and buffers as CPU tensors,
  names of the plain model's ``state_dict``. Under torch.distributed it is a collective: every
  rank must call it (``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` of
  ``torch.distributed.checkpoint.state_dict``); the full tensors land on rank 0 only (other ranks
  get an empty dict). Without a process group it is the module's state dict on the CPU.
* `export_model(model, tokenizer, directory)`: collective as well: all ranks gather, rank 0 writes
  the directory (``save_pretrained(state_dict=...)``), then all ranks wait at a barrier, so the
  directory is complete when any rank returns. Loading it back gives the trained parameters.
* The directory is written atomically (`mempo.utils.atomic.atomic_directory`: a temporary sibling,
  fsync, rename), so an interrupted export never leaves a half-written model where a whole one is
  expected; an existing directory of that name is replaced.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from mempo.utils.atomic import atomic_directory

__all__ = ["PROVENANCE_FILE", "full_state_dict", "save_model_dir", "export_model"]

PROVENANCE_FILE = "mempo_provenance.json"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict on the CPU, on rank 0 (module conventions; collective when distributed)."""
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


def save_model_dir(directory: Union[str, os.PathLike], model: Any, tokenizer: Any = None, *,
                   state_dict: Optional[Mapping[str, torch.Tensor]] = None,
                   provenance: Optional[Mapping[str, Any]] = None, phase: Optional[str] = None) -> Path:
    """Write a plain HF model directory (this process only; module conventions).

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


def export_model(model: Any, tokenizer: Any, directory: Union[str, os.PathLike], *,
                 provenance: Optional[Mapping[str, Any]] = None, phase: Optional[str] = None) -> Optional[Path]:
    """Write the model's full weights as a plain HF directory (module conventions; collective when
    distributed). Returns the directory on rank 0, None on other ranks."""
    weights = full_state_dict(model)
    written = None
    if not _distributed() or dist.get_rank() == 0:
        written = save_model_dir(directory, model, tokenizer, state_dict=weights, provenance=provenance, phase=phase)
    if _distributed():
        dist.barrier()
    return written
