"""Atomic training checkpoints that prove their integrity: model, optimiser, RNG states, data
position; single process or FSDP2 (every function that touches a model is collective when
``torch.distributed`` is initialised: call it on every rank).

Layout (``root`` is the checkpoint root, e.g. ``<out_dir>/checkpoints``)::

    root/
      latest                    text file: the directory name of the newest checkpoint + "\\n"
      step_00000050/
        model/                  the model state in torch.distributed.checkpoint form (`mempo.train.sharded`):
          .metadata             global shapes, dtypes and chunks of every tensor (rank 0)
          __<r>_0.distcp        rank r's shards, written by rank r in parallel with the others
        optimizer/              the optimiser state, flattened and keyed by parameter FQN, the same way
        state.json              {"format", "step", "world_size", "data_state", "extra"}
        rng/rank_00000.pt       per-rank RNG states (python random, numpy, torch CPU, this rank's CUDA device)
        COMPLETE                the manifest, written last: {"format", "step", "world_size", "time",
                                "files": {relative path: {"bytes", "sha256"}}} of every other file
      .tmp-step_00000100/       a checkpoint being written (or left by a crash): always ignored

Nothing is gathered on one rank: each rank writes and hashes its own shard files (`save_checkpoint`),
hashes them again on resume (`verify_on_all_ranks`) and reads only the saved chunks that overlap
its shards, so a checkpoint written by N ranks resumes on M ranks (or in one plain process) with the
same parameters and optimiser state. Checkpoints of formats 1 and 2 (full-state model.pt /
optimizer.pt, `mempo.train.full_state`) still load.

Every file is read as data, never run: the DCP index through a restricted unpickler
(`mempo.train.sharded.read_index`), RNG files and model.pt / optimizer.pt with
``torch.load(weights_only=True)``, data_state and extra as JSON values; the manifest, state.json
and the pointer only when they are regular files (a FIFO is refused, not waited on). A checkpoint
is intact only when its manifest lists, with matching digests, every file a load may read (all of
model/, optimizer/, rng/, state.json, model.pt, optimizer.pt, and every shard the DCP indexes
name) and its RNG files hold `capture_rng_state`'s shape. A save the file system refuses raises
`CheckpointWriteError` (one line: path, reason, errno name), removes its unpublished directory and
leaves every earlier checkpoint as it was; `check_checkpoint_root` / `check_checkpoint_space` find
the foreseeable refusals before a run trains.
"""
from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import stat
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

try:
    import resource  # POSIX: the file-size limit a save must fit (RLIMIT_FSIZE)
except ImportError:  # not POSIX: no limit to check
    resource = None

from mempo.errors import MempoError
from mempo.utils.atomic import (
    FAULT_ENV, TEMP_PREFIX, fault_point, fsync_dir, replace_file_atomically, write_bytes_durably,
)
from mempo.train.full_state import (
    LEGACY_MODEL_FILE, LEGACY_OPTIMIZER_FILE, check_full_state_files, is_legacy_checkpoint, load_full_state_files,
    load_model_state, load_optimizer_state, model_state_dict, optimizer_state_dict, torch_load,
)
from mempo.train.sharded import (
    METADATA_FILE, CheckpointError, check_model_shards, check_optimizer_shards, dist_active, index_files,
    load_model_shards, load_optimizer_shards, owner_rank, rank_shard_files, read_values, save_model_shards,
    save_optimizer_shards, short_error, snapshot_model_state, snapshot_optimizer_state, write_state,
)
from mempo.utils.digest import sha256_file
from mempo.utils.files import NotRegularFileError, read_regular
from mempo.utils.jsonl import loads_bounded
from mempo.utils.types import PathLike

__all__ = [
    "CheckpointError", "CheckpointWriteError", "CheckpointState", "rng_state_problem", "check_checkpoint_root",
    "check_checkpoint_space", "apply_optimizer_defaults", "capture_rng_state", "restore_rng_state", "checkpoint_dir",
    "list_checkpoints", "has_checkpoints", "latest_checkpoint", "verify_checkpoint", "verify_on_all_ranks",
    "newest_intact_checkpoint", "resolve_checkpoint", "resume_checkpoint", "checkpoint_step", "save_checkpoint",
    "start_checkpoint", "PendingCheckpoint", "load_checkpoint", "write_error", "os_error_text",
    "prune_checkpoints", "check_fits", "model_state_dict", "optimizer_state_dict", "load_model_state",
    "load_optimizer_state",
]
CHECKPOINT_FORMAT = 3  # 3: sharded (DCP) model/ and optimizer/; 2: full model.pt, digests; 1: no digests
MODEL_DIR = "model"
OPTIMIZER_DIR = "optimizer"
COMPLETE_MARKER = "COMPLETE"
LATEST_FILE = "latest"
_STEP_DIR = re.compile(r"^step_(\d{8,})$")
# What a load reads: the manifest must list every file in these folders and these files when present
_LOADED_FOLDERS = (MODEL_DIR, OPTIMIZER_DIR, "rng")
_LOADED_FILES = ("state.json", LEGACY_MODEL_FILE, LEGACY_OPTIMIZER_FILE)
_SMALL_FILE_BYTES = 64 << 20  # the manifest, state.json, the pointer: far smaller; nothing larger is read


class CheckpointWriteError(MempoError, OSError):
    """A checkpoint that could not be written: the message (one line) names the step, the path and
    the file system's reason with its errno name (EROFS, ENOSPC, EFBIG, EISDIR, ...; ``errno`` holds
    the number when the file system gave one). Nothing was published: the checkpoints written before
    it are as they were. An OSError too, as the failures it reports were."""

    def __init__(self, message: str, code: Optional[int] = None):
        super().__init__(message)
        self.errno = code


class _OtherRankFailed(OSError):
    """Another rank's failure, on a rank whose own part went through."""


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
    """The RNG states of python `random`, numpy's global RNG, torch CPU and (if CUDA is available) the
    current CUDA device, as a dict of plain types and tensors (loadable with weights_only=True).

    Only the current device: touching every visible GPU would initialise a context on each and
    break a resume on another GPU count."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]), int(np_state[3]),
                  float(np_state[4])),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
        state["cuda_device"] = int(torch.cuda.current_device())
    return state


def restore_rng_state(state: dict) -> None:
    """Apply a state from `capture_rng_state` (the CUDA state to the current device, when CUDA is
    available; a format-1 list of every device's states: the current device's entry)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.int64).astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is None or not torch.cuda.is_available():
        return
    if isinstance(cuda, (list, tuple)):
        index = int(torch.cuda.current_device())
        if index >= len(cuda):
            warnings.warn(f"the RNG state holds {len(cuda)} CUDA device state(s), none for the current device "
                          f"{index}; keeping its RNG state", RuntimeWarning, stacklevel=2)
            return
        cuda = cuda[index]
    torch.cuda.set_rng_state(cuda)


