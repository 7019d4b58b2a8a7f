"""Checkpoint verification spread over the ranks (tests/train/test_sharded.py), under torchrun:
``torchrun --nproc_per_node=2 tests/support/verify_worker.py OUT_DIR``. ``OUT_DIR/job.json`` names
checkpoint roots (``{"roots": {name: path}}``); every rank looks for the newest intact checkpoint of
each (`newest_intact_checkpoint`, collective) and writes ``OUT_DIR/rank<r>.json``: per root, the
checkpoint found or the error, the files this rank hashed (relative to the checkpoint) and what it
logged."""
import json
import sys
from pathlib import Path

import torch

from mempo.train import checkpoint as ckpt
from mempo.train.actor import init_distributed, shutdown_distributed


def main(out_dir: Path) -> None:
    info = init_distributed()
    roots = json.loads((out_dir / "job.json").read_text())["roots"]
    hashed: list[str] = []
    plain = ckpt.sha256_file

    def counted(path):
        hashed.append(Path(path).as_posix())
        return plain(path)

    ckpt.sha256_file = counted  # the module's own name: what verify_checkpoint calls
    result = {}
    for name, root in roots.items():
        hashed.clear()
        notes: list[str] = []
        try:
            found, error = str(ckpt.newest_intact_checkpoint(root, log=notes.append)), None
        except ckpt.CheckpointError as failure:
            found, error = None, str(failure)
        result[name] = {"found": found, "error": error, "notes": notes,
                        "hashed": sorted(p.split("/step_", 1)[1].split("/", 1)[1] for p in hashed)}
    (out_dir / f"rank{info.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]))
    shutdown_distributed()
