"""Full (unsharded) state dicts: the helpers `mempo.train.actor.Actor.state_dict` uses, and the
model.pt / optimizer.pt files of checkpoint formats 1 and 2 (written before checkpoints were
sharded; read only, so older runs still resume). Every function that touches a model is collective
when torch.distributed is initialised: rank 0 holds the full state, the others receive it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
)

from mempo.train.sharded import CheckpointError, check_state_layouts, dist_active, name_keys, param_names, short_error
from mempo.utils.files import plain_text, refused_global

__all__ = ["model_state_dict", "optimizer_state_dict", "load_model_state", "load_optimizer_state",
           "LEGACY_MODEL_FILE", "LEGACY_OPTIMIZER_FILE", "is_legacy_checkpoint", "check_full_state_files",
           "load_full_state_files", "torch_load"]

LEGACY_MODEL_FILE = "model.pt"
LEGACY_OPTIMIZER_FILE = "optimizer.pt"


def _full_options(**kwargs):
    return StateDictOptions(full_state_dict=True, **kwargs)


def model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full model state dict on CPU. Collective when distributed: rank 0 gets it, other ranks {}."""
    return get_model_state_dict(model, options=_full_options(cpu_offload=True))


def optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Full optimiser state dict keyed by parameter FQN, on CPU (collective; rank 0 only when distributed)."""
    return get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True))


def load_model_state(model: torch.nn.Module, state: dict, strict: bool = True) -> None:
    """Load a full state dict into a plain or FSDP2-sharded model (collective when distributed; only
    rank 0's `state` is read, other ranks may pass {})."""
    options = _full_options(broadcast_from_rank0=dist_active(), strict=strict)
    set_model_state_dict(model, state, options=options)


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a full FQN-keyed optimiser state dict (collective when distributed; rank 0's is read)."""
    set_optimizer_state_dict(model, optimizer, state, options=_full_options(broadcast_from_rank0=dist_active()))


def torch_load(file: Path, what: str, **kwargs) -> Any:
    """`torch.load(weights_only=True)` of a checkpoint file (torch's restricted unpickler: tensors
    and plain containers, nothing a pickle could run); CheckpointError naming it, and naming the
    global when the file asks for one that loader does not admit."""
    if not file.is_file():
        raise CheckpointError(f"{file}: missing ({what})")
    try:
        return torch.load(file, weights_only=True, **kwargs)
    except Exception as error:  # torch's messages name no file
        refused = refused_global(error)
        if refused:
            raise CheckpointError(f"{file}: cannot be loaded (UnpicklingError: it names {refused}, which torch's "
                                  f"weights-only loader refuses: a checkpoint file is read as data, never "
                                  f"run)") from None
        raise CheckpointError(f"{file}: cannot be loaded ({type(error).__name__}: {plain_text(error)})") from None


def _check_model_keys(file: Path, saved: Any, model: torch.nn.Module) -> None:
    if not isinstance(saved, dict):
        raise CheckpointError(f"{file}: damaged (not a state dict: {type(saved).__name__})")
    expected = set(model.state_dict().keys())
    missing, unexpected = expected - set(saved), set(saved) - expected
    if missing or unexpected:
        said = [f"missing key(s) {name_keys(list(missing))}"] if missing else []
        said += [f"unexpected key(s) {name_keys(list(unexpected))}"] if unexpected else []
        raise CheckpointError(f"{file}: does not fit this model ({'; '.join(said)})")


def _check_optimizer_keys(file: Path, saved: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The saved full optimiser state names every parameter of `optimizer` once (by any of its FQNs),
    no other; the states of parameters of one dimensionality all hold the same entries (e.g. step,
    exp_avg, exp_avg_sq)."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    states = saved.get("state") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or not isinstance(states, dict) or not all(
            isinstance(group, dict) and isinstance(group.get("params"), list) for group in groups):
        raise CheckpointError(f"{file}: damaged (not an optimizer state dict with 'state' and 'param_groups')")
    names = param_names(model)
    owner = {name: index for index, fqns in names.items() for name in fqns}
    listed = [name for group in groups for name in group["params"]]
    unexpected = [str(name) for name in listed if name not in owner]
    unexpected += [str(name) for name in states if name not in owner]
    covered = {owner[name] for name in listed if name in owner}
    missing = [min(names[id(p)]) for group in optimizer.param_groups for p in group["params"]
               if id(p) in names and id(p) not in covered]
    if len(groups) != len(optimizer.param_groups):
        raise CheckpointError(f"{file}: does not fit this optimizer ({len(groups)} parameter group(s), "
                              f"the optimizer has {len(optimizer.param_groups)})")
    if missing or unexpected:
        said = [f"missing parameter(s) {name_keys(missing)}"] if missing else []
        said += [f"unexpected key(s) {name_keys(sorted(set(unexpected)))}"] if unexpected else []
        raise CheckpointError(f"{file}: does not fit this optimizer ({'; '.join(said)})")
    check_state_layouts(file, model, {name: set(entry) if isinstance(entry, dict) else set()
                                      for name, entry in states.items()})


def is_legacy_checkpoint(path: Path) -> bool:
    """Whether a checkpoint directory holds format-1/2 full-state files (model.pt / optimizer.pt)."""
    return (path / LEGACY_MODEL_FILE).is_file() or (path / LEGACY_OPTIMIZER_FILE).is_file()


def check_full_state_files(path: Path, model, optimizer, *, model_keys: bool = True) -> None:
    """`mempo.train.checkpoint.check_fits` for a format-1/2 checkpoint: model.pt holds exactly
    `model`'s keys (when `model_keys`), optimizer.pt names exactly `optimizer`'s parameters."""
    if model is not None and model_keys:
        file = path / LEGACY_MODEL_FILE
        _check_model_keys(file, torch_load(file, "model state", mmap=True), model)
    if optimizer is not None:
        file = path / LEGACY_OPTIMIZER_FILE
        _check_optimizer_keys(file, torch_load(file, "optimizer state", mmap=True), model, optimizer)


def load_full_state_files(path: Path, model, optimizer, *, strict: bool = True) -> None:
    """Load a format-1/2 checkpoint's model.pt / optimizer.pt (rank 0 reads, broadcasts; collective)."""
    rank = dist.get_rank() if dist_active() else 0
    if model is not None:
        model_file = path / LEGACY_MODEL_FILE
        full = torch_load(model_file, "model state", mmap=True) if rank == 0 else {}
        try:
            load_model_state(model, full, strict=strict)
        except (RuntimeError, KeyError, ValueError) as error:
            raise CheckpointError(f"{model_file}: does not fit this model ({short_error(error)})") from None
        del full
    if optimizer is not None:
        optim_file = path / LEGACY_OPTIMIZER_FILE
        full_optim = torch_load(optim_file, "optimizer state") if rank == 0 else {}
        try:
            load_optimizer_state(model, optimizer, full_optim)
        except (RuntimeError, KeyError, ValueError) as error:
            raise CheckpointError(f"{optim_file}: does not fit this optimizer ({short_error(error)})") from None