def _byte_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1


def rng_state_problem(state: Any) -> Optional[str]:
    """What keeps `state` from being a `capture_rng_state` dict (a format-1 one included), said in
    a few words, or None when it has that shape: python ``(3, 625 ints, gauss)``, numpy
    ``("MT19937", 624 keys, pos, has_gauss, cached)``, torch a byte tensor, cuda (optional) a byte
    tensor or a list of them."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a dict of RNG states"
    missing = [name for name in ("python", "numpy", "torch") if name not in state]
    if missing:
        return f"no {', '.join(missing)} state"
    python = state["python"]
    if not (isinstance(python, (tuple, list)) and len(python) == 3 and type(python[0]) is int
            and isinstance(python[1], (tuple, list)) and len(python[1]) == 625
            and all(type(word) is int for word in python[1]) and (python[2] is None or isinstance(python[2], float))):
        return "the python state is not random.getstate()'s"
    numpy_state = state["numpy"]
    if not (isinstance(numpy_state, (tuple, list)) and len(numpy_state) == 5 and isinstance(numpy_state[0], str)
            and (isinstance(numpy_state[1], torch.Tensor) and numpy_state[1].shape == (624,)
                 and not numpy_state[1].is_floating_point()
                 or isinstance(numpy_state[1], (tuple, list)) and len(numpy_state[1]) == 624)
            and type(numpy_state[2]) is int and type(numpy_state[3]) is int and isinstance(numpy_state[4], float)):
        return "the numpy state is not numpy.random.get_state()'s"
    if not _byte_tensor(state["torch"]):
        return "the torch state is not a byte tensor"
    cuda = state.get("cuda")
    if cuda is not None and not (_byte_tensor(cuda) or isinstance(cuda, (tuple, list))
                                 and all(_byte_tensor(entry) for entry in cuda)):
        return "the cuda state is not a byte tensor or a list of them"
    return None


# ------------------------------------------------------------------------------------------------
# distributed helpers
# ------------------------------------------------------------------------------------------------
def _rank() -> int:
    return torch.distributed.get_rank() if dist_active() else 0


def _world_size() -> int:
    return torch.distributed.get_world_size() if dist_active() else 1


def _barrier() -> None:
    if dist_active():
        torch.distributed.barrier()


def _all_ranks_ok(ok: bool) -> bool:
    """True when `ok` holds on every rank (an all-reduce of a flag; the local value when not distributed)."""
    if not dist_active():
        return ok
    device = torch.device("cpu")
    if torch.distributed.get_backend() == "nccl":  # nccl alone (a caller's own group) takes no CPU tensor
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


def _from_rank0(compute: Callable[[], Any]) -> Any:
    """`compute()` on rank 0, its value (or its MempoError) on every rank; just `compute()` when not
    distributed."""
    if not dist_active():
        return compute()
    box: list[Any] = [None]
    failure: Optional[Exception] = None
    if _rank() == 0:
        try:
            box[0] = ("ok", compute())
        except Exception as error:  # the other ranks wait in the broadcast: tell them, then raise here
            failure, box[0] = error, ("error", str(error))
    torch.distributed.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if failure is not None:
        raise failure
    if kind == "error":
        raise CheckpointError(value)
    return value


# ------------------------------------------------------------------------------------------------
# file system helpers
# ------------------------------------------------------------------------------------------------
def _torch_save(obj: Any, path: Path, phase: str) -> None:
    try:
        write_bytes_durably(path, lambda handle: torch.save(obj, handle), phase)
    except RuntimeError as error:  # torch's zip writer says "unexpected pos" for a refused write
        raise OSError(f"{path}: writing failed ({short_error(error)})") from None


def _file_size_limit() -> Optional[int]:
    """This process's file-size limit in bytes (RLIMIT_FSIZE, ``ulimit -f``), None when unlimited or
    not POSIX."""
    if resource is None:
        return None
    try:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (OSError, ValueError):
        return None
    return None if limit == resource.RLIM_INFINITY else int(limit)


def _refusal_behind(folder: Path) -> Optional[OSError]:
    """The file system's reason for a failed write under `folder` when the error carried none
    (torch's zip writer reports a refused write as a RuntimeError, "unexpected pos"), when it can be
    seen: a file there cut at this process's file-size limit (EFBIG), or under 1 MiB left free on
    the file system (ENOSPC). None otherwise."""
    limit = _file_size_limit()
    try:
        if limit is not None:
            for file in sorted(folder.rglob("*")):
                if file.is_file() and file.stat().st_size >= limit:
                    return OSError(errno.EFBIG, f"File too large (the file-size limit, ulimit -f, is {limit} bytes)",
                                   str(file))
        fs = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    free = fs.f_bavail * fs.f_frsize
    if free < 1 << 20:
        return OSError(errno.ENOSPC, f"No space left on device ({free} bytes free)", str(folder))
    return None


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, indent=1, sort_keys=True).encode("utf-8")


def _json_save(obj: Any, path: Path, phase: str) -> None:
    data = _json_bytes(obj)
    write_bytes_durably(path, lambda handle: handle.write(data), phase)



def _hashing_rank(relative: str, world_size: int) -> int:
    """The rank that hashes a checkpoint file, on save and on resume: the rank that wrote it
    (`mempo.train.sharded.owner_rank`; rank 0 for the shared files) modulo the world size."""
    return owner_rank(relative) % world_size


def _file_records(directory: Path, rank: int = 0, world_size: int = 1) -> dict[str, dict[str, Any]]:
    """{relative path: {"bytes", "sha256"}} of the files under `directory` (the manifest excepted)
    that this rank hashes (`_hashing_rank`: the ones it wrote), so the ranks hash their shards in
    parallel and their records together cover every file. One process: every file."""
    records = {}
    for folder, _, files in os.walk(directory):
        for name in files:
            path = Path(folder) / name
            relative = path.relative_to(directory).as_posix()
            if relative == COMPLETE_MARKER or name.startswith(TEMP_PREFIX):
                continue
            if _hashing_rank(relative, world_size) != rank:
                continue
            records[relative] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    return dict(sorted(records.items()))


def _gathered_records(temp: Path) -> dict[str, dict[str, Any]]:
    """Every file's record, each rank hashing its own (collective). OSError on every rank when any
    rank could not read one of its files."""
    rank, world = _rank(), _world_size()
    try:
        mine: Any = _file_records(temp, rank, world)
    except OSError as error:
        mine = f"rank {rank}: {short_error(error)}"
    if not dist_active():
        gathered = [mine]
    else:
        gathered = [None] * world
        torch.distributed.all_gather_object(gathered, mine)
    failures = [part for part in gathered if isinstance(part, str)]
    if failures:
        raise OSError(f"{temp}: cannot hash the written files ({'; '.join(failures)})")
    return dict(sorted((k, v) for part in gathered for k, v in part.items()))


def checkpoint_dir(root: PathLike, step: int) -> Path:
    """``root/step_{step:08d}``."""
    return Path(root) / f"step_{int(step):08d}"


def _is_complete(path: Path) -> bool:
    return _STEP_DIR.match(path.name) is not None and (path / COMPLETE_MARKER).is_file()


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every ``step_N`` directory under `root` (complete or not), ascending by step."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def list_checkpoints(root: PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root` (a COMPLETE manifest present, not verified) as (step, path),
    ascending by step (temp dirs ignored)."""
    return [(step, path) for step, path in _step_dirs(Path(root)) if _is_complete(path)]


def has_checkpoints(root: PathLike) -> bool:
    """True when `root` holds any checkpoint directory or pointer, intact or not (the trainer refuses
    to start a fresh run over checkpoints unless told to resume)."""
    root = Path(root)
    return bool(_step_dirs(root)) or (root / LATEST_FILE).exists()


def _pointer(root: Path) -> Optional[Path]:
    """The ``step_N`` directory the ``latest`` pointer names, if it names an existing one."""
    pointer = root / LATEST_FILE
    if not pointer.is_file():
        return None
    try:
        name = read_regular(pointer, _SMALL_FILE_BYTES).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    candidate = root / name
    if _STEP_DIR.match(name) and candidate.is_dir():
        return candidate
    return None


def latest_checkpoint(root: PathLike) -> Optional[Path]:
    """The newest complete checkpoint under `root` (the pointer's if it names a complete one), or
    None; not verified (`newest_intact_checkpoint` verifies)."""
    root = Path(root)
    pointed = _pointer(root)
    if pointed is not None and _is_complete(pointed):
        return pointed
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def _read_json(path: Path, what: str) -> Any:
    try:
        data = read_regular(path, _SMALL_FILE_BYTES)  # a FIFO is refused, not waited on
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing ({what})") from None
    except NotRegularFileError as error:
        raise CheckpointError(f"{error} ({what})") from None
    except OSError as error:
        raise CheckpointError(f"{path}: unreadable {what} ({short_error(error)})") from None
    try:
        return loads_bounded(data, f"{path}: unreadable {what}")  # nesting bounded: no RecursionError
    except (UnicodeDecodeError, ValueError) as error:
        raise CheckpointError(str(error) if not isinstance(error, UnicodeDecodeError)
                              else f"{path}: unreadable {what} ({short_error(error)})") from None


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _manifest_entry(path: Path, relative: Any, record: Any) -> Path:
    """The file one manifest entry names, after checking the entry's types: a relative POSIX path
    inside the checkpoint, {"bytes": int >= 0, "sha256": 64 hex digits}; CheckpointError otherwise."""
    manifest = path / COMPLETE_MARKER
    parts = relative.split("/") if isinstance(relative, str) else []
    if not parts or any(part in ("", ".", "..") for part in parts) or relative.startswith("/"):
        raise CheckpointError(f"{manifest}: damaged manifest (entry {relative!r} is not a path inside the checkpoint)")
    if not isinstance(record, dict):
        raise CheckpointError(f"{manifest}: damaged manifest (entry of {relative} is not an object)")
    size, digest = record.get("bytes"), record.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise CheckpointError(f"{manifest}: damaged manifest ('bytes' of {relative} is {size!r}, "
                              f"not a non-negative integer)")
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise CheckpointError(f"{manifest}: damaged manifest ('sha256' of {relative} is not 64 hex digits)")
    return path / relative


def _checked_step(path: Path, manifest: dict) -> int:
    """The step of checkpoint `path`, which its directory name, its manifest and its state.json must
    all record alike (a checkpoint copied or edited into another step's place is damaged)."""
    named = int(_STEP_DIR.match(path.name).group(1)) if _STEP_DIR.match(path.name) else None
    recorded = manifest.get("step")
    if not isinstance(recorded, int) or isinstance(recorded, bool):
        raise CheckpointError(f"{path / COMPLETE_MARKER}: damaged manifest ('step' is {recorded!r}, not an integer)")
    state_step = _read_state(path)["step"]
    if named is not None and recorded != named:
        raise CheckpointError(f"{path / COMPLETE_MARKER}: records step {recorded}, its directory {path.name} "
                              f"step {named}")
    if state_step != recorded:
        raise CheckpointError(f"{path / 'state.json'}: records step {state_step}, the manifest step {recorded}")
    return recorded


def verify_checkpoint(path: PathLike, *, log: Optional[Callable[[str], None]] = None,
                      model: Optional[torch.nn.Module] = None,
                      optimizer: Optional[torch.optim.Optimizer] = None,
                      hash_share: Optional[tuple[int, int]] = None) -> dict:
    """Check a ``step_N`` directory against its manifest (COMPLETE); returns the manifest.

    The manifest holds the size and SHA-256 of every other file, read back from disk after it was
    fsynced. Checking reads every file once more (a 7B model with its fp32 AdamW state takes minutes
    on one core; accepted for the guarantee). hash_share ``(rank, world)``: hash only the files
    that rank hashes (`_hashing_rank`; every file's size is still checked): each rank of a
    collective check (`verify_on_all_ranks`) hashes its part. Not collective.
    Also checked: every manifest field's type (an entry is a relative path to a regular file with
    an integer ``bytes`` and a hex ``sha256``); that it lists every file a load may read (anything
    under model/, optimizer/, rng/, state.json, model.pt, optimizer.pt: an unlisted one is
    unverified, so the checkpoint is damaged) and every shard file the DCP indexes name (read
    restricted: an index naming a foreign class is refused, naming it); that the non-tensor values
    in the shards (the optimiser's hyperparameters) read as data (`read_values`); that this rank's
    RNG files hold RNG states (`rng_state_problem`); and that the directory name, the manifest and
    state.json record the same step. With `model` / `optimizer`: that model.pt / optimizer.pt hold
    exactly their keys (`check_fits`).
    Raises CheckpointError naming the first file that is missing, truncated, damaged, unreadable
    or inconsistent. A format-1 checkpoint (no digests) is checked for its files' presence and its
    steps only, with a warning (through `log`, default `warnings.warn`)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    manifest = _read_json(path / COMPLETE_MARKER, "checkpoint manifest: the checkpoint is incomplete")
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path / COMPLETE_MARKER}: damaged manifest (not a JSON object)")
    files = manifest.get("files")
    if files is None:
        say = log or (lambda message: warnings.warn(message, RuntimeWarning, stacklevel=3))
        say(f"{path}: written before checkpoints carried digests (format 1); its files cannot be verified")
        if not (path / "state.json").is_file():
            raise CheckpointError(f"{path / 'state.json'}: missing")
        _checked_step(path, manifest)
        check_fits(path, model, optimizer)
        return manifest
    if not isinstance(files, dict) or "state.json" not in files:
        raise CheckpointError(f"{path / COMPLETE_MARKER}: damaged manifest (no file list with state.json)")
    entries = [(_manifest_entry(path, relative, record), relative, record) for relative, record in files.items()]
    _check_listed(path, files)
    for file, relative, record in entries:
        try:
            info = file.stat()
        except FileNotFoundError:
            raise CheckpointError(f"{file}: missing (listed in the manifest)") from None
        except OSError as error:
            raise CheckpointError(f"{file}: unreadable ({short_error(error)})") from None
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{file}: not a regular file (listed in the manifest)")
        size = info.st_size
        if size != record["bytes"]:
            state = "empty" if size == 0 else "truncated" if size < record["bytes"] else "changed"
            raise CheckpointError(f"{file}: {state}: {size} bytes, the manifest records {record['bytes']}")
        if hash_share is not None and _hashing_rank(relative, hash_share[1]) != hash_share[0]:
            continue  # another rank hashes it
        try:
            digest = sha256_file(file)
        except OSError as error:
            raise CheckpointError(f"{file}: unreadable ({short_error(error)})") from None
        if digest != record["sha256"]:
            raise CheckpointError(f"{file}: damaged: its SHA-256 differs from the manifest's")
    _check_indexes(path, files)
    for file, relative, _ in entries:  # this rank's RNG files: a state of the right shape, before any load
        mine = hash_share is None or _hashing_rank(relative, hash_share[1]) == hash_share[0]
        if relative.startswith("rng/") and mine:
            _read_rng(file)
    _checked_step(path, manifest)
    check_fits(path, model, optimizer)
    return manifest


def _check_listed(path: Path, files: dict) -> None:
    """CheckpointError naming the first file a load may read that the manifest does not list (an
    unlisted file is unverified: anything could be in it): every entry under model/, optimizer/
    and rng/, and state.json, model.pt, optimizer.pt when present."""
    for name in _LOADED_FILES:
        if name not in files and os.path.lexists(path / name):
            raise CheckpointError(f"{path / name}: not listed in the manifest (unverified; a load would read it)")
    for folder in _LOADED_FOLDERS:
        for current, _, names in os.walk(path / folder):
            for name in sorted(names):
                file = Path(current) / name
                if file.relative_to(path).as_posix() not in files:
                    raise CheckpointError(f"{file}: not listed in the manifest (unverified; a load would read it)")


def _check_indexes(path: Path, files: dict) -> None:
    """CheckpointError unless every shard file a listed DCP index (model/.metadata,
    optimizer/.metadata) reads from is listed in the manifest too (`index_files`: the index is read
    as data; one naming a foreign class is refused, naming it), and every non-tensor value in those
    shards (the optimiser's hyperparameters) reads as data (`read_values`: weights only)."""
    for folder in (MODEL_DIR, OPTIMIZER_DIR):
        if f"{folder}/{METADATA_FILE}" not in files:
            continue
        for name in sorted(index_files(path / folder)):
            if f"{folder}/{name}" not in files:
                raise CheckpointError(f"{path / folder / name}: read by {path / folder / METADATA_FILE} but not "
                                      f"listed in the manifest")
        read_values(path / folder)


def verify_on_all_ranks(path: PathLike, *, log: Optional[Callable[[str], None]] = None,
                        model: Optional[torch.nn.Module] = None,
                        optimizer: Optional[torch.optim.Optimizer] = None) -> None:
    """`verify_checkpoint` with the hashing spread over the ranks (each hashes the files it owns,
    `_hashing_rank`); the same CheckpointError (the lowest
    failing rank's) on every rank when any part fails. `log` is used on rank 0 only. Collective
    when distributed; `verify_checkpoint` itself otherwise."""
    if not dist_active():
        verify_checkpoint(path, log=log, model=model, optimizer=optimizer)
        return
    rank, world = _rank(), _world_size()
    try:
        verify_checkpoint(path, log=log if rank == 0 else (lambda message: None), model=model, optimizer=optimizer,
                          hash_share=(rank, world))
        failure = None
    except CheckpointError as error:
        failure = str(error)
    failures: list[Optional[str]] = [None] * world
    torch.distributed.all_gather_object(failures, failure)
    first = next((message for message in failures if message is not None), None)
    if first is not None:
        raise CheckpointError(first)


def check_fits(path: PathLike, model: Optional[torch.nn.Module] = None,
               optimizer: Optional[torch.optim.Optimizer] = None, *, model_keys: bool = True) -> None:
    """CheckpointError naming the file and the keys when the checkpoint's model state does not hold
    exactly `model`'s state dict keys (or a tensor of another shape), or its optimiser state not
    exactly `optimizer`'s parameters (missing and unexpected keys named, up to 8 of each). Reads the
    shard index (``.metadata``; model.pt / optimizer.pt of an older format, memory-mapped), no
    tensor; not collective (rank 0's call is the one that counts). Nothing given: nothing checked.
    model_keys False: the model names the optimizer's parameters only, and only the shapes of the
    keys both hold are checked."""
    path = Path(path)
    if optimizer is not None and model is None:
        raise ValueError("checking an optimizer needs its model (parameter names come from the model)")
    if is_legacy_checkpoint(path):
        check_full_state_files(path, model, optimizer, model_keys=model_keys)
        return
    if model is not None:
        check_model_shards(path / MODEL_DIR, model, strict=model_keys)
    if optimizer is not None:
        check_optimizer_shards(path / OPTIMIZER_DIR, model, optimizer)


def newest_intact_checkpoint(root: PathLike, *, log: Optional[Callable[[str], None]] = None,
                             model: Optional[torch.nn.Module] = None,
                             optimizer: Optional[torch.optim.Optimizer] = None) -> Optional[Path]:
    """The newest verified checkpoint under `root`, None when `root` holds none.

    Tries the checkpoint the ``latest`` pointer names, then the older ones, newest first.
    Checkpoints newer than the pointer's are skipped (a save that did not move the pointer, or a run
    abandoned by resuming from an older checkpoint). Every checkpoint skipped is reported through
    `log` (default `warnings.warn`) with the file and reason; several checkpoints and none intact:
    CheckpointError listing the reasons. With `model` / `optimizer`, a checkpoint whose files do not
    hold exactly their keys is skipped too (`verify_checkpoint`). Collective when distributed: every
    rank takes the same path through the candidates, hashing its own files of each
    (`verify_on_all_ranks`); rank 0 reports."""
    say = log or (lambda message: warnings.warn(message, RuntimeWarning, stacklevel=3))
    if _rank() != 0:
        say = lambda message: None  # noqa: E731 - rank 0 reports for the run
    return _newest_intact(Path(root), say, model, optimizer)


def _newest_intact(root: Path, say: Callable[[str], None], model: Optional[torch.nn.Module],
                   optimizer: Optional[torch.optim.Optimizer]) -> Optional[Path]:
    dirs = _step_dirs(root)
    if not dirs:
        return None
    notes: list[str] = []  # said once a checkpoint is chosen; with none intact they are the error
    pointed = _pointer(root)
    if pointed is not None:
        pointed_step = int(_STEP_DIR.match(pointed.name).group(1))
        order = [pointed] + [path for step, path in reversed(dirs) if step < pointed_step]
        notes += [f"skipping checkpoint {path}: newer than the one {root / LATEST_FILE} names ({pointed.name}); "
                  f"its save did not finish, or it belongs to a run abandoned for an older checkpoint"
                  for step, path in dirs if step > pointed_step]
    else:
        if (root / LATEST_FILE).exists():
            notes.append(f"{root / LATEST_FILE}: does not name a checkpoint directory; trying the checkpoints by step")
        order = [path for _, path in reversed(dirs)]
    reasons = []
    for path in order:
        try:
            verify_on_all_ranks(path, log=notes.append, model=model, optimizer=optimizer)
        except CheckpointError as error:
            notes.append(f"skipping checkpoint {path.name}: {error}")
            reasons.append(str(error))
            continue
        for note in notes:
            say(note)
        return path
    raise CheckpointError(f"no intact checkpoint under {root}: " + "; ".join(reasons or notes)
                          + " (remove the damaged checkpoints to start over there)")


def resolve_checkpoint(path: PathLike, *, log: Optional[Callable[[str], None]] = None,
                       model: Optional[torch.nn.Module] = None,
                       optimizer: Optional[torch.optim.Optimizer] = None) -> Path:
    """A checkpoint directory itself (verified, with `model` / `optimizer` as `verify_checkpoint`
    takes them), or the newest intact checkpoint under a root; CheckpointError when there is none."""
    path = Path(path)
    if _STEP_DIR.match(path.name) and path.is_dir():
        verify_on_all_ranks(path, log=log, model=model, optimizer=optimizer)
        return path
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory (a file)")
    found = newest_intact_checkpoint(path, log=log, model=model, optimizer=optimizer)
    if found is None:
        raise CheckpointError(f"{path}: no checkpoint in it (expected step_N directories or a checkpoint root)")
    return found


def resume_checkpoint(mode: str, root: PathLike, *, log: Optional[Callable[[str], None]] = None,
                      model: Optional[torch.nn.Module] = None,
                      optimizer: Optional[torch.optim.Optimizer] = None) -> Optional[Path]:
    """The checkpoint a run resumes from, by a ``trainer.resume`` value (RL trainer and SFT alike):
    ``"never"`` (None), ``"auto"`` (the newest intact checkpoint under `root`, None when there is
    none) or a path (`resolve_checkpoint`). With `model` / `optimizer`, only a checkpoint holding
    exactly their keys is intact. CheckpointError when nothing intact is found."""
    mode = mode.strip()
    if mode == "never":
        return None
    if mode == "auto":
        return newest_intact_checkpoint(root, log=log, model=model, optimizer=optimizer)
    return resolve_checkpoint(mode, log=log, model=model, optimizer=optimizer)


def _read_state(path: Path) -> dict:
    state = _read_json(path / "state.json", "checkpoint state")
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"{path / 'state.json'}: damaged (expected an object with an integer 'step')")
    return state


def checkpoint_step(path: PathLike) -> int:
    """The step of a checkpoint (a ``step_N`` directory, not verified again, or a root: its newest
    intact one), read from state.json."""
    path = Path(path)
    if not (_STEP_DIR.match(path.name) and path.is_dir()):
        path = resolve_checkpoint(path)
    return int(_read_state(path)["step"])


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
# before a run: can its checkpoints be written?
# ------------------------------------------------------------------------------------------------
def check_checkpoint_root(root: PathLike) -> None:
    """CheckpointWriteError (one line: the path, the reason, its errno name) when checkpoints
    cannot be saved under `root`, checked before any step is trained: ``latest`` is a directory
    (where the pointer file goes: EISDIR), or `root` (or, when it does not exist yet, the nearest
    folder above it, where it will be made) is not a directory or refuses a new file (a probe file
    is made and removed: a read-only file system, EROFS, or permissions, EACCES). Not collective;
    every rank may call it."""
    root = Path(root)
    pointer = root / LATEST_FILE
    if pointer.is_dir() and not pointer.is_symlink():
        raise CheckpointWriteError(f"{pointer}: a directory where the checkpoint pointer file goes (EISDIR); "
                                   f"remove it (checkpoints are found by step without it)", errno.EISDIR)
    folder = root
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise CheckpointWriteError(f"checkpoints cannot be saved under {root}: {folder} is not a directory "
                                   f"(ENOTDIR)", errno.ENOTDIR)
    probe = folder / f"{TEMP_PREFIX}probe-{os.getpid()}"
    try:
        handle = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(handle, b"\0")
        finally:
            os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise CheckpointWriteError(f"checkpoints cannot be saved under {root}: {os_error_text(error)}",
                                   error.errno) from None


def _state_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes of `model`'s state, bytes of AdamW's two moments of its trainable parameters), global
    over the ranks (a DTensor's numel is its global size)."""
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    moments = 2 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return model_bytes, moments


def _space_problem(root: Path, model: torch.nn.Module, world_size: int) -> Optional[tuple[str, int]]:
    """Why a checkpoint of `model` cannot be written under `root`, with its errno, or None."""
    model_bytes, moments = _state_bytes(model)
    needed = model_bytes + moments  # a lower bound: model and AdamW moments, without indexes and RNG files
    largest = max(model_bytes, moments) // max(1, world_size)  # one rank's shard file
    folder = root
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        fs = os.statvfs(folder)
        free = fs.f_bavail * fs.f_frsize
    except (OSError, AttributeError):  # no statvfs here: nothing to say
        free = None
    if free is not None and free < needed:
        return (f"checkpoints cannot be saved under {root}: {free} bytes free on its file system, a "
                f"checkpoint of this model takes at least {needed} (ENOSPC)", errno.ENOSPC)
    limit = _file_size_limit()
    if limit is not None and limit < largest:
        return (f"checkpoints cannot be saved under {root}: the file-size limit (ulimit -f) is {limit} bytes, a "
                f"checkpoint's shard file of this model takes at least {largest} (EFBIG)", errno.EFBIG)
    return None


def check_checkpoint_space(root: PathLike, model: torch.nn.Module) -> None:
    """CheckpointWriteError before any step is trained when a checkpoint of `model` will not fit:
    the free space of `root`'s file system is below the bytes of the model's state plus AdamW's two
    moments (ENOSPC), or one rank's shard file would pass this process's file-size limit
    (RLIMIT_FSIZE, ``ulimit -f``: EFBIG). Both are lower bounds, so nothing that fits is refused.
    Collective when distributed: rank 0 checks (the ranks share the root), every rank raises."""
    problem = _from_rank0(lambda: _space_problem(Path(root), model, _world_size()))
    if problem is not None:
        raise CheckpointWriteError(*problem)


def apply_optimizer_defaults(optimizer: torch.optim.Optimizer,
                             keys: tuple[str, ...] = ("lr", "betas", "eps", "weight_decay")) -> list[str]:
    """Set every parameter group's `keys` back to the optimizer's constructor values
    (``optimizer.defaults``: the run's configuration) after `load_checkpoint` restored the saved
    ones, so a resumed run steps with the hyperparameters it was given. Returns the keys whose
    saved value differed."""
    def same(a: Any, b: Any) -> bool:  # betas may come back from the checkpoint as a list
        return tuple(a) == tuple(b) if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) else a == b

    changed = set()
    for key in keys:
        if key not in optimizer.defaults:
            continue
        for group in optimizer.param_groups:
            if not same(group.get(key), optimizer.defaults[key]):
                changed.add(key)
            group[key] = optimizer.defaults[key]
    return sorted(changed)


