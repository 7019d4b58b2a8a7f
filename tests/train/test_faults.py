"""Fault injection on a real `mempo train` run: kill -9 at every phase of writing a run directory
(the tokenizer, config.yaml, each checkpoint file, the manifest, the rename, the latest pointer,
the final model), and damage to each checkpoint file; every `--resume` afterwards is exact (the
metrics and the weights equal an uninterrupted run's) or refused with a reason naming the file.

The kills use the test-only hook `mempo.utils.atomic.fault_point` (``MEMPO_FAULT_INJECT=<phase>[@<n>]``).
Each run is a child process forked from the test after the heavy imports (torch, transformers,
mempo), so the many runs cost their training only; a killed child dies of a real SIGKILL.
"""
import json
import os
import signal
import sys
import traceback
from pathlib import Path

import pytest
import torch

import mempo.apps.cli
from mempo.utils.atomic import FAULT_ENV

# Imported before forking, so the children start warm.
import mempo.model.builtin  # noqa: E402,F401
import mempo.eval  # noqa: E402,F401
import mempo.train.actor  # noqa: E402,F401
import mempo.train.step  # noqa: E402,F401
import mempo.train.trainer  # noqa: E402,F401
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM  # noqa: E402,F401
from mempo.train.sharded import read_tensors, tensor_specs  # noqa: E402
from support.checkpoints import rewrite_with_manifest  # noqa: E402
from support.paths import REPO  # noqa: E402

CONFIG = REPO / "configs" / "tiny.yaml"
# The fewest steps that exercise a fallback: checkpoints at steps 1 and 2, kills in the second save.
TINY = ["data.questions_per_step=1", "rollout.group_size=2", "rollout.max_turns=2",
        "rollout.max_new_tokens_per_round=24", "synthetic.world_entities=20", "trainer.tensorboard=false",
        "trainer.progress=false", "trainer.total_steps=2", "trainer.save_every=1", "trainer.keep_last=3"]
PHASES = ["tokenizer", "config", "model@2", "optimizer@2", "rng@2", "state@2", "manifest@2", "rename@2",
          "latest@2", "final-model"]

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _run(out: Path, *extra: str, fault: str = None):
    """`mempo train` on `out` in a forked child; (exit code or -signal, stderr text)."""
    log = out.parent / f"{out.name}.{os.getpid()}.{len(list(out.parent.iterdir()))}.log"
    argv = ["train", "--config", str(CONFIG), "--out", str(out), "--threads", "1", *TINY, *extra]
    pid = os.fork()
    if pid == 0:  # the child: a `mempo train` process
        code = 1
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = sys.stderr = open(fd, "w", buffering=1)  # pytest replaced the parent's streams
            if fault:
                os.environ[FAULT_ENV] = fault
            else:
                os.environ.pop(FAULT_ENV, None)
            code = mempo.apps.cli.main(argv)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return code, log.read_text()


def _comparable(out: Path):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not (k == "time" or k.startswith(("time/", "perf/")))} for r in rows]


def _weights(out: Path, step: int = 2):
    model_dir = out / "checkpoints" / f"step_{step:08d}" / "model"
    return read_tensors(model_dir, tensor_specs(model_dir))


