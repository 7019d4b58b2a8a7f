"""Model and optimiser state as torch.distributed.checkpoint (DCP) directories: every rank writes
and reads only its own shards, nothing is gathered on one rank, and a directory written by N ranks
loads on M ranks (or into a plain single-process model) because DCP records each tensor's global
shape and the chunks each file holds.

A directory (``<checkpoint>/model`` or ``<checkpoint>/optimizer``) holds ``.metadata`` (DCP's
pickled index: for each key its global shape, dtype and chunks; written by rank 0) and one
``__<rank>_0.distcp`` per rank that had something to write. The index is read as data, never as a
program: a restricted unpickler (`read_index`) resolves only the classes DCP writes into it and
refuses any other, naming the file and the class, and DCP's own loads read it the same way
(`IndexReader`); the non-tensor values in the shard files (the optimiser's hyperparameters), which
DCP's default planner unpickles unrestricted, are read with torch's weights-only unpickler
(`_DataLoadPlanner`). A planted pickle runs no code. Keys: the model's state-dict FQNs
(``get_model_state_dict``); the optimiser's flattened FQN keys (``state.<fqn>.<entry>`` tensors,
``param_groups.<fqn>.<hyperparameter>`` values; ``flatten_optimizer_state_dict``), which reshard
like the parameters (Adam's moments are DTensors shaped as their parameter).

DCP writes no checksums: `mempo.train.checkpoint` records a SHA-256 of every file in its manifest,
each rank hashing the files it wrote (`owner_rank`).
"""
from __future__ import annotations

import io
import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    _MEM_FORMAT_ENCODING, BytesStorageMetadata, ChunkStorageMetadata, Metadata, MetadataIndex, StorageMeta,
    TensorProperties, TensorStorageMetadata,
)
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
)

from mempo.errors import MempoError
from mempo.utils.files import NotRegularFileError, open_regular, plain_text, refused_global
from mempo.utils.types import PathLike

__all__ = ["CheckpointError", "TensorSpec", "METADATA_FILE", "save_model_shards", "save_optimizer_shards",
           "snapshot_model_state", "snapshot_optimizer_state", "write_state",
           "load_model_shards", "load_optimizer_shards", "check_model_shards", "check_optimizer_shards",
           "tensor_specs", "read_tensors", "owner_rank", "rank_shard_files", "dist_active", "short_error",
           "name_keys", "param_names", "read_index", "IndexReader", "index_files", "read_values", "SHARD_FILE"]

METADATA_FILE = ".metadata"
SHARD_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")  # a shard file's name: __<rank>_<index>.distcp
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


def _dcp_failure(error: CheckpointException) -> tuple[Optional[BaseException], str]:
    """The first failing rank's exception of a DCP CheckpointException, and ``rank r: Type: message``
    (DCP's own text is every rank's whole traceback)."""
    for rank, failure in sorted(error.failures.items()):
        cause = failure[0] if isinstance(failure, tuple) and failure else failure
        if isinstance(cause, BaseException):
            return cause, f"rank {rank}: {short_error(cause)}"
    return None, short_error(error)


def _save(state: dict[str, Any], directory: Path, process_group: Optional[dist.ProcessGroup] = None) -> None:
    writer = FileSystemWriter(directory, single_file_per_rank=True, sync_files=True, thread_count=1)
    context = _quiet_single_process()
    try:
        dcp.save(state, storage_writer=writer, process_group=process_group, no_dist=not dist_active())
    except CheckpointException as error:  # a BaseException: make it an ordinary one naming the directory
        cause, said = _dcp_failure(error)
        if isinstance(cause, OSError) and cause.errno:  # the file system's refusal: keep its errno
            raise OSError(cause.errno, cause.strerror or said, cause.filename or str(directory)) from None
        raise OSError(f"{directory}: writing the shards failed ({said})") from None
    finally:
        context.__exit__(None, None, None)


def _load(state: dict[str, Any], directory: Path, *, no_dist: bool = False) -> None:
    read_index(directory / METADATA_FILE)  # refused here, naming the file, before DCP starts
    context = _quiet_single_process()
    try:
        dcp.load(state, storage_reader=IndexReader(directory), planner=_DataLoadPlanner(directory),
                 no_dist=no_dist or not dist_active())
    except CheckpointException as error:
        cause, said = _dcp_failure(error)
        if isinstance(cause, CheckpointError):  # ours, naming the file
            raise CheckpointError(str(cause)) from None
        raise CheckpointError(f"{directory}: cannot be loaded ({said})") from None
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
    match = SHARD_FILE.match(name)
    if match:
        return int(match.group(1))
    rng = re.match(r"^rank_(\d+)\.pt$", name)
    return int(rng.group(1)) if rng and relative.startswith("rng/") else 0