# ------------------------------------------------------------------------------------------------
# save / load
# ------------------------------------------------------------------------------------------------
def _tear_own_shard(directory: Path, phase: str) -> None:
    """The fault-injection point of a shard directory (tests: `mempo.utils.atomic.fault_point`): a
    kill there tears this rank's shard file to half its size, as a crash while DCP wrote it would."""
    if not os.environ.get(FAULT_ENV):
        return
    files = rank_shard_files(directory, _rank())
    if not files:
        fault_point(phase)
        return
    with open(files[0], "r+b") as handle:
        handle.seek(0, os.SEEK_END)
        fault_point(phase, handle)


def _write_shards(temp: Path, model: Optional[torch.nn.Module], optimizer: Optional[torch.optim.Optimizer]) -> None:
    """The model's and optimiser's shards (each rank its own, DCP's collectives inside)."""
    if model is not None:
        save_model_shards(temp / MODEL_DIR, model)
        _tear_own_shard(temp / MODEL_DIR, "model")
    if optimizer is not None:
        save_optimizer_shards(temp / OPTIMIZER_DIR, model, optimizer)
        _tear_own_shard(temp / OPTIMIZER_DIR, "optimizer")


def _write_snapshots(temp: Path, snapshots: list[tuple[str, dict]], process_group: Any) -> None:
    """The background writer's job: each snapshot into its folder, in order, collective over
    `process_group` (the training's collectives go on meanwhile in the main thread)."""
    for folder, state in snapshots:
        write_state(temp / folder, state, process_group)
        _tear_own_shard(temp / folder, folder)


