"""Checkpoint damage that no digest sees: a file edited and its manifest entry rewritten to match
(used by tests/train/test_checkpoint.py and tests/train/test_faults.py), and pickles that would run
code when read (the planted-payload tests: a loader that unpickles unrestricted makes a marker file)."""
import io
import json
import pathlib
import pickle
from pathlib import Path

import torch

from mempo.utils.digest import sha256_file


def remanifest(checkpoint: Path, name: str) -> None:
    """Rewrite checkpoint file `name`'s manifest entry (``COMPLETE``) so that its size and digest
    match the file as it is now, as anyone who can write the directory can."""
    file = Path(checkpoint) / name
    manifest_path = Path(checkpoint) / "COMPLETE"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][name] = {"bytes": file.stat().st_size, "sha256": sha256_file(file)}
    manifest_path.write_text(json.dumps(manifest))


def rewrite_with_manifest(checkpoint: Path, name: str, change) -> None:
    """Edit checkpoint file `name` (a torch file: `change` edits its loaded object; a .json file: its
    dict; a DCP ``.metadata`` index: its ``state_dict_metadata`` dict of saved keys) and rewrite its
    manifest entry (``COMPLETE``) so that the size and digest match."""
    file = Path(checkpoint) / name
    if name.endswith(".json"):
        data = json.loads(file.read_text())
        change(data)
        file.write_text(json.dumps(data))
    elif name.endswith(".metadata"):
        data = pickle.loads(file.read_bytes())  # a file this test wrote
        change(data.state_dict_metadata)
        file.write_bytes(pickle.dumps(data))
    else:
        data = torch.load(file, weights_only=True)
        change(data)
        torch.save(data, file)
    remanifest(checkpoint, name)


class TouchOnLoad:
    """Unpickling it calls ``pathlib.Path.touch(marker)``: a harmless stand-in for ``os.system``."""

    def __init__(self, marker: Path):
        self.marker = Path(marker)

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def touch_payload(marker: Path) -> bytes:
    """A bare pickle that makes `marker` when it is unpickled."""
    return pickle.dumps(TouchOnLoad(marker))


def torch_payload(marker: Path) -> bytes:
    """A torch.save file (zip format) whose pickle makes `marker` when loaded unrestricted
    (``torch.load(weights_only=False)``)."""
    buffer = io.BytesIO()
    torch.save(TouchOnLoad(marker), buffer)
    return buffer.getvalue()


def index_with_payload(index_file: Path, marker: Path) -> bytes:
    """DCP index `index_file` with a `TouchOnLoad` hidden in it (``planner_data``): unpickled
    unrestricted it makes `marker` and still works as the index, so nothing else gives it away."""
    metadata = pickle.loads(Path(index_file).read_bytes())  # a file this test wrote
    metadata.planner_data = {"note": TouchOnLoad(marker)}
    return pickle.dumps(metadata)


def value_with_payload(directory: Path, marker: Path) -> str:
    """In DCP directory `directory` (an optimizer's), point the first ``param_groups.*.lr`` value at
    a `torch_payload` appended to its shard file (the index rewritten to match): DCP's default
    planner would unpickle it unrestricted on load. Returns the value's key."""
    directory = Path(directory)
    index = pickle.loads((directory / ".metadata").read_bytes())  # a file this test wrote
    key = min((i for i in index.storage_data if i.fqn.startswith("param_groups.") and i.fqn.endswith(".lr")),
              key=lambda i: i.fqn)
    info = index.storage_data[key]
    payload = torch_payload(marker)
    shard = directory / info.relative_path
    info.offset, info.length = shard.stat().st_size, len(payload)
    with open(shard, "ab") as handle:
        handle.write(payload)
    (directory / ".metadata").write_bytes(pickle.dumps(index))
    return key.fqn


def plant(checkpoint: Path, name: str, data: bytes) -> None:
    """Replace checkpoint file `name` with `data` and re-manifest it (`remanifest`)."""
    (Path(checkpoint) / name).write_bytes(data)
    remanifest(checkpoint, name)
