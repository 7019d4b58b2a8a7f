"""Checkpoint damage that no digest sees: a file edited and its manifest entry rewritten to match
(used by tests/train/test_checkpoint.py and tests/train/test_faults.py)."""
import json
import pickle
from pathlib import Path

import torch

from mempo.utils.digest import sha256_file


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
        data = pickle.loads(file.read_bytes())
        change(data.state_dict_metadata)
        file.write_bytes(pickle.dumps(data))
    else:
        data = torch.load(file, weights_only=True)
        change(data)
        torch.save(data, file)
    manifest_path = Path(checkpoint) / "COMPLETE"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][name] = {"bytes": file.stat().st_size, "sha256": sha256_file(file)}
    manifest_path.write_text(json.dumps(manifest))