def _write_small_files(temp: Path, step: int, rng_states: dict, data_state: Any, extra: Any) -> None:
    """state.json (rank 0) and this rank's RNG file."""
    if _rank() == 0:
        _json_save({"format": CHECKPOINT_FORMAT, "step": int(step), "world_size": _world_size(),
                    "data_state": data_state, "extra": extra}, temp / "state.json", "state")
    _torch_save(rng_states, temp / "rng" / f"rank_{_rank():05d}.pt", "rng")


def _publish(root: Path, temp: Path, final: Path, step: int, records: dict[str, dict[str, Any]]) -> None:
    """Rank 0 makes the written checkpoint visible, each step durable before the next, so a crash
    anywhere leaves either the previous state or the new complete checkpoint:

    1. the manifest of every file (`records`, hashed by the ranks that wrote them), written to a
       temporary file, fsynced, renamed to COMPLETE;
    2. ``.tmp-step_N`` renamed to ``step_N`` (`os.replace`, atomic on POSIX), the root fsynced;
    3. the ``latest`` pointer replaced atomically.
    """
    for folder in ("rng", MODEL_DIR, OPTIMIZER_DIR):
        if (temp / folder).is_dir():
            fsync_dir(temp / folder)
    manifest = {"format": CHECKPOINT_FORMAT, "step": int(step), "world_size": _world_size(), "time": time.time(),
                "files": records}
    staged = temp / f"{TEMP_PREFIX}{COMPLETE_MARKER}"
    _json_save(manifest, staged, "manifest")
    os.replace(staged, temp / COMPLETE_MARKER)
    fsync_dir(temp)
    fault_point("rename")
    if final.exists():
        stale = root / f"{TEMP_PREFIX}replaced-{final.name}"
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(final, stale)
    os.replace(temp, final)
    fsync_dir(root)
    replace_file_atomically(root / LATEST_FILE, final.name + "\n", phase="latest")


