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
from support import mounts  # noqa: E402
from support.checkpoints import (index_with_payload, plant, remanifest, rewrite_with_manifest,  # noqa: E402
                                 torch_payload, value_with_payload)
from support.paths import REPO  # noqa: E402

CONFIG = REPO / "configs" / "tiny.yaml"
# The fewest steps that exercise a fallback: checkpoints at steps 1 and 2, kills in the second save.
TINY = ["data.questions_per_step=1", "rollout.group_size=2", "rollout.max_turns=2",
        "rollout.max_new_tokens_per_round=24", "synthetic.world_entities=20", "trainer.tensorboard=false",
        "trainer.progress=false", "trainer.total_steps=2", "trainer.save_every=1", "trainer.keep_last=3"]
PHASES = ["tokenizer", "config", "model@2", "optimizer@2", "rng@2", "state@2", "manifest@2", "rename@2",
          "latest@2", "final-model"]

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _mempo(argv: list, log: Path, *, fault: str = None, prepare=None, seconds: int = 300):
    """`mempo <argv>` in a forked child; (exit code or -signal, output text). prepare: called in the
    child first (its own mounts, limits, patches); a callable it returns is called with the exit code
    after the command. A child still running after `seconds` dies of SIGALRM (a hang fails the test)."""
    pid = os.fork()
    if pid == 0:  # the child: a `mempo` process
        code = 1
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = sys.stderr = open(fd, "w", buffering=1)  # pytest replaced the parent's streams
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(seconds)
            if fault:
                os.environ[FAULT_ENV] = fault
            else:
                os.environ.pop(FAULT_ENV, None)
            after = prepare() if prepare is not None else None
            code = mempo.apps.cli.main(argv)
            if after is not None:
                after(code)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return code, log.read_text()


def _run(out: Path, *extra: str, fault: str = None, prepare=None):
    """`mempo train` on `out` in a forked child; (exit code or -signal, stderr text)."""
    log = out.parent / f"{out.name}.{os.getpid()}.{len(list(out.parent.iterdir()))}.log"
    argv = ["train", "--config", str(CONFIG), "--out", str(out), "--threads", "1", *TINY, *extra]
    return _mempo(argv, log, fault=fault, prepare=prepare)


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


# ------------------------------------------------------------------------------------------------
# issue 47: what a resume loads is data, is listed, is of its shape; a FIFO is not waited on
# ------------------------------------------------------------------------------------------------
def _plant_index(step: Path, name: str, marker: Path) -> str:
    plant(step, name, index_with_payload(step / name, marker))
    return "refused: it names pathlib.Path.touch"


def _plant_rng(step: Path, name: str, marker: Path) -> str:
    plant(step, name, torch_payload(marker))
    return "cannot be loaded (UnpicklingError"


def _plant_value(step: Path, name: str, marker: Path) -> str:
    key = value_with_payload(step / "optimizer", marker)
    remanifest(step, name)
    remanifest(step, "optimizer/.metadata")
    return f"the value of {key} cannot be loaded (it names "


def _rng_tensor(step: Path, name: str, marker: Path) -> str:
    torch.save(torch.arange(624), step / name)
    remanifest(step, name)
    return "not an RNG state (a Tensor, not a dict of RNG states)"


def _flip_unlisted(step: Path, name: str, marker: Path) -> str:
    _damage(step / name, "flip")
    manifest = json.loads((step / "COMPLETE").read_text())
    del manifest["files"][name]
    (step / "COMPLETE").write_text(json.dumps(manifest))
    return "not listed in the manifest"


def _fifo(step: Path, name: str, marker: Path) -> str:
    (step / name).unlink()
    os.mkfifo(step / name)
    return "a FIFO, not a regular file"


TAMPERED = {  # case: (file of step 2, how, and the reason the note gives)
    "model-index-runs-code": ("model/.metadata", _plant_index),  # K18
    "optimizer-index-runs-code": ("optimizer/.metadata", _plant_index),
    "optimizer-value-runs-code": ("optimizer/__0_0.distcp", _plant_value),
    "rng-file-runs-code": ("rng/rank_00000.pt", _plant_rng),
    "rng-file-holds-a-tensor": ("rng/rank_00000.pt", _rng_tensor),  # K15
    "shard-flipped-and-unlisted": ("model/__0_0.distcp", _flip_unlisted),  # K27
    "manifest-is-a-fifo": ("COMPLETE", _fifo),  # K26
}


