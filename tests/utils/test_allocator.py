"""`mempo.utils.allocator.keep_freed_memory`: glibc malloc then serves a large block from the heap
(no mmap), a run's numbers stay bit-identical, MEMPO_KEEP_FREED_MEMORY=0 leaves the allocator as it
is. Each case runs in a fresh interpreter: the setting is per process and cannot be undone."""
import json
import os
import platform
import subprocess
import sys

import pytest

from support.paths import REPO

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's mallopt")

# 64 MiB allocated and held; glibc's mallinfo2 says how many bytes that added to the mmap'd blocks (hblkhd)
MMAP_PROBE = """
import ctypes, json, sys
import torch
from mempo.utils.allocator import allocator_setting, keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
line = keep_freed_memory() if sys.argv[1] == "keep" else allocator_setting()
before = libc.mallinfo2().hblkhd  # blocks mmap'd at import, before the setting
block = torch.empty(16 << 20, dtype=torch.float32)
print(json.dumps({"line": line, "mmapped": libc.mallinfo2().hblkhd - before, "again": keep_freed_memory() == line
                  if sys.argv[1] == "keep" else True}))
"""

# five AdamW steps of a tiny model on fixed data: the losses and a parameter checksum, exactly
TRAIN_PROBE = """
import json, sys
import torch
from mempo.utils.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    keep_freed_memory()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Embedding(512, 32), torch.nn.Linear(32, 512))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
ids = torch.randint(0, 512, (64, 129))
losses = []
for _ in range(5):
    logits = model(ids[:, :-1])  # [64, 128, 512]: 16 MiB, an mmap'd block by default
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 512), ids[:, 1:].reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
print(json.dumps({"losses": losses, "sum": sum(float(p.double().sum()) for p in model.parameters())}))
"""


def _probe(code: str, mode: str, **env: str) -> dict:
    run_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    out = subprocess.run([sys.executable, "-c", code, mode], env=run_env, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_keep_freed_memory_serves_large_blocks_from_the_heap():
    kept = _probe(MMAP_PROBE, "keep")
    default = _probe(MMAP_PROBE, "default")
    assert kept["line"].startswith("glibc malloc keeps freed memory (no mmap'd blocks"), kept["line"]
    assert kept["again"]  # a second call says what the first did
    assert kept["mmapped"] == 0
    assert default["line"] == "as the C library sets it"
    assert default["mmapped"] >= 64 << 20  # the same block, mmap'd without the setting


def test_switched_off_by_the_environment():
    off = _probe(MMAP_PROBE, "keep", MEMPO_KEEP_FREED_MEMORY="0")
    assert off["line"] == "unchanged (MEMPO_KEEP_FREED_MEMORY=0)"
    assert off["mmapped"] >= 64 << 20


def test_training_is_bit_identical():
    kept = _probe(TRAIN_PROBE, "keep")
    default = _probe(TRAIN_PROBE, "default")
    assert kept == default  # exact float equality of every loss and of the parameters
    assert len(kept["losses"]) == 5 and kept["losses"][-1] < kept["losses"][0]