# One background writer per process: a second background checkpoint cannot start before the first
# is published (`start_checkpoint`), so the worker never holds more than one checkpoint's snapshots.
_BACKGROUND_WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mempo-checkpoint")
_pending: dict[str, "PendingCheckpoint"] = {}  # "current": the unpublished background checkpoint, if any


@dataclass
class PendingCheckpoint:
    """A checkpoint whose files are written (`start_checkpoint`) but not yet published: `publish()`
    (collective) waits for the writes, then makes it visible exactly as `save_checkpoint` does."""

    root: Path
    step: int
    temp: Path
    final: Path
    keep_last: Optional[int]
    writes: Optional[Future] = None  # the background writer's job (None: written in the caller's thread)
    error: Optional[BaseException] = None  # this rank's failure while staging or writing
    published: bool = field(default=False, init=False)

    @property
    def in_flight(self) -> bool:
        """Whether the background writes are still running on this rank."""
        return self.writes is not None and not self.writes.done()

    def _wait(self) -> Optional[BaseException]:
        """Wait for this rank's background writes (if any) and free the writer; this rank's error."""
        self.published = True
        error = self.error
        if self.writes is not None:
            try:
                self.writes.result()
            except Exception as caught:
                error = error or caught
            finally:
                _pending.pop("current", None)
        return error

    def abandon(self) -> None:
        """Wait for this rank's writes and leave the checkpoint unpublished (not collective: for a
        run that is failing, whose own error is the one to report; its ``.tmp-`` directory goes at
        the next prune)."""
        self._wait()

    def publish(self) -> Path:
        """Wait for this rank's writes, agree with the other ranks that all succeeded, hash, write
        the manifest and publish (`_publish`; rank 0), prune. Returns the checkpoint's directory.
        When any rank failed with an OSError (the file system refused: read-only, full, a file-size
        limit, ``latest`` a directory) every rank raises a CheckpointWriteError naming the path and
        the errno, and the unpublished ``.tmp-`` directory is removed: the previous checkpoint
        stands, nothing of it changed. Other errors (bugs) are raised as they are on the failing
        rank; the other ranks raise a CheckpointWriteError saying another rank failed."""
        if self.published:
            raise RuntimeError(f"checkpoint step {self.step} was already published")
        try:
            self._publish_everywhere()
        except OSError as error:
            if not isinstance(error.errno, int):
                error = _refusal_behind(self.temp) or error
            if _rank() == 0:  # unpublished: its files go now
                shutil.rmtree(self.temp, ignore_errors=True)
            raise write_error(self.root, self.step, error, self.temp) from None
        return self.final

    def _publish_everywhere(self) -> None:
        error = self._wait()  # every rank must reach the agreement below, then all raise
        if not _all_ranks_ok(error is None):
            if error is not None:
                raise error
            raise _OtherRankFailed(f"checkpoint step {self.step}: another rank failed while writing")
        records = _gathered_records(self.temp)  # after the agreement: every rank's files are on disk
        failure: Optional[Exception] = None
        if _rank() == 0:
            try:
                _publish(self.root, self.temp, self.final, self.step, records)
                prune_checkpoints(self.root, self.keep_last)
            except Exception as caught:  # the other ranks wait in the agreement: tell them, then raise
                failure = caught
        if not _all_ranks_ok(failure is None):
            raise failure or _OtherRankFailed(f"checkpoint step {self.step}: rank 0 could not publish it")


