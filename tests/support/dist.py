"""Multi-process runs for the FSDP2 tests: a free loopback port and a torchrun launch (gloo) of one
of the worker scripts of this package."""
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import python_path_env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(worker: Path, out_dir: Path, nproc: int = 2, timeout: int = 150, what: str = "the 2-process run") -> None:
    """``torchrun --nproc_per_node=<nproc> <worker> <out_dir>`` on gloo over loopback, from the
    directory above `out_dir`; fails the test on a non-zero exit (with the output's tail) or a timeout."""
    env = python_path_env(dict(os.environ, GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1"))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(worker), str(out_dir)]
    proc = subprocess.Popen(cmd, env=env, cwd=Path(out_dir).parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{what} timed out")
    assert proc.returncode == 0, output.decode(errors="replace")[-4000:]