def rank_shard_files(directory: PathLike, rank: int) -> list[Path]:
    """The shard files rank `rank` wrote in a DCP directory (sorted)."""
    return sorted(p for p in Path(directory).iterdir() if SHARD_FILE.match(p.name) and owner_rank(p.name) == rank)


# ------------------------------------------------------------------------------------------------
# metadata: DCP's index, read as data; keys and shapes without loading any tensor
# ------------------------------------------------------------------------------------------------
# What torch.distributed.checkpoint's FileSystemWriter pickles into ``.metadata`` (torch 2.13: read
# off the opcodes of saved indexes, model and optimizer): its index records, torch.Size, dtypes, a
# layout by name (`torch.serialization._get_layout`), the memory-format enum and the checkpoint's
# path (StorageMeta.checkpoint_id, kept as a pure path: no file-system access). Nothing else resolves.
_INDEX_RECORDS = (Metadata, TensorStorageMetadata, BytesStorageMetadata, ChunkStorageMetadata, TensorProperties,
                  MetadataIndex, StorageMeta, _StorageInfo)
_INDEX_GLOBALS: dict[tuple[str, str], Any] = {
    **{(record.__module__, record.__name__): record for record in _INDEX_RECORDS},
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"): _MEM_FORMAT_ENCODING,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    **{(module, name): PureWindowsPath if "Windows" in name else PurePosixPath
       for module in ("pathlib", "pathlib._local")
       for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")},
}


class _RefusedGlobal(pickle.UnpicklingError):
    """A global the index may not name (its dotted name is the message)."""