def os_error_text(error: OSError, where: Optional[PathLike] = None) -> str:
    """``<path>: <reason> (<ERRNO NAME>)`` of an OSError on one line (both paths of a rename; `where`
    when it names none, as a failed write does), or its message when it carries no errno."""
    code = errno.errorcode.get(error.errno) if isinstance(error.errno, int) else None
    if not error.strerror:
        return " ".join(str(error).split())[:300]
    paths = " -> ".join(str(name) for name in (error.filename, getattr(error, "filename2", None)) if name)
    paths = paths or (str(where) if where is not None else "")
    return f"{paths + ': ' if paths else ''}{error.strerror}" + (f" ({code})" if code else "")


def write_error(root: Path, step: int, error: OSError, where: Optional[Path] = None) -> CheckpointWriteError:
    """The CheckpointWriteError of a failed save of checkpoint `step` under `root`: one line with
    the path (the error's, else `where`), the reason and its errno name, and the newest checkpoint
    that still stands."""
    try:
        before = latest_checkpoint(root)
    except OSError:
        before = None
    standing = (f"the checkpoints saved before it are intact (newest: {before.name})" if before is not None
                else "no earlier checkpoint was saved")
    code = error.errno if isinstance(error.errno, int) else None
    return CheckpointWriteError(f"checkpoint step {int(step)} not saved: {os_error_text(error, where)}; {standing}",
                                code)