def _assert_same_run(out: Path, reference: Path):
    a, b = _comparable(reference), _comparable(out)
    assert [r["step"] for r in b] == [r["step"] for r in a] == [1, 2]
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for key in ra:
            assert rb[key] == pytest.approx(ra[key], rel=1e-6, abs=1e-9), (ra["step"], key)
    wa, wb = _weights(reference), _weights(out)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (out / "model" / "config.json").is_file() and (out / "tokenizer" / "tokenizer.json").is_file()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".tmp")]
    assert not [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("faults") / "reference"
    code, log = _run(out)
    assert code == 0, log[-3000:]
    return out


@pytest.mark.parametrize("phase", PHASES)
def test_kill_at_each_phase_then_resume_is_exact(reference, tmp_path, phase):
    out = tmp_path / "run"
    code, log = _run(out, fault=phase)
    assert code == -signal.SIGKILL, log[-3000:]
    code, log = _run(out, "--resume")
    assert code == 0, log[-3000:]
    assert "Traceback" not in log
    if phase in ("tokenizer", "config"):  # no checkpoint was written: a new run
        assert "starting a new run" in log
    elif phase == "final-model":  # every checkpoint was complete
        assert "resuming from" in log and "step_00000002" in log
    else:  # the second save was killed: back to step 1, saying why when the torn one is visible
        assert "(step 1)" in log
        if phase == "latest@2":
            assert "skipping checkpoint" in log and "step_00000002" in log
    _assert_same_run(out, reference)


def _damage(file: Path, how: str) -> None:
    data = file.read_bytes()
    if how == "truncate":
        file.write_bytes(data[:len(data) // 2])
    elif how == "empty":
        file.write_bytes(b"")
    elif how == "flip":
        middle = len(data) // 2
        file.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:])
    else:
        file.unlink()


def _copy_run(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target


def test_damaged_latest_checkpoint_resumes_exactly_from_the_previous_one(reference, tmp_path):
    """Flipped bytes in the newest model shard (the issue's silent case: DCP itself keeps no
    checksum): `--resume` names the file, resumes from step 1 and ends where the uninterrupted run did."""
    out = _copy_run(reference, tmp_path / "run")
    _damage(out / "checkpoints" / "step_00000002" / "model" / "__0_0.distcp", "flip")
    code, log = _run(out, "--resume")
    assert code == 0, log[-3000:]
    assert "step_00000002/model/__0_0.distcp: damaged" in log and "(step 1)" in log
    _assert_same_run(out, reference)


@pytest.mark.parametrize("name,how", [("model/__0_0.distcp", "empty"), ("rng/rank_00000.pt", "truncate"),
                                      ("state.json", "delete"), ("optimizer/__0_0.distcp", "flip"),
                                      ("model/.metadata", "truncate")])
def test_no_intact_checkpoint_is_refused_in_one_line(reference, tmp_path, name, how):
    out = _copy_run(reference, tmp_path / "run")
    for step in (1, 2):
        _damage(out / "checkpoints" / f"step_{step:08d}" / name, how)
    code, log = _run(out, "--resume")
    lines = [line for line in log.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in log
    assert len(lines) == 1 and lines[0].startswith("mempo train: no intact checkpoint under")
    assert f"step_00000002/{name}" in lines[0] and f"step_00000001/{name}" in lines[0]


def test_a_zero_byte_tokenizer_left_by_an_old_crash_is_rebuilt(reference, tmp_path):
    """Before the tokenizer was written atomically, kill -9 left a zero-byte tokenizer.json that
    broke every later run with a JSONDecodeError; such a directory is now retrained (deterministic)."""
    out = _copy_run(reference, tmp_path / "run")
    (out / "tokenizer" / "tokenizer.json").write_bytes(b"")
    code, log = _run(out, "--resume")
    assert code == 0, log[-3000:]
    assert "unreadable saved tokenizer" in log and "resuming from" in log
    _assert_same_run(out, reference)


def _drop_first_key(index: dict) -> None:
    index.pop(sorted(index)[0])


@pytest.mark.parametrize("name,change,reason", [
    ("model/.metadata", _drop_first_key, "does not fit this model (missing key(s)"),
    ("state.json", lambda state: state.update(step=99), "records step 99, the manifest step 2"),
], ids=["model-missing-a-parameter", "state-step-99"])
def test_a_partial_or_misnumbered_checkpoint_is_skipped_and_the_resume_is_exact(reference, tmp_path, name, change,
                                                                                 reason):
    """Issue 21 case 2: a model state missing a parameter, or a state.json saying step 99 inside
    step_00000002, each with its manifest rewritten to match, used to resume silently (the
    parameter left at its initial value; "trained to step 99", nothing trained). Now the checkpoint
    is skipped with its reason and the run resumes from step 1, ending where the reference did."""
    out = _copy_run(reference, tmp_path / "run")
    rewrite_with_manifest(out / "checkpoints" / "step_00000002", name, change)
    code, log = _run(out, "--resume")
    assert code == 0, log[-3000:]
    assert "Traceback" not in log and "step 99" not in log.replace(reason, "")
    assert f"step_00000002/{name}" in log and reason in log and "(step 1)" in log
    _assert_same_run(out, reference)
