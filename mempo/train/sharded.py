"""Model and optimiser state as torch.distributed.checkpoint (DCP) directories: every rank writes
and reads only its own shards, nothing is gathered on one rank, and a directory written by N ranks
loads on M ranks (or into a plain single-process model) because DCP records each tensor's global
shape and the chunks each file holds.

A directory (``<checkpoint>/model`` or ``<checkpoint>/optimizer``) holds ``.metadata`` (DCP's
pickled index: for each key its global shape, dtype and chunks; written by rank 0) and one
``__<rank>_0.distcp`` per rank that had something to write. Keys: the model's state-dict FQNs
(``get_model_state_dict``); the optimiser's flattened FQN keys (``state.<fqn>.<entry>`` tensors,
``param_groups.<fqn>.<hyperparameter>`` values; ``flatten_optimizer_state_dict``), which reshard
like the parameters (Adam's moments are DTensors shaped as their parameter).

DCP writes no checksums: `mempo.train.checkpoint` records a SHA-256 of every file in its manifest,
each rank hashing the files it wrote (`owner_rank`).
"""
from __future__ import annotations

import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
)

from mempo.errors import MempoError
from mempo.utils.types import PathLike

__all__ = ["CheckpointError", "TensorSpec", "METADATA_FILE", "save_model_shards", "save_optimizer_shards",
           "snapshot_model_state", "snapshot_optimizer_state", "write_state",
           "load_model_shards", "load_optimizer_shards", "check_model_shards", "check_optimizer_shards",
           "tensor_specs", "read_tensors", "owner_rank", "rank_shard_files", "dist_active", "short_error",
           "name_keys", "param_names"]

METADATA_FILE = ".metadata"
_SHARD_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")
_OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class CheckpointError(MempoError):
    """A checkpoint that cannot be used: missing, incomplete, damaged or unloadable; the message
    names the checkpoint file and what is wrong with it."""