def start_checkpoint(root: PathLike, step: int, model: Optional[torch.nn.Module] = None,
                     optimizer: Optional[torch.optim.Optimizer] = None, rng_states: Optional[dict] = None,
                     data_state: Any = None, extra: Any = None, keep_last: Optional[int] = None, *,
                     background: bool = False, process_group: Any = None) -> PendingCheckpoint:
    """Write checkpoint `step`'s files under ``<root>/.tmp-step_N`` and return it unpublished (see
    `save_checkpoint` for the arguments; `PendingCheckpoint.publish` finishes it). Collective.

    background: snapshot this rank's model and optimiser shards into CPU memory now (one more copy
    of the rank's shards, host memory on a GPU, held until written) and write them from a
    background thread, so training goes on while the shards reach the disk; the small files are
    written now. The snapshot is the state at this call: later updates do not reach the files.
    Under torch.distributed it needs `process_group`, a group the training's collectives do not
    use (``torch.distributed.new_group(backend="gloo")``, created once on every rank), for the
    writer's own collectives. One background checkpoint at a time per process: publish it before
    starting the next (RuntimeError otherwise). A process that dies before `publish` leaves an
    unpublished ``.tmp-`` directory (removed by the next prune) and the previous checkpoint."""
    if optimizer is not None and model is None:
        raise ValueError("saving an optimizer needs its model (parameter names come from the model)")
    if background and dist_active() and process_group is None:
        raise ValueError("a background checkpoint under torch.distributed needs process_group: a group the "
                         "training's collectives do not use (torch.distributed.new_group(backend='gloo'))")
    if "current" in _pending:
        raise RuntimeError(f"checkpoint step {_pending['current'].step} is still unpublished: publish() it before "
                           f"starting step {int(step)}'s")
    root = Path(root)
    step = int(step)
    rng_states = capture_rng_state() if rng_states is None else rng_states
    final = checkpoint_dir(root, step)
    temp = root / f"{TEMP_PREFIX}{final.name}"
    failure: Optional[OSError] = None
    if _rank() == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(temp, ignore_errors=True)
            (temp / "rng").mkdir(parents=True)
        except OSError as error:  # read-only, full, a file in the way: every rank stops here
            failure = error
    if not _all_ranks_ok(failure is None):
        raise write_error(root, step, failure or _OtherRankFailed(f"rank 0 could not create {temp}"), temp)
    pending = PendingCheckpoint(root, step, temp, final, keep_last)
    try:
        if background:
            snapshots = [(MODEL_DIR, snapshot_model_state(model))] if model is not None else []
            if optimizer is not None:
                snapshots.append((OPTIMIZER_DIR, snapshot_optimizer_state(model, optimizer)))
            pending.writes = _BACKGROUND_WRITER.submit(_write_snapshots, temp, snapshots, process_group)
            _pending["current"] = pending
        else:
            _write_shards(temp, model, optimizer)
        _write_small_files(temp, step, rng_states, data_state, extra)
    except Exception as caught:  # reported by publish(), on every rank
        pending.error = caught
    return pending