@pytest.mark.parametrize("case", TAMPERED)
def test_a_tampered_checkpoint_is_skipped_and_the_resume_is_exact(reference, tmp_path, case):
    """Issue 47 (K18, K15, K27, K26): a pickle planted where a resume reads (the manifest rewritten
    to match, as anyone who can write the directory can do) ran its code before the step was
    refused; an RNG file holding a tensor was an IndexError after the model had loaded; a flipped
    shard missing from the manifest loaded silently; a FIFO manifest hung. Each now skips step 2
    with a line naming the file and the reason, runs no code (the marker never appears) and ends
    where the uninterrupted run did."""
    name, tamper = TAMPERED[case]
    out = _copy_run(reference, tmp_path / "run")
    step = out / "checkpoints" / "step_00000002"
    marker = tmp_path / "PWNED"
    reason = tamper(step, name, marker)
    code, log = _run(out, "--resume")
    assert code == 0, log[-3000:]
    assert "Traceback" not in log and not marker.exists()
    assert f"skipping checkpoint step_00000002: {step / name}: " in log and reason in log and "(step 1)" in log
    _assert_same_run(out, reference)


def test_export_refuses_a_planted_index_and_runs_no_code(reference, tmp_path):
    """`mempo export` of a checkpoint whose model index was replaced by a pickle that runs code (and
    re-manifested): one line naming the file and the class, exit 2, no marker, nothing written."""
    out = _copy_run(reference, tmp_path / "run")
    step = out / "checkpoints" / "step_00000002"
    marker = tmp_path / "PWNED"
    _plant_index(step, "model/.metadata", marker)
    for checkpoint in (step, out / "checkpoints"):
        code, log = _mempo(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "exported")],
                           tmp_path / "export.log")
        lines = [line for line in log.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1, log[-3000:]
        assert lines[0].startswith(f"mempo export: {step / 'model' / '.metadata'}: refused: it names "
                                   f"pathlib.Path.touch")
        assert not marker.exists() and not (tmp_path / "exported").exists()


# ------------------------------------------------------------------------------------------------
# issue 47: a save that fails loses nothing and says why in one line
# ------------------------------------------------------------------------------------------------
def _intact(out: Path, newest: int) -> None:
    """Every checkpoint of the reference verifies, the pointer names step `newest`, no temp is left."""
    from mempo.train.checkpoint import verify_checkpoint

    root = out / "checkpoints"
    assert (root / "latest").read_text() == f"step_{newest:08d}\n"
    for step in range(1, newest + 1):
        verify_checkpoint(root / f"step_{step:08d}")
    assert not [p.name for p in root.iterdir() if p.name.startswith(".tmp")]


def _one_line(code: int, log: str) -> str:
    lines = [line for line in log.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in log and len(lines) == 1, log[-3000:]
    return lines[0]


def _limit_file_size(limit: int):
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def _latest_a_directory(out: Path):
    (out / "checkpoints" / "latest").unlink()
    (out / "checkpoints" / "latest").mkdir()


def _read_only_checkpoints(out: Path):
    def prepare():
        mounts.private_namespace()
        mounts.read_only(out / "checkpoints")
    return prepare


REFUSED_AT_START = {  # case: (prepare the copy, prepare the child, what the one line says)
    "latest-a-directory": (_latest_a_directory, None,  # K12
                           "checkpoints/latest: a directory where the checkpoint pointer file goes (EISDIR)"),
    "read-only-checkpoints": (None, _read_only_checkpoints,  # K25
                              "checkpoints cannot be saved under {root}: {root}/.tmp-probe-"),
    "file-size-limit": (None, lambda out: _limit_file_size(500_000),  # K23: `ulimit -f`
                        "checkpoints cannot be saved under {root}: the file-size limit (ulimit -f) is 500000 bytes"),
}


@pytest.mark.parametrize("case", REFUSED_AT_START)
def test_a_save_that_cannot_work_is_refused_before_the_first_step(reference, tmp_path, case):
    """Issue 47 (K12, K25, K23): `latest` a directory, a read-only checkpoints folder, a file-size
    limit below a shard: each trained a step and then ended in a traceback, the step lost; each is
    now one line naming the path and the errno, exit 2, before any step, the checkpoints intact."""
    change, child, said = REFUSED_AT_START[case]
    if case == "read-only-checkpoints" and not mounts.available():
        pytest.skip("no mount namespaces here (root or CAP_SYS_ADMIN needed)")
    out = _copy_run(reference, tmp_path / "run")
    if change is not None:
        change(out)
    rows = (out / "metrics.jsonl").read_text()
    code, log = _run(out, "trainer.total_steps=3", "--resume", prepare=child(out) if child else None)
    line = _one_line(code, log)
    assert line.startswith("mempo train: ") and said.format(root=out / "checkpoints") in line
    assert {"latest-a-directory": "(EISDIR)", "read-only-checkpoints": "Read-only file system (EROFS)",
            "file-size-limit": "(EFBIG)"}[case] in line
    assert (out / "metrics.jsonl").read_text() == rows  # no step was trained
    if case == "latest-a-directory":
        (out / "checkpoints" / "latest").rmdir()
        (out / "checkpoints" / "latest").write_text("step_00000002\n")
    _intact(out, 2)


def _fail_at_step_3(kind: str, out: Path):
    """In the child: the save of step 3 meets a real refusal from the file system (a file-size limit
    set, or the disk filled, just before it) or, for `replace`, publishing raises EROFS."""
    import errno

    import mempo.train.checkpoint as checkpoint
    import mempo.train.trainer as trainer

    def prepare():
        if kind == "disk-full":  # the run on a 64 MB tmpfs of its own
            mounts.private_namespace()
            saved = out.parent / "saved"
            os.rename(out, saved)
            out.mkdir()
            mounts.small_disk(out, 64 << 20)
            import shutil

            shutil.copytree(saved, out, dirs_exist_ok=True)
        real_start, real_replace = trainer.start_checkpoint, checkpoint.os.replace

        def start(root, step, *args, **kwargs):
            if step == 3 and kind == "file-size-limit":
                _limit_file_size(400_000)()  # past the startup check; the shards are bigger
            if step == 3 and kind == "disk-full":
                with open(out / "filler", "wb") as handle:
                    try:
                        while True:
                            handle.write(b"\0" * (1 << 20))
                            handle.flush()
                    except OSError:
                        pass
            return real_start(root, step, *args, **kwargs)

        def replace(source, target):
            if os.path.basename(target) == "step_00000003":
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(source), None, str(target))
            return real_replace(source, target)

        trainer.start_checkpoint = start
        checkpoint.os.replace = replace if kind == "publish-refused" else real_replace

        def after(code):  # what is left, seen from inside the namespace (a tmpfs goes with it)
            root = out / "checkpoints"
            (out.parent / "after.json").write_text(json.dumps({
                "latest": (root / "latest").read_text(), "entries": sorted(p.name for p in root.iterdir())}))
            if kind == "disk-full":
                (out / "filler").unlink()
                _intact(out, 2)
        return after
    return prepare


@pytest.mark.parametrize("kind", ["publish-refused", "file-size-limit", "disk-full"])
def test_a_save_refused_mid_run_is_one_line_and_the_resume_repeats_the_step(reference, tmp_path, kind):
    """Issue 47 (K25, K23): a save the file system refuses after the start-up checks passed (a
    read-only publish, a real EFBIG, a real full disk) ends the run in one line naming the path and
    the errno, exit 2: the unpublished directory is removed, the checkpoints before it stand and the
    pointer names the newest of them; `--resume` then trains the lost step again, exactly (its
    metrics row equals the one the failed run logged)."""
    if kind == "disk-full" and not mounts.available():
        pytest.skip("no mount namespaces here (root or CAP_SYS_ADMIN needed)")
    out = _copy_run(reference, tmp_path / "run")
    code, log = _run(out, "trainer.total_steps=3", "--resume", prepare=_fail_at_step_3(kind, out))
    lines = [line for line in log.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in log, log[-3000:]
    assert [line for line in lines if line.startswith("mempo train:")] == lines[-1:]  # the run's notes, then it
    line = lines[-1]
    assert line.startswith("mempo train: checkpoint step 3 not saved: ")
    assert {"publish-refused": "Read-only file system (EROFS)",
            "file-size-limit": "__0_0.distcp: File too large (the file-size limit, ulimit -f, is 400000 bytes) (EFBIG)",
            "disk-full": "No space left on device"}[kind] in line
    assert line.endswith("the checkpoints saved before it are intact (newest: step_00000002)")
    after = json.loads((tmp_path / "after.json").read_text())
    assert after["latest"] == "step_00000002\n"
    assert [e for e in after["entries"] if e != "filler"] == ["latest", "step_00000001", "step_00000002"]
    if kind == "disk-full":
        assert "(ENOSPC)" in line
        return  # the run lived on the tmpfs, gone with its namespace; checked inside (`after`)
    _intact(out, 2)
    failed = _comparable(out)
    assert [row["step"] for row in failed] == [1, 2, 3]  # the step trained and logged before its save failed
    code, log = _run(out, "trainer.total_steps=3", "--resume")
    assert code == 0 and "(step 2)" in log, log[-3000:]
    again = _comparable(out)
    assert [row["step"] for row in again] == [1, 2, 3] and again[2].keys() == failed[2].keys()
    for key in failed[2]:
        assert again[2][key] == pytest.approx(failed[2][key], rel=1e-6, abs=1e-9), key
    _intact(out, 3)
