"""Atomic training checkpoints: model, optimiser, RNG states, data position; single process or FSDP2.

Layout (``root`` is the checkpoint root, e.g. ``<out_dir>/checkpoints``)::

    root/
      latest                    text file: the directory name of the newest checkpoint + "\\n"
      step_00000050/
        model.pt                full (unsharded) model state dict, CPU tensors, FQNs of `model`
        optimizer.pt            full optimiser state dict keyed by parameter FQN (if an optimiser was given)
        state.json              {"format", "step", "world_size", "data_state", "extra"}
        rng/rank_00000.pt       per-rank RNG states (python random, numpy, torch CPU, CUDA if present)
        COMPLETE                completion marker, written last (JSON: step, world_size, time)
      .tmp-step_00000100/       a checkpoint being written (or left by a crash): always ignored

Atomicity. Everything is written into ``root/.tmp-step_N`` and fsynced (files and the directory);
the COMPLETE marker is written last; then the directory is renamed to ``step_N`` with `os.replace`
(atomic on POSIX), the root directory is fsynced, and the ``latest`` pointer is replaced atomically
(temporary file + fsync + `os.replace`). A crash at any point leaves either the previous state or the
new complete checkpoint: `latest_checkpoint` only returns directories named ``step_N`` that hold a
COMPLETE marker; temporary directories are ignored and removed by the next save.
`latest_checkpoint` prefers the pointer when it names a complete checkpoint, else the complete
checkpoint with the highest step (a crash between the rename and the pointer update).

Distributed (``torch.distributed`` initialised, e.g. FSDP2 models): every rank must call
`save_checkpoint` / `load_checkpoint` (the state dicts are gathered / scattered collectively with
`torch.distributed.checkpoint.state_dict` helpers, full state dicts with CPU offload). Rank 0 writes
the model, optimiser and state files; each rank writes its own RNG file; rank 0 renames and updates
the pointer; barriers order the steps. On load, rank 0 reads the files and the values are broadcast
(`broadcast_from_rank0`), so the checkpoint loads at any world size, including into a plain
single-process model (the FQNs are those of the module passed in: pass the Hugging Face model
itself, not a wrapper). The full state dict must fit in rank 0's CPU memory.

Resuming (the RL trainer and SFT alike): `resume_checkpoint(mode, root)` maps a ``trainer.resume``
value ("auto", "never" or a path) to the checkpoint to load; `checkpoint_step` reads its step (e.g.
to cut the metrics file back before loading).

RNG: `capture_rng_state` / `restore_rng_state`. A rank whose RNG file is missing (the world size
changed) keeps its current RNG state (a warning is issued).

data_state and extra must be JSON-serialisable (they are stored in state.json). Files are loaded
with ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch

__all__ = [
    "CheckpointState", "capture_rng_state", "restore_rng_state", "checkpoint_dir", "list_checkpoints",
    "latest_checkpoint", "resolve_checkpoint", "resume_checkpoint", "checkpoint_step", "save_checkpoint",
    "load_checkpoint", "prune_checkpoints",
    "model_state_dict", "optimizer_state_dict", "load_model_state", "load_optimizer_state",
]

PathLike = Union[str, os.PathLike]
CHECKPOINT_FORMAT = 1
COMPLETE_MARKER = "COMPLETE"
LATEST_FILE = "latest"
TEMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"^step_(\d{8,})$")


@dataclass
class CheckpointState:
    """What `load_checkpoint` returns: the checkpoint directory, its step, the caller's data_state and
    extra (as saved), and this rank's RNG state (None when it had no RNG file)."""

    path: Path
    step: int
    data_state: Any
    extra: Any
    rng_state: Optional[dict]