def save_checkpoint(root: PathLike, step: int, model: Optional[torch.nn.Module] = None,
                    optimizer: Optional[torch.optim.Optimizer] = None, rng_states: Optional[dict] = None,
                    data_state: Any = None, extra: Any = None, keep_last: Optional[int] = None) -> Path:
    """Write checkpoint `step` under `root` atomically, with its manifest, and return its directory.

    model: plain or FSDP2-sharded module (its FQNs are stored; pass the Hugging Face model itself,
    not a wrapper); optimizer: needs `model`. rng_states: this rank's `capture_rng_state()` (None:
    captured now). data_state / extra: JSON values. keep_last: prune to the newest K complete
    checkpoints afterwards (None: keep all).
    Collective when torch.distributed is initialised: every rank writes its own model and optimiser
    shards and RNG file into ``.tmp-step_N`` and hashes them (no rank holds more than its shards
    plus DCP's copy buffer), rank 0 writes state.json, gathers the digests and publishes
    (`_publish`). Tests inject crashes with ``MEMPO_FAULT_INJECT`` at the phases ``model``,
    ``optimizer`` (this rank's shard file torn), ``rng``, ``state``, ``manifest``, ``rename``,
    ``latest`` (`mempo.utils.atomic.fault_point`). `start_checkpoint` writes in the background.
    A save the file system refuses (read-only, full, a file-size limit, ``latest`` a directory)
    raises CheckpointWriteError on every rank, naming the path and the errno; nothing of it is
    published and its ``.tmp-`` directory is removed (`PendingCheckpoint.publish`).
    """
    return start_checkpoint(root, step, model, optimizer, rng_states, data_state, extra, keep_last).publish()


def _read_rng(file: Path) -> dict:
    """An RNG file's state (`torch_load`: weights only); CheckpointError naming the file unless it
    has `capture_rng_state`'s shape (`rng_state_problem`)."""
    state = torch_load(file, "RNG state")
    problem = rng_state_problem(state)
    if problem:
        raise CheckpointError(f"{file}: not an RNG state ({problem})")
    return state


def _load_rng(path: Path, rank: int) -> Optional[dict]:
    rng_file = path / "rng" / f"rank_{rank:05d}.pt"
    if not os.path.lexists(rng_file):
        warnings.warn(f"{path}: no RNG state for rank {rank} (saved with another world size?); "
                      f"keeping the current RNG state", RuntimeWarning, stacklevel=3)
        return None
    return _read_rng(rng_file)


def load_checkpoint(path: PathLike, model: Optional[torch.nn.Module] = None,
                    optimizer: Optional[torch.optim.Optimizer] = None, *, restore_rng: bool = True,
                    strict: bool = True, verify: bool = True,
                    log: Optional[Callable[[str], None]] = None) -> CheckpointState:
    """Restore a checkpoint (a ``step_N`` directory or a root: its newest intact one) into `model` /
    `optimizer`.

    Applies this rank's RNG state when `restore_rng` (read and checked before anything is loaded).
    The optimiser's hyperparameters are the saved ones (`apply_optimizer_defaults` sets the
    optimizer's own back). strict: the saved model state must hold
    exactly the model's keys (missing and unexpected ones are named; shapes must match whatever
    `strict`); the optimiser state must name exactly the optimizer's parameters, whatever `strict`.
    Both are checked before anything is loaded, so a refused checkpoint leaves `model` and
    `optimizer` as they were. verify: check the manifest's digests, field types and steps first
    (False: the caller just did, e.g. through `resume_checkpoint`). Collective when torch.distributed
    is initialised: each rank reads the saved chunks that overlap its own shards
    (`mempo.train.sharded`), so a checkpoint written by N ranks loads on M ranks, or into a plain
    single-process model (an older full-state checkpoint: rank 0 reads it and broadcasts). A rank
    without an RNG file (another world size) keeps its RNG state, with a warning. A format-1
    checkpoint (no digests) loads with a warning. Returns a CheckpointState. CheckpointError (naming
    the file) when the checkpoint is missing, damaged, or does not fit `model` / `optimizer`.
    """
    path = Path(path)
    if optimizer is not None and model is None:
        raise ValueError("loading an optimizer needs its model (parameter names come from the model)")
    if verify or not (_STEP_DIR.match(path.name) and path.is_dir()):
        path = resolve_checkpoint(path, log=log, model=model if strict else None,
                                  optimizer=optimizer if strict else None)
    if not strict or not verify:  # resolve_checkpoint checked the keys when strict and verifying
        _from_rank0(lambda: check_fits(path, model, optimizer, model_keys=strict))
    rank = _rank()
    state = _read_state(path)
    try:  # checked before anything is loaded, on every rank: a refusal leaves the model as it was
        rng_state, refused = _load_rng(path, rank), None
    except CheckpointError as error:
        rng_state, refused = None, error
    if not _all_ranks_ok(refused is None):
        raise refused or CheckpointError(f"{path / 'rng'}: another rank's RNG file is not an RNG state")
    if is_legacy_checkpoint(path):
        load_full_state_files(path, model, optimizer, strict=strict)
    else:
        if model is not None:
            load_model_shards(path / MODEL_DIR, model, strict=strict)
        if optimizer is not None:
            load_optimizer_shards(path / OPTIMIZER_DIR, model, optimizer)
    if restore_rng and rng_state is not None:
        try:
            restore_rng_state(rng_state)
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as error:
            raise CheckpointError(f"{path / 'rng' / f'rank_{rank:05d}.pt'}: not an RNG state "
                                  f"({short_error(error)})") from None
    _barrier()
    return CheckpointState(path=path, step=int(state["step"]), data_state=state.get("data_state"),
                           extra=state.get("extra"), rng_state=rng_state)