class _IndexUnpickler(pickle._Unpickler):  # the Python unpickler: its BUILD can be checked too
    """Unpickles a DCP index admitting only `_INDEX_GLOBALS` and torch dtypes; state is set only on
    index records made by this load (never on a class or a shared object)."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        found = _INDEX_GLOBALS.get((module, name))
        if found is None and module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            found = getattr(torch, name)
        if found is None:
            raise _RefusedGlobal(f"{module}.{name}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a persistent id (DCP writes none)")

    def _load_build(self) -> None:
        target = self.stack[-2]
        if type(target) not in _INDEX_RECORDS:
            raise pickle.UnpicklingError(f"state set on {type(target).__name__} (only index records take state)")
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = _load_build


def read_index(file: PathLike, what: str = "shard index") -> Metadata:
    """DCP's ``.metadata`` index `file`, unpickled admitting only the classes DCP writes into it
    (records, torch.Size, dtypes): a file naming any other global is refused before anything it
    names is called, so no code in the file runs. CheckpointError naming the file when it is
    missing, not a regular file (a FIFO is refused, not waited on), names a foreign class (named),
    is torn, or does not hold an index of the expected shape (`_index_problem`)."""
    file = Path(file)
    try:
        with open_regular(file) as handle:
            metadata = _IndexUnpickler(handle).load()
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing ({what})") from None
    except NotRegularFileError as error:
        raise CheckpointError(f"{error} ({what})") from None
    except _RefusedGlobal as refused:
        raise CheckpointError(f"{file}: refused: it names {refused}, not a class torch.distributed.checkpoint "
                              f"writes into an index (a checkpoint file is read as data, never run)") from None
    except Exception as error:  # torn or foreign: name it
        raise CheckpointError(f"{file}: cannot be loaded ({short_error(error)})") from None
    problem = _index_problem(metadata)
    if problem:
        raise CheckpointError(f"{file}: damaged (not a torch.distributed.checkpoint index: {problem})")
    return metadata


def _index_problem(metadata: Any) -> Optional[str]:
    """What is wrong with an unpickled index's shape, or None: the records DCP's loader and
    `tensor_specs` use must be of their types, and every shard file it names a plain
    ``__<rank>_<i>.distcp`` in its own directory (no path leads elsewhere)."""
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        return "no key table"
    for key, entry in metadata.state_dict_metadata.items():
        if not isinstance(key, str) or not isinstance(entry, (TensorStorageMetadata, BytesStorageMetadata)):
            return f"entry {str(key)[:80]!r}"
        if isinstance(entry, TensorStorageMetadata) and not (
                isinstance(entry.properties, TensorProperties) and isinstance(entry.properties.dtype, torch.dtype)
                and isinstance(entry.size, tuple) and all(type(n) is int and n >= 0 for n in entry.size)
                and isinstance(entry.chunks, list)
                and all(isinstance(chunk, ChunkStorageMetadata) for chunk in entry.chunks)):
            return f"tensor entry {key[:80]!r}"
    if not isinstance(metadata.storage_data, dict):
        return "no storage table"
    for index, info in metadata.storage_data.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            return "storage entry"
        if not (isinstance(info.relative_path, str) and SHARD_FILE.match(info.relative_path)):
            return f"storage entry naming {str(info.relative_path)[:80]!r}, not a shard file of its directory"
        if type(info.offset) is not int or type(info.length) is not int or info.offset < 0 or info.length < 0:
            return f"storage entry of {index.fqn!r} with a bad offset or length"
        if getattr(info, "transform_descriptors", None):  # mempo writes none; each names code to run on load
            return f"storage entry of {index.fqn!r} asking for stream transforms {info.transform_descriptors!r}"
    return None


def index_files(directory: PathLike) -> set[str]:
    """The shard files (names in `directory`) DCP's index in `directory` reads tensors from
    (`read_index`; CheckpointError naming ``.metadata``)."""
    metadata = read_index(Path(directory) / METADATA_FILE)
    return {info.relative_path for info in metadata.storage_data.values()}


class IndexReader(FileSystemReader):
    """DCP's FileSystemReader reading ``.metadata`` through `read_index` (DCP's own reader unpickles
    it unrestricted), so the index a load uses is the one checked: no gap between check and use."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        # as FileSystemReader.read_metadata (torch 2.13), the unpickling restricted
        metadata = read_index(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _load_value(data: Any, file: Path, key: str) -> Any:
    """One non-tensor value of a shard file (torch.save bytes), by torch's weights-only unpickler;
    CheckpointError naming the file and the key when it cannot be read as data."""
    try:
        return torch.load(data, weights_only=True)
    except Exception as error:
        refused = refused_global(error)
        said = (f"it names {refused}, which torch's weights-only loader refuses: a checkpoint file is read as "
                f"data, never run" if refused else f"{type(error).__name__}: {plain_text(error)}")
        raise CheckpointError(f"{file}: the value of {key} cannot be loaded ({said})") from None


def read_values(directory: PathLike) -> dict[str, Any]:
    """{key: value} of every non-tensor value saved in a DCP directory (the optimiser's
    hyperparameters), each read from its shard file by torch's weights-only unpickler; no
    collective. CheckpointError naming the file (and the key) when one cannot be read as data."""
    directory = Path(directory)
    metadata = read_index(directory / METADATA_FILE)
    values = {}
    for index, info in sorted(metadata.storage_data.items(), key=lambda item: (item[1].relative_path, item[1].offset)):
        if not isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        file = directory / info.relative_path
        try:
            with open_regular(file) as handle:
                handle.seek(info.offset)
                data = handle.read(info.length)
        except OSError as error:
            raise CheckpointError(f"{file}: unreadable ({short_error(error)})") from None
        if len(data) != info.length:
            raise CheckpointError(f"{file}: truncated (the value of {index.fqn} runs past its end)")
        values[index.fqn] = _load_value(io.BytesIO(data), file, index.fqn)
    return values


class _DataLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner with its non-tensor values (the optimiser's hyperparameters,
    stored as torch.save bytes in the shard files) read by torch's weights-only unpickler:
    DefaultLoadPlanner.load_bytes (torch 2.13) unpickles them unrestricted. A value naming code is
    refused with a CheckpointError naming the shard file and the key."""

    def __init__(self, directory: Path):
        super().__init__()
        self.directory = directory

    def load_bytes(self, read_item: Any, value: Any) -> None:
        # as DefaultLoadPlanner.load_bytes (torch 2.13), the unpickling restricted
        file = self.directory / self.metadata.storage_data[read_item.storage_index].relative_path
        loaded = _load_value(value, file, read_item.dest_index.fqn)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def _metadata(directory: Path, what: str) -> Metadata:
    return read_index(directory / METADATA_FILE, what)


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
    at lr 0), then overwritten with the saved values, hyperparameters included (a resume that trains
    with its config's: `mempo.train.checkpoint.apply_optimizer_defaults` afterwards)."""
    template = get_optimizer_state_dict(model, optimizer, options=_OPTIM_OPTIONS)
    _load(template, Path(directory))
    set_optimizer_state_dict(model, optimizer, template, options=_OPTIM_OPTIONS)


def read_tensors(directory: PathLike, keys: Iterable[str],
                 dtype: Optional[torch.dtype] = None) -> dict[str, torch.Tensor]:
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