# ------------------------------------------------------------------------------------------------
# RNG
# ------------------------------------------------------------------------------------------------
def capture_rng_state() -> dict:
    """The RNG states of python `random`, numpy's global RNG, torch CPU and (if present) every CUDA
    device, as a dict of plain types and tensors (loadable with weights_only=True)."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]), int(np_state[3]),
                  float(np_state[4])),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Apply a state from `capture_rng_state` (CUDA states only when CUDA is available)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.int64).astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------------------------
# distributed helpers
# ------------------------------------------------------------------------------------------------
def _dist_active() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _rank() -> int:
    return torch.distributed.get_rank() if _dist_active() else 0


def _world_size() -> int:
    return torch.distributed.get_world_size() if _dist_active() else 1


def _barrier() -> None:
    if _dist_active():
        torch.distributed.barrier()


def _all_ranks_ok(ok: bool) -> bool:
    """True when `ok` holds on every rank (an all-reduce of a flag; the local value when not distributed)."""
    if not _dist_active():
        return ok
    device = torch.device("cpu")
    if torch.distributed.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


def _full_options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full model state dict on CPU. Collective when distributed: rank 0 gets it, other ranks {}."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options(cpu_offload=True))


def optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Full optimiser state dict keyed by parameter FQN, on CPU (collective; rank 0 only when distributed)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True))


def load_model_state(model: torch.nn.Module, state: dict, strict: bool = True) -> None:
    """Load a full state dict into a plain or FSDP2-sharded model (collective when distributed; only
    rank 0's `state` is read, other ranks may pass {})."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    options = _full_options(broadcast_from_rank0=_dist_active(), strict=strict)
    set_model_state_dict(model, state, options=options)


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a full FQN-keyed optimiser state dict (collective when distributed; rank 0's is read)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=_full_options(broadcast_from_rank0=_dist_active()))


# ------------------------------------------------------------------------------------------------
# file system helpers
# ------------------------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_bytes_durably(path: Path, write) -> None:
    with open(path, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())


def _torch_save(obj: Any, path: Path) -> None:
    _write_bytes_durably(path, lambda handle: torch.save(obj, handle))


def _json_save(obj: Any, path: Path) -> None:
    data = json.dumps(obj, indent=1, sort_keys=True).encode("utf-8")
    _write_bytes_durably(path, lambda handle: handle.write(data))


def _replace_file_atomically(path: Path, text: str) -> None:
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}.{os.getpid()}")
    _write_bytes_durably(temp, lambda handle: handle.write(text.encode("utf-8")))
    os.replace(temp, path)
    _fsync_dir(path.parent)


def checkpoint_dir(root: PathLike, step: int) -> Path:
    """``root/step_{step:08d}``."""
    return Path(root) / f"step_{int(step):08d}"


def _is_complete(path: Path) -> bool:
    return _STEP_DIR.match(path.name) is not None and (path / COMPLETE_MARKER).is_file()


def list_checkpoints(root: PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root` as (step, path), ascending by step (temp dirs ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and entry.is_dir() and _is_complete(entry):
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(root: PathLike) -> Optional[Path]:
    """The newest complete checkpoint under `root` (the pointer's if it names a complete one), or None."""
    root = Path(root)
    pointer = root / LATEST_FILE
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8").strip()
        candidate = root / name
        if name and "/" not in name and candidate.is_dir() and _is_complete(candidate):
            return candidate
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def resolve_checkpoint(path: PathLike) -> Path:
    """A checkpoint directory itself, or the latest complete checkpoint under a root; FileNotFoundError."""
    path = Path(path)
    if _is_complete(path):
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise FileNotFoundError(f"no complete checkpoint at or under {path}")
    return latest


def resume_checkpoint(mode: str, root: PathLike) -> Optional[Path]:
    """The checkpoint a run resumes from, by a ``trainer.resume`` value: ``"auto"`` (the latest
    complete checkpoint under `root`, None when there is none), ``"never"`` (None) or a checkpoint
    directory / root (`resolve_checkpoint`: FileNotFoundError when nothing complete is there)."""
    mode = mode.strip()
    if mode == "never":
        return None
    if mode == "auto":
        return latest_checkpoint(root)
    return resolve_checkpoint(mode)


def checkpoint_step(path: PathLike) -> int:
    """The step of a checkpoint (a ``step_N`` directory or a root: its latest), read from state.json."""
    path = resolve_checkpoint(path)
    return int(json.loads((path / "state.json").read_text(encoding="utf-8"))["step"])


def prune_checkpoints(root: PathLike, keep_last: Optional[int]) -> list[Path]:
    """Delete all but the `keep_last` newest complete checkpoints, and all temporary entries.

    Returns the removed paths. keep_last None: keep every checkpoint (temp dirs are still removed).
    Call it only when no checkpoint is being written (`save_checkpoint` does, on rank 0).
    """
    root = Path(root)
    removed = []
    if keep_last is not None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
        pointed = latest_checkpoint(root)
        for _, path in list_checkpoints(root)[:-keep_last]:
            if path != pointed:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    for entry in sorted(root.iterdir()) if root.is_dir() else ():
        if entry.name.startswith(TEMP_PREFIX):  # unpublished checkpoints and pointer files of crashed saves
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


# ------------------------------------------------------------------------------------------------
# save / load
# ------------------------------------------------------------------------------------------------
def _write_payload(temp: Path, step: int, model_state: Optional[dict], optim_state: Optional[dict],
                   data_state: Any, extra: Any) -> None:
    """Rank 0's files (everything except the RNG files and the marker)."""
    if model_state is not None:
        _torch_save(model_state, temp / "model.pt")
    if optim_state is not None:
        _torch_save(optim_state, temp / "optimizer.pt")
    _json_save({"format": CHECKPOINT_FORMAT, "step": int(step), "world_size": _world_size(),
                "data_state": data_state, "extra": extra}, temp / "state.json")


def _publish(root: Path, temp: Path, final: Path, step: int) -> None:
    """Rank 0: marker, rename into place, pointer update (each step durable before the next)."""
    _json_save({"step": int(step), "world_size": _world_size(), "time": time.time()}, temp / COMPLETE_MARKER)
    _fsync_dir(temp / "rng")
    _fsync_dir(temp)
    if final.exists():
        stale = root / f"{TEMP_PREFIX}replaced-{final.name}"
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(final, stale)
    os.replace(temp, final)
    _fsync_dir(root)
    _replace_file_atomically(root / LATEST_FILE, final.name + "\n")


def save_checkpoint(root: PathLike, step: int, model: Optional[torch.nn.Module] = None,
                    optimizer: Optional[torch.optim.Optimizer] = None, rng_states: Optional[dict] = None,
                    data_state: Any = None, extra: Any = None, keep_last: Optional[int] = None) -> Path:
    """Write checkpoint `step` under `root` atomically (module docstring) and return its directory.

    model: plain or FSDP2-sharded module (its FQNs are stored); optimizer: needs `model`.
    rng_states: this rank's `capture_rng_state()` (None: captured now). data_state / extra: JSON
    values. keep_last: prune to the newest K complete checkpoints afterwards (None: keep all).
    Collective when torch.distributed is initialised: call it on every rank.
    """
    if optimizer is not None and model is None:
        raise ValueError("saving an optimizer needs its model (parameter names come from the model)")
    root = Path(root)
    step = int(step)
    rank = _rank()
    rng_states = capture_rng_state() if rng_states is None else rng_states
    model_state = model_state_dict(model) if model is not None else None
    optim_state = optimizer_state_dict(model, optimizer) if optimizer is not None else None
    final = checkpoint_dir(root, step)
    temp = root / f"{TEMP_PREFIX}{final.name}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(temp, ignore_errors=True)
        (temp / "rng").mkdir(parents=True)
    _barrier()
    error: Optional[BaseException] = None
    try:
        if rank == 0:
            _write_payload(temp, step, model_state, optim_state, data_state, extra)
        _torch_save(rng_states, temp / "rng" / f"rank_{rank:05d}.pt")
    except Exception as caught:  # every rank must reach the agreement below, then all raise
        error = caught
    if not _all_ranks_ok(error is None):
        if error is not None:
            raise error
        raise RuntimeError(f"checkpoint step {step}: another rank failed while writing; not published")
    if rank == 0:
        _publish(root, temp, final, step)
        prune_checkpoints(root, keep_last)
    _barrier()
    return final


def _load_rng(path: Path, rank: int) -> Optional[dict]:
    rng_file = path / "rng" / f"rank_{rank:05d}.pt"
    if not rng_file.is_file():
        warnings.warn(f"{path}: no RNG state for rank {rank} (saved with another world size?); "
                      f"keeping the current RNG state", RuntimeWarning, stacklevel=3)
        return None
    return torch.load(rng_file, weights_only=True)


def load_checkpoint(path: PathLike, model: Optional[torch.nn.Module] = None,
                    optimizer: Optional[torch.optim.Optimizer] = None, *, restore_rng: bool = True,
                    strict: bool = True) -> CheckpointState:
    """Restore a checkpoint (a ``step_N`` directory or a root: its latest) into `model` / `optimizer`.

    Applies this rank's RNG state when `restore_rng`. strict: every model key must match. Collective
    when torch.distributed is initialised (rank 0 reads model/optimiser files and broadcasts).
    Returns a CheckpointState. FileNotFoundError when nothing complete is found.
    """
    path = resolve_checkpoint(path)
    rank = _rank()
    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    if model is not None:
        model_file = path / "model.pt"
        if not model_file.is_file():
            raise FileNotFoundError(f"{path} holds no model state (model.pt)")
        full = torch.load(model_file, weights_only=True, mmap=True) if rank == 0 else {}
        load_model_state(model, full, strict=strict)
        del full
    if optimizer is not None:
        if model is None:
            raise ValueError("loading an optimizer needs its model (parameter names come from the model)")
        optim_file = path / "optimizer.pt"
        if not optim_file.is_file():
            raise FileNotFoundError(f"{path} holds no optimizer state (optimizer.pt)")
        full_optim = torch.load(optim_file, weights_only=True) if rank == 0 else {}
        load_optimizer_state(model, optimizer, full_optim)
    rng_state = _load_rng(path, rank)
    if restore_rng and rng_state is not None:
        restore_rng_state(rng_state)
    _barrier()
    return CheckpointState(path=path, step=int(state["step"]), data_state=state.get("data_state"),
                           extra=state.get("extra"), rng_state=rng_state)