@dataclass(frozen=True)
class TensorSpec:
    """A saved tensor's global shape and dtype (from ``.metadata``)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def dist_active() -> bool:
    """Whether torch.distributed is initialised (the checkpoint modules' collectives run)."""
    return dist.is_available() and dist.is_initialized()


def short_error(error: BaseException) -> str:
    """``Type: message`` on one line, at most 300 characters of message, for an error message."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


def _quiet_single_process():
    """DCP warns on every single-process save/load that it "assumes the intent"; here it is the intent."""
    context = warnings.catch_warnings()
    context.__enter__()
    warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process.*")
    return context


def _save(state: dict[str, Any], directory: Path, process_group: Optional[dist.ProcessGroup] = None) -> None:
    writer = FileSystemWriter(directory, single_file_per_rank=True, sync_files=True, thread_count=1)
    context = _quiet_single_process()
    try:
        dcp.save(state, storage_writer=writer, process_group=process_group, no_dist=not dist_active())
    except CheckpointException as error:  # a BaseException: make it an ordinary one naming the directory
        raise OSError(f"{directory}: writing the shards failed ({short_error(error)})") from None
    finally:
        context.__exit__(None, None, None)


def _load(state: dict[str, Any], directory: Path, *, no_dist: bool = False) -> None:
    context = _quiet_single_process()
    try:
        dcp.load(state, storage_reader=FileSystemReader(directory), no_dist=no_dist or not dist_active())
    except CheckpointException as error:
        raise CheckpointError(f"{directory}: cannot be loaded ({short_error(error)})") from None
    finally:
        context.__exit__(None, None, None)


# ------------------------------------------------------------------------------------------------
# save
# ------------------------------------------------------------------------------------------------
def save_model_shards(directory: PathLike, model: torch.nn.Module) -> None:
    """Write `model`'s state (plain or FSDP2-sharded) to `directory` in DCP form. Collective when
    distributed: each rank writes its local shards (``__<rank>_0.distcp``), rank 0 ``.metadata``.
    Peak memory beyond the model: DCP's copy-ahead buffer (10 MB per rank on GPU; none on CPU)."""
    _save(get_model_state_dict(model), Path(directory))


def save_optimizer_shards(directory: PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write `optimizer`'s state, flattened and keyed by parameter FQN, to `directory` (collective).
    An optimiser that has not stepped yet is initialised first by torch (a zero-gradient step at
    lr 0, ``get_optimizer_state_dict``), as the unsharded format did."""
    _save(get_optimizer_state_dict(model, optimizer, options=_OPTIM_OPTIONS), Path(directory))


def _snapshot(state: dict[str, Any]) -> dict[str, Any]:
    # DCP's blocking stager: new CPU storages for every tensor (DTensors keep their placements),
    # so updates after the snapshot do not reach the files written from it
    return BlockingAsyncStager(cache_staged_state_dict=False, type_check=False).stage(state)


def snapshot_model_state(model: torch.nn.Module) -> dict[str, Any]:
    """This rank's shards of `model`'s state, copied to CPU memory (the bytes of its shards, host
    memory on a GPU), for `write_state` to write while training goes on. Not collective."""
    return _snapshot(get_model_state_dict(model))


def snapshot_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """As `snapshot_model_state` for `optimizer`'s flattened state (`save_optimizer_shards`' keys)."""
    return _snapshot(get_optimizer_state_dict(model, optimizer, options=_OPTIM_OPTIONS))


def write_state(directory: PathLike, state: dict[str, Any], process_group: Optional[dist.ProcessGroup] = None) -> None:
    """Write a snapshot (`snapshot_model_state` / `snapshot_optimizer_state`) to `directory` in DCP
    form; collective over `process_group` (None: the default group) when distributed. From a
    background thread, give a group the training's collectives do not use (a second gloo group),
    or the two threads' collectives interleave."""
    _save(state, Path(directory), process_group)


def owner_rank(relative: str) -> int:
    """The rank that wrote (and hashes) a checkpoint file, by its path relative to the checkpoint:
    ``<dir>/__<r>_<i>.distcp`` and ``rng/rank_<r>.pt`` belong to rank r, everything else to rank 0."""
    name = relative.rsplit("/", 1)[-1]
    match = _SHARD_FILE.match(name)
    if match:
        return int(match.group(1))
    rng = re.match(r"^rank_(\d+)\.pt$", name)
    return int(rng.group(1)) if rng and relative.startswith("rng/") else 0


def rank_shard_files(directory: PathLike, rank: int) -> list[Path]:
    """The shard files rank `rank` wrote in a DCP directory (sorted)."""
    return sorted(p for p in Path(directory).iterdir() if _SHARD_FILE.match(p.name) and owner_rank(p.name) == rank)


# ------------------------------------------------------------------------------------------------
# metadata: keys and shapes, read without loading any tensor
# ------------------------------------------------------------------------------------------------
def _metadata(directory: Path, what: str) -> Metadata:
    file = directory / METADATA_FILE
    if not file.is_file():
        raise CheckpointError(f"{file}: missing ({what})")
    try:
        with open(file, "rb") as handle:
            metadata = pickle.load(handle)  # DCP's own format (FileSystemReader.read_metadata unpickles too)
    except Exception as error:  # a torn or foreign file: name it
        raise CheckpointError(f"{file}: cannot be loaded ({short_error(error)})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise CheckpointError(f"{file}: damaged (not a torch.distributed.checkpoint index)")
    return metadata


def tensor_specs(directory: PathLike) -> dict[str, TensorSpec]:
    """{key: TensorSpec} of every tensor saved in a DCP directory (non-tensor values left out);
    CheckpointError naming ``.metadata`` when it is missing or unreadable."""
    metadata = _metadata(Path(directory), "shard index")
    return {key: TensorSpec(tuple(entry.size), entry.properties.dtype)
            for key, entry in metadata.state_dict_metadata.items() if isinstance(entry, TensorStorageMetadata)}


def name_keys(keys: Iterable[str], limit: int = 8) -> str:
    """The first `limit` of `keys` in sorted order, and how many more, for an error message."""
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")

def check_state_layouts(file: Any, model: Any, layouts: dict[str, set[str]]) -> None:
    """CheckpointError unless every parameter of one dimensionality has the same optimiser state
    entries (`layouts`: parameter name -> its entry names; an optimiser may keep other entries for
    vectors than for matrices, e.g. Adafactor's factored moments)."""
    ndim = {name: parameter.ndim for name, parameter in model.named_parameters(remove_duplicate=False)}
    common: dict[int, set[str]] = {}
    for name, layout in layouts.items():
        common.setdefault(ndim[name], set()).update(layout)
    short = sorted(name for name, layout in layouts.items() if layout != common[ndim[name]])
    if short:
        lacks = sorted(common[ndim[short[0]]] - layouts[short[0]])
        raise CheckpointError(f"{file}: does not fit this optimizer (the state of {name_keys(short)} lacks "
                              f"{', '.join(lacks) or 'its entries'})")



def check_model_shards(directory: PathLike, model: torch.nn.Module, *, strict: bool = True) -> None:
    """CheckpointError naming ``<directory>/.metadata`` when the saved model state does not fit
    `model`: keys missing or unexpected (strict), or a saved tensor whose global shape differs from
    the model's (always). Reads the index only; not collective."""
    directory = Path(directory)
    file = directory / METADATA_FILE
    saved = _metadata(directory, "model state").state_dict_metadata
    expected = model.state_dict()
    missing, unexpected = set(expected) - set(saved), set(saved) - set(expected)
    if strict and (missing or unexpected):
        said = [f"missing key(s) {name_keys(missing)}"] if missing else []
        said += [f"unexpected key(s) {name_keys(unexpected)}"] if unexpected else []
        raise CheckpointError(f"{file}: does not fit this model ({'; '.join(said)})")
    for key in sorted(set(expected) & set(saved)):
        entry, shape = saved[key], tuple(expected[key].shape)
        if not isinstance(entry, TensorStorageMetadata) or tuple(entry.size) != shape:
            size = tuple(entry.size) if isinstance(entry, TensorStorageMetadata) else "not a tensor"
            raise CheckpointError(f"{file}: does not fit this model ({key}: saved shape {size}, the model's {shape})")


def param_names(model: torch.nn.Module) -> dict[int, set[str]]:
    """{id(parameter): every FQN it has in `model`} (a tied parameter has several)."""
    names: dict[int, set[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), set()).add(name)
    return names


def check_optimizer_shards(directory: PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """CheckpointError naming ``<directory>/.metadata`` unless the saved optimiser state names every
    parameter of `optimizer` once (by any of its FQNs: tied parameters have several) and no other,
    and the states of parameters of one dimensionality hold the same entries (e.g. step, exp_avg,
    exp_avg_sq; an optimiser may keep other entries for vectors than for matrices). Index only."""
    directory = Path(directory)
    file = directory / METADATA_FILE
    saved = _metadata(directory, "optimizer state").state_dict_metadata
    names = param_names(model)
    owner = {name: index for index, fqns in names.items() for name in fqns}
    layouts: dict[str, set[str]] = {}
    grouped, unexpected = set(), set()
    for key in saved:
        kind, _, rest = key.partition(".")
        fqn, _, entry = rest.rpartition(".")
        if kind not in ("state", "param_groups") or fqn not in owner:
            unexpected.add(fqn or key)
        elif kind == "state":
            layouts.setdefault(fqn, set()).add(entry)
        else:
            grouped.add(owner[fqn])
    missing = [min(names[id(p)]) for group in optimizer.param_groups for p in group["params"]
               if id(p) in names and id(p) not in grouped]
    if missing or unexpected:
        said = [f"missing parameter(s) {name_keys(missing)}"] if missing else []
        said += [f"unexpected key(s) {name_keys(unexpected)}"] if unexpected else []
        raise CheckpointError(f"{file}: does not fit this optimizer ({'; '.join(said)})")
    check_state_layouts(file, model, layouts)


# ------------------------------------------------------------------------------------------------
# load
# ------------------------------------------------------------------------------------------------
def load_model_shards(directory: PathLike, model: torch.nn.Module, *, strict: bool = True) -> None:
    """Load a DCP model directory into `model` (plain or FSDP2-sharded, any world size; collective
    when distributed): each rank reads the saved chunks that overlap its own shards. strict False:
    only the keys both hold are loaded. Call `check_model_shards` first for a refusal that names
    the keys and leaves `model` untouched."""
    directory = Path(directory)
    template = get_model_state_dict(model)
    if not strict:
        saved = _metadata(directory, "model state").state_dict_metadata
        template = {k: v for k, v in template.items() if k in saved}
    _load(template, directory)
    set_model_state_dict(model, template, options=StateDictOptions(strict=strict))


def load_optimizer_shards(directory: PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a DCP optimiser directory into `optimizer` (collective when distributed; any world
    size). The optimiser's own state is created first as the template (torch's zero-gradient step
    at lr 0), then overwritten with the saved values, hyperparameters included."""
    template = get_optimizer_state_dict(model, optimizer, options=_OPTIM_OPTIONS)
    _load(template, Path(directory))
    set_optimizer_state_dict(model, optimizer, template, options=_OPTIM_OPTIONS)


def read_tensors(directory: PathLike, keys: Iterable[str], dtype: Optional[torch.dtype] = None) -> dict[str, torch.Tensor]:
    """The full (unsharded) CPU tensors of `keys` from a DCP directory, in this process only (no
    collective, whatever the world size that wrote it): only their bytes are read, so a caller
    streaming a large checkpoint asks for a few keys at a time. dtype: cast after reading (None:
    as saved). KeyError naming the key when it is not a saved tensor."""
    directory = Path(directory)
    specs = tensor_specs(directory)
    keys = list(keys)
    for key in keys:
        if key not in specs:
            raise KeyError(f"{directory}: no tensor {key!r} saved")
    state = {key: torch.empty(specs[key].shape, dtype=specs[key].dtype) for key in keys}
    if state:
        _load(state, directory, no_dist=True)
    return state if dtype is None else {key: value.to(dtype) for key, value in state.items()}
