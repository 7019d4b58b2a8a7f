"""mempo.train.checkpoint (round trip, atomicity under crashes, RNG restore, keep-last-K, background
writes) and
mempo.train.logging (metrics.jsonl that survives resume, TensorBoard fallback, timers, progress)."""
import errno
import importlib.util
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest
import torch

from mempo.train import checkpoint as ckpt
from mempo.train import logging as mlog
from mempo.train.checkpoint import (CheckpointError, latest_checkpoint, list_checkpoints, load_checkpoint,
                                    prune_checkpoints, save_checkpoint)
from mempo.train.logging import MetricsLogger, StageTimer, read_metrics
from mempo.utils.progress import progress
from mempo.utils.digest import sha256_file
from support.checkpoints import rewrite_with_manifest


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def trained(seed=0):
    model = make_model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        model(torch.randn(4, 6)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def test_round_trip_restores_model_optimizer_and_state(tmp_path):
    model, optimizer = trained(0)
    path = save_checkpoint(tmp_path, 7, model, optimizer, data_state={"epoch": 1, "cursor": 42},
                           extra={"config": {"lr": 0.01}})
    assert path.name == "step_00000007" and (path / "COMPLETE").is_file()
    assert (tmp_path / "latest").read_text() == "step_00000007\n"
    fresh, fresh_optimizer = make_model(1), None
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    state = load_checkpoint(tmp_path, fresh, fresh_optimizer)
    assert state.step == 7 and state.path == path
    assert state.data_state == {"epoch": 1, "cursor": 42} and state.extra == {"config": {"lr": 0.01}}
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    # the optimizer continues identically
    x = torch.randn(4, 6)
    for m, o in ((model, optimizer), (fresh, fresh_optimizer)):
        m(x).square().mean().backward()
        o.step()
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)


def draws():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_rng_restore_reproduces_draws(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    save_checkpoint(tmp_path, 1)
    expected = draws()
    assert draws() != expected
    state = load_checkpoint(tmp_path)
    assert state.rng_state is not None
    assert draws() == expected
    load_checkpoint(tmp_path, restore_rng=False)
    assert draws() != expected


def test_crash_at_rename_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model, optimizer = trained()
    first = save_checkpoint(tmp_path, 1, model, optimizer)
    real_replace = os.replace

    def crash(src, dst):
        if os.path.basename(dst).startswith("step_"):
            raise OSError("simulated crash while publishing")
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", crash)
    with pytest.raises(ckpt.CheckpointWriteError, match=r"^checkpoint step 2 not saved: simulated crash while "
                                                        r"publishing; the checkpoints saved before it are intact "
                                                        r"\(newest: step_00000001\)$"):
        save_checkpoint(tmp_path, 2, model, optimizer)
    monkeypatch.setattr(ckpt.os, "replace", real_replace)
    temp = tmp_path / ".tmp-step_00000002"
    assert not temp.exists()  # fully written, never published, removed
    assert latest_checkpoint(tmp_path) == first
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    save_checkpoint(tmp_path, 2, model, optimizer)
    assert latest_checkpoint(tmp_path).name == "step_00000002" and not temp.exists()


def test_crash_while_writing_files_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model, optimizer = trained()
    first = save_checkpoint(tmp_path, 1, model, optimizer)
    real_save = ckpt.save_optimizer_shards

    def half_then_crash(directory, *args, **kwargs):  # the optimizer's shards: leave a torn file behind
        real_save(directory, *args, **kwargs)
        shard = directory / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[:100])
        raise OSError("simulated crash in the middle of the optimizer's shards")

    monkeypatch.setattr(ckpt, "save_optimizer_shards", half_then_crash)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(tmp_path, 2, model, optimizer)
    assert latest_checkpoint(tmp_path) == first
    assert not (tmp_path / "step_00000002").exists()


def _adam_state(optimizer):
    return {i: {k: v.clone() for k, v in entry.items()} for i, entry in optimizer.state_dict()["state"].items()}


def test_a_background_checkpoint_holds_the_state_of_its_start(tmp_path, monkeypatch):
    """The shards are written from a snapshot taken at the start: an update made while the writer
    is held back does not reach the files; nothing is visible before publish(); one at a time."""
    model, optimizer = trained()
    expected_model = {k: v.clone() for k, v in model.state_dict().items()}
    expected_adam = _adam_state(optimizer)
    release, real_write = threading.Event(), ckpt.write_state

    def held_back(directory, state, process_group=None):
        assert release.wait(60)
        real_write(directory, state, process_group)

    monkeypatch.setattr(ckpt, "write_state", held_back)
    pending = ckpt.start_checkpoint(tmp_path, 3, model, optimizer, data_state={"step": 3}, background=True)
    assert pending.in_flight and latest_checkpoint(tmp_path) is None
    with pytest.raises(RuntimeError, match="step 3 is still unpublished"):
        ckpt.start_checkpoint(tmp_path, 4, model, optimizer, background=True)
    model(torch.randn(4, 6)).square().mean().backward()  # the next step, while the writer waits
    optimizer.step()
    assert not torch.equal(model[0].weight, expected_model["0.weight"])
    release.set()
    path = pending.publish()
    assert path.name == "step_00000003" and latest_checkpoint(tmp_path) == path
    ckpt.verify_checkpoint(path)
    with pytest.raises(RuntimeError, match="already published"):
        pending.publish()
    fresh = make_model(1)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    assert load_checkpoint(path, fresh, fresh_optimizer).data_state == {"step": 3}
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in expected_model.items())
    loaded = _adam_state(fresh_optimizer)
    assert loaded.keys() == expected_adam.keys()
    for index, entry in expected_adam.items():
        assert all(torch.equal(loaded[index][k], v) for k, v in entry.items()), index


def test_a_failed_background_write_publishes_nothing_and_frees_the_writer(tmp_path, monkeypatch):
    model, optimizer = trained()
    first = save_checkpoint(tmp_path, 1, model, optimizer)

    def disk_full(directory, state, process_group=None):
        raise OSError(f"{directory}: no space left on device (simulated)")

    monkeypatch.setattr(ckpt, "write_state", disk_full)
    pending = ckpt.start_checkpoint(tmp_path, 2, model, optimizer, background=True)
    with pytest.raises(OSError, match="no space left"):
        pending.publish()
    assert latest_checkpoint(tmp_path) == first and not (tmp_path / "step_00000002").exists()
    ckpt.start_checkpoint(tmp_path, 2, model, optimizer, background=True).abandon()  # a failing run's way out
    assert latest_checkpoint(tmp_path) == first and not (tmp_path / "step_00000002").exists()
    monkeypatch.undo()
    assert ckpt.start_checkpoint(tmp_path, 2, model, optimizer, background=True).publish().name == "step_00000002"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


KILL_SCRIPT = textwrap.dedent("""
    import sys, torch
    from mempo.train import checkpoint as ckpt
    root = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    ckpt.save_checkpoint(root, 1, model, optimizer, data_state={"step": 1})
    torch.save(model.state_dict(), root + "/expected.pt")
    with torch.no_grad():
        model.weight.add_(1.0)
    # killed by MEMPO_FAULT_INJECT (in the writer's thread for a background save)
    background = sys.argv[2] == "background"
    ckpt.start_checkpoint(root, 2, model, optimizer, data_state={"step": 2}, background=background).publish()
    print("not killed")
""")
CHECKPOINT_PHASES = ["model", "optimizer", "rng", "state", "manifest", "rename", "latest"]
BACKGROUND_PHASES = ["model", "optimizer"]  # the phases the background writer runs


def test_sigkill_at_every_save_phase_resumes_the_previous_checkpoint(tmp_path):
    """MEMPO_FAULT_INJECT=<phase>@2 kills the second save at each phase (torn files where a file is
    being written); the killed save is never chosen, the previous one loads exactly, and the next
    save of that step cleans up and succeeds. The same for a background save killed while its writer
    thread writes the shards."""
    procs = {}
    runs = [(phase, "foreground") for phase in CHECKPOINT_PHASES]
    runs += [(phase, "background") for phase in BACKGROUND_PHASES]
    for phase, mode in runs:
        root = tmp_path / f"{phase}-{mode}"
        root.mkdir()
        env = dict(os.environ, MEMPO_FAULT_INJECT=f"{phase}@2", OMP_NUM_THREADS="1")
        procs[(phase, mode)] = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(root), mode], env=env,
                                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for (phase, mode), proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == -signal.SIGKILL, (phase, mode, err.decode()[-2000:])
        root = tmp_path / f"{phase}-{mode}"
        notes = []
        chosen = ckpt.resume_checkpoint("auto", root, log=notes.append)
        assert chosen.name == "step_00000001", phase
        if phase == "latest":  # renamed into place, the pointer still names step 1: step 2 is skipped, said so
            assert (root / "step_00000002" / "COMPLETE").is_file()
            assert len(notes) == 1 and "step_00000002" in notes[0] and "newer than" in notes[0]
        else:
            assert not (root / "step_00000002").exists() and notes == []
        model = torch.nn.Linear(64, 64)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        state = load_checkpoint(chosen, model, optimizer)
        assert state.step == 1 and state.data_state == {"step": 1}
        expected = torch.load(root / "expected.pt")
        assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items()), phase
        save_checkpoint(root, 2, model, optimizer)
        assert latest_checkpoint(root).name == "step_00000002"
        assert not [p.name for p in root.iterdir() if p.name.startswith(".tmp")], phase
        ckpt.verify_checkpoint(root / "step_00000002")


def test_latest_ignores_incomplete_and_temp_dirs_and_bad_pointer(tmp_path):
    save_checkpoint(tmp_path, 3)
    (tmp_path / "step_00000009").mkdir()  # no marker
    (tmp_path / ".tmp-step_00000010").mkdir()
    assert latest_checkpoint(tmp_path).name == "step_00000003"
    (tmp_path / "latest").write_text("step_00000042\n")  # names a missing dir
    assert latest_checkpoint(tmp_path).name == "step_00000003"
    assert latest_checkpoint(tmp_path / "nothing") is None
    with pytest.raises(CheckpointError, match="nothing: no such checkpoint directory"):
        load_checkpoint(tmp_path / "nothing")


def test_keep_last_k(tmp_path):
    model = make_model()
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, step, model, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [30, 40]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000030", "step_00000040"]
    save_checkpoint(tmp_path, 50, model)  # keep_last None: nothing pruned
    assert len(list_checkpoints(tmp_path)) == 3
    removed = prune_checkpoints(tmp_path, 1)
    assert [p.name for p in removed] == ["step_00000030", "step_00000040"]
    with pytest.raises(ValueError):
        prune_checkpoints(tmp_path, 0)


def test_resave_same_step_replaces_it(tmp_path):
    save_checkpoint(tmp_path, 5, data_state={"v": 1})
    save_checkpoint(tmp_path, 5, data_state={"v": 2})
    assert load_checkpoint(tmp_path).data_state == {"v": 2}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []


def test_state_json_is_readable(tmp_path):
    path = save_checkpoint(tmp_path, 4, data_state=[1, 2], extra=None)
    state = json.loads((path / "state.json").read_text())
    assert state["step"] == 4 and state["world_size"] == 1 and state["data_state"] == [1, 2]


def test_resume_modes_and_checkpoint_step(tmp_path):
    root = tmp_path / "checkpoints"
    assert ckpt.resume_checkpoint("auto", root) is None  # nothing saved yet: a fresh run
    save_checkpoint(root, 3)
    save_checkpoint(root, 6)
    assert ckpt.resume_checkpoint("auto", root).name == "step_00000006"
    assert ckpt.resume_checkpoint(" never ", root) is None
    assert ckpt.resume_checkpoint(str(root / "step_00000003"), tmp_path / "elsewhere").name == "step_00000003"
    with pytest.raises(CheckpointError, match="missing: no such checkpoint directory"):
        ckpt.resume_checkpoint(str(tmp_path / "missing"), root)
    assert ckpt.checkpoint_step(root) == 6 and ckpt.checkpoint_step(root / "step_00000003") == 3


# ------------------------------------------------------------------------------------------------
# metrics logging
# ------------------------------------------------------------------------------------------------
def test_one_json_line_per_step(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(1, {"loss": 0.5, "tokens": 12, "t": torch.tensor(2.0), "nan": math.nan, "ok": True, "tag": "x"})
        logger.log(2, {"loss": 0.25})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["step"] == 1 and first["loss"] == 0.5 and first["tokens"] == 12 and first["t"] == 2.0
    assert first["nan"] is None and first["ok"] is True and first["tag"] == "x" and "time" in first
    with pytest.raises(ValueError, match="reserved"):
        MetricsLogger(tmp_path / "b", tensorboard=False).log(1, {"step": 3})


def test_resume_drops_steps_after_the_checkpoint(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(1, 6):
            logger.log(step, {"loss": float(step)})
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 6, "loss": 6.0')  # torn line of a crashed run
    with MetricsLogger(tmp_path, tensorboard=False, resume_step=3) as logger:
        for step in range(4, 7):
            logger.log(step, {"loss": float(step)})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in records] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    with pytest.warns(RuntimeWarning, match="truncating"):
        MetricsLogger(tmp_path, tensorboard=False).close()
    assert read_metrics(tmp_path / "metrics.jsonl") == []


def test_tensorboard_missing_warns_once(tmp_path, monkeypatch):
    if importlib.util.find_spec("tensorboard") is not None:
        with MetricsLogger(tmp_path, tensorboard=True) as logger:
            logger.log(1, {"loss": 1.0})
        assert any((tmp_path / "tensorboard").iterdir())
        return
    monkeypatch.setattr(mlog, "_warned", set())
    with pytest.warns(RuntimeWarning, match="tensorboard is not installed"):
        MetricsLogger(tmp_path, tensorboard=True).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with MetricsLogger(tmp_path, tensorboard=True, resume_step=0) as logger:
            logger.log(1, {"loss": 1.0})
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["loss"] == 1.0


def test_wandb_missing_is_an_error(tmp_path):
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed")
    with pytest.raises(ImportError, match="pip install wandb"):
        MetricsLogger(tmp_path, tensorboard=False, wandb=True)


def test_disabled_logger_writes_nothing(tmp_path):
    logger = MetricsLogger(tmp_path / "off", tensorboard=False, enabled=False)
    assert logger.log(1, {"a": 1})["a"] == 1
    logger.close()
    assert not (tmp_path / "off").exists()


def test_stage_timer_sums_repeated_stages():
    calls = []
    timer = StageTimer(synchronize=lambda: calls.append(1))
    with timer("rollout"):
        time.sleep(0.01)
    with timer.stage("rollout"):
        time.sleep(0.01)
    with pytest.raises(KeyError):
        with timer("update"):
            raise KeyError("boom")
    seconds = timer.seconds()
    assert list(seconds) == ["rollout", "update"] and seconds["rollout"] >= 0.02
    assert set(timer.metrics()) == {"time/rollout", "time/update"} and len(calls) == 6
    timer.reset()
    assert timer.seconds() == {}


def test_progress_plain_fallback(capsys):
    with progress("scoring", total=4, interval=0.0) as bar:
        for _ in range(4):
            bar.advance()
    err = capsys.readouterr().err
    assert "[scoring] 4/4 (100%)" in err
    with progress("quiet", total=2, enabled=False) as bar:
        bar.advance(2)
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------------------------
# integrity: the manifest, damaged files, fallback, old checkpoints
# ------------------------------------------------------------------------------------------------
SHARD_FILES = ["model/.metadata", "model/__0_0.distcp", "optimizer/.metadata", "optimizer/__0_0.distcp"]
CHECKPOINT_FILES = SHARD_FILES + ["state.json", "rng/rank_00000.pt", "COMPLETE"]
DAMAGES = ["truncate", "empty", "flip", "delete"]


def _damage(file, how):
    data = file.read_bytes()
    if how == "truncate":
        file.write_bytes(data[:len(data) // 2])
    elif how == "empty":
        file.write_bytes(b"")
    elif how == "flip":  # 64 bytes in the middle, as the probe did
        middle = max(0, len(data) // 2 - 32)
        file.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:])
    else:
        file.unlink()


def _two_checkpoints(root):
    model, optimizer = trained(0)
    save_checkpoint(root, 1, model, optimizer, data_state={"step": 1})
    first = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    save_checkpoint(root, 2, model, optimizer, data_state={"step": 2})
    return first


def test_manifest_records_every_file(tmp_path):
    path = save_checkpoint(tmp_path, 3, *trained(0))
    manifest = json.loads((path / "COMPLETE").read_text())
    assert manifest["format"] == 3 and manifest["step"] == 3
    assert sorted(manifest["files"]) == sorted(SHARD_FILES + ["rng/rank_00000.pt", "state.json"])
    import hashlib

    for name, record in manifest["files"].items():
        data = (path / name).read_bytes()
        assert record == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert ckpt.verify_checkpoint(path) == manifest


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_damaged_latest_falls_back_to_the_previous_one_exactly(tmp_path, name, how):
    first = _two_checkpoints(tmp_path)
    damaged = tmp_path / "step_00000002" / name
    _damage(damaged, how)
    notes = []
    chosen = ckpt.resume_checkpoint("auto", tmp_path, log=notes.append)
    assert chosen.name == "step_00000001"
    assert len(notes) == 1 and notes[0].startswith("skipping checkpoint step_00000002")
    if name != "COMPLETE":  # the note names the damaged file
        assert str(damaged) in notes[0]
    model, optimizer = make_model(5), None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = load_checkpoint(chosen, model, optimizer)
    assert state.step == 1 and all(torch.equal(model.state_dict()[k], v) for k, v in first.items())
    # the damaged checkpoint asked for by path is refused, naming the file (no silent fallback)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path / "step_00000002", make_model(5))
    assert str(tmp_path / "step_00000002") in str(error.value) and "\n" not in str(error.value)
    if name != "COMPLETE":
        assert str(damaged) in str(error.value)


def test_no_intact_checkpoint_is_one_error_listing_each(tmp_path):
    _two_checkpoints(tmp_path)
    _damage(tmp_path / "step_00000002" / "model" / "__0_0.distcp", "flip")
    _damage(tmp_path / "step_00000001" / "state.json", "delete")
    notes = []
    with pytest.raises(CheckpointError) as error:
        ckpt.resume_checkpoint("auto", tmp_path, log=notes.append)
    message = str(error.value)
    assert message.startswith(f"no intact checkpoint under {tmp_path}")
    assert "step_00000002/model/__0_0.distcp: damaged" in message and "step_00000001/state.json: missing" in message
    assert notes == []  # one error, not warnings followed by an error
    assert ckpt.has_checkpoints(tmp_path) and not ckpt.has_checkpoints(tmp_path / "fresh")


def test_a_bad_pointer_falls_back_to_the_newest_by_step(tmp_path):
    _two_checkpoints(tmp_path)
    (tmp_path / "latest").write_bytes(b"\xff\xfe garbage")
    notes = []
    assert ckpt.resume_checkpoint("auto", tmp_path, log=notes.append).name == "step_00000002"
    assert len(notes) == 1 and "latest: does not name a checkpoint" in notes[0]


def test_a_checkpoint_of_another_model_names_the_file(tmp_path):
    save_checkpoint(tmp_path, 1, make_model())
    with pytest.raises(CheckpointError, match=r"step_00000001/model/.metadata: does not fit this model"):
        load_checkpoint(tmp_path, torch.nn.Linear(6, 3))
    with pytest.raises(CheckpointError, match=r"model/.metadata: does not fit this model \(0.bias: saved shape "
                                              r"\(8,\), the model's \(9,\)\)"):
        load_checkpoint(tmp_path, torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 3)),
                        strict=False)


def test_format_1_checkpoints_load_with_a_warning(tmp_path):
    """Checkpoints written before manifests (COMPLETE without digests) still resume, saying that
    their files cannot be verified; their load errors still name the file."""
    model, optimizer = trained(0)
    path = save_checkpoint(tmp_path, 4, model, optimizer)
    (path / "COMPLETE").write_text(json.dumps({"step": 4, "world_size": 1, "time": 0.0}))
    notes = []
    assert ckpt.resume_checkpoint("auto", tmp_path, log=notes.append) == path
    assert len(notes) == 1 and "cannot be verified" in notes[0]
    fresh = make_model(3)
    with pytest.warns(RuntimeWarning, match="cannot be verified"):
        assert load_checkpoint(path, fresh).step == 4
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    _damage(path / "model" / ".metadata", "truncate")
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointError,
                                                     match=r"step_00000004/model/.metadata: cannot be loaded"):
        load_checkpoint(path, make_model(3))


# ------------------------------------------------------------------------------------------------
# all or nothing: keys, steps and manifest fields (issue 21, case 2)
# ------------------------------------------------------------------------------------------------
def _edit_manifest(path, change):
    manifest = json.loads((path / "COMPLETE").read_text())
    change(manifest)
    (path / "COMPLETE").write_text(json.dumps(manifest))


def _drop_exp_avg(index):
    del index["state.0.bias.exp_avg"]


def _drop_param(index):
    for key in [k for k in index if ".2.weight." in k]:
        del index[key]


def _deep_state(path):
    """state.json with a value nested 5,000 deep (a RecursionError when decoded), its digest rewritten."""
    file = path / "state.json"
    file.write_text(file.read_text().rstrip()[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}")
    _edit_manifest(path, lambda m: m["files"]["state.json"].update(bytes=file.stat().st_size,
                                                                    sha256=sha256_file(file)))


INCONSISTENT = [  # (file the reason names, what it says, how the checkpoint is edited)
    ("state.json", r"JSON nested deeper than 100 levels", _deep_state),
    ("model/.metadata", r"missing key\(s\) 0\.bias",
     lambda p: rewrite_with_manifest(p, "model/.metadata", lambda d: d.pop("0.bias"))),
    ("model/.metadata", r"unexpected key\(s\) stray",
     lambda p: rewrite_with_manifest(p, "model/.metadata", lambda d: d.update(stray=d["0.bias"]))),
    ("optimizer/.metadata", r"missing parameter\(s\) 2\.weight",
     lambda p: rewrite_with_manifest(p, "optimizer/.metadata", _drop_param)),
    ("optimizer/.metadata", r"state of 0\.bias lacks exp_avg",
     lambda p: rewrite_with_manifest(p, "optimizer/.metadata", _drop_exp_avg)),
    ("state.json", r"records step 99, the manifest step 2",
     lambda p: rewrite_with_manifest(p, "state.json", lambda d: d.update(step=99))),
    ("COMPLETE", r"records step 7, its directory step_00000002 step 2",
     lambda p: _edit_manifest(p, lambda m: m.update(step=7))),
    ("COMPLETE", r"'step' is '2', not an integer", lambda p: _edit_manifest(p, lambda m: m.update(step="2"))),
    ("COMPLETE", r"'bytes' of state.json is 'many', not a non-negative integer",
     lambda p: _edit_manifest(p, lambda m: m["files"]["state.json"].update(bytes="many"))),
    ("COMPLETE", r"'bytes' of state.json is True",
     lambda p: _edit_manifest(p, lambda m: m["files"]["state.json"].update(bytes=True))),
    ("COMPLETE", r"'sha256' of model/__0_0.distcp is not 64 hex digits",
     lambda p: _edit_manifest(p, lambda m: m["files"]["model/__0_0.distcp"].update(sha256=5))),
    ("COMPLETE", r"entry '\.\./step_00000001/state\.json' is not a path inside",
     lambda p: _edit_manifest(p, lambda m: m["files"].update(
         {"../step_00000001/state.json": m["files"]["state.json"]}))),
    ("rng", r"rng: not a regular file", lambda p: _edit_manifest(
        p, lambda m: m["files"].update(rng={"bytes": (p / "rng").stat().st_size, "sha256": "0" * 64}))),
]


@pytest.mark.parametrize("name,reason,edit", INCONSISTENT, ids=[f"{n}:{r[:24]}" for n, r, _ in INCONSISTENT])
def test_an_inconsistent_checkpoint_is_skipped_with_its_reason(tmp_path, name, reason, edit):
    """Damage the digests cannot see (the file and its manifest entry rewritten together, or a
    manifest field of the wrong type) makes a checkpoint damaged: the fallback skips it, naming
    the file and the keys or steps; asked for by path it is refused and nothing is loaded."""
    first = _two_checkpoints(tmp_path)
    edit(tmp_path / "step_00000002")
    model = make_model(5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    notes = []
    chosen = ckpt.resume_checkpoint("auto", tmp_path, log=notes.append, model=model, optimizer=optimizer)
    assert chosen.name == "step_00000001"
    assert len(notes) == 1 and notes[0].startswith("skipping checkpoint step_00000002")
    assert str(tmp_path / "step_00000002" / name) in notes[0]
    assert re.search(reason, notes[0]), notes[0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=reason) as error:
        load_checkpoint(tmp_path / "step_00000002", model, optimizer)
    assert "\n" not in str(error.value)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # nothing half-loaded
    assert optimizer.state_dict()["state"] == {}
    assert load_checkpoint(chosen, model, optimizer).step == 1
    assert all(torch.equal(model.state_dict()[k], v) for k, v in first.items())


def test_strict_false_loads_a_model_subset_but_still_checks_the_optimizer(tmp_path):
    _two_checkpoints(tmp_path)
    path = tmp_path / "step_00000002"
    rewrite_with_manifest(path, "model/.metadata", lambda d: d.pop("0.bias"))
    model = make_model(5)
    bias = model[0].bias.detach().clone()
    assert load_checkpoint(path, model, strict=False).step == 2
    assert torch.equal(model[0].bias, bias) and not torch.equal(model[0].weight, make_model(5)[0].weight)
    rewrite_with_manifest(path, "optimizer/.metadata", _drop_param)
    with pytest.raises(CheckpointError, match=r"optimizer/.metadata: does not fit this optimizer \(missing parameter"):
        load_checkpoint(path, model, torch.optim.AdamW(model.parameters()), strict=False)


@pytest.mark.skipif(not hasattr(torch.optim, "Adafactor"), reason="torch.optim.Adafactor needs torch >= 2.5")
def test_an_optimizer_with_per_shape_state_layouts_fits(tmp_path):
    """Adafactor keeps factored moments for matrices and one for vectors: not a partial state."""
    model = make_model(0)
    optimizer = torch.optim.Adafactor(model.parameters())
    model(torch.randn(4, 6)).square().mean().backward()
    optimizer.step()
    save_checkpoint(tmp_path, 1, model, optimizer)
    fresh = make_model(1)
    assert load_checkpoint(tmp_path, fresh, torch.optim.Adafactor(fresh.parameters())).step == 1


def test_a_tied_parameter_fits_by_any_of_its_names(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(5, 4)
            self.head = torch.nn.Linear(4, 5, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    optimizer = torch.optim.AdamW(model.parameters())
    model.head(model.embed(torch.tensor([1, 2]))).sum().backward()
    optimizer.step()
    save_checkpoint(tmp_path, 1, model, optimizer)
    fresh = Tied()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters())
    assert load_checkpoint(tmp_path, fresh, fresh_optimizer).step == 1
    assert torch.equal(fresh.embed.weight, model.embed.weight)


# ------------------------------------------------------------------------------------------------
# RNG: the current CUDA device only
# ------------------------------------------------------------------------------------------------
class _FakeCuda:
    """Stands in for torch.cuda on a CPU machine: `visible` devices, `current` the current one;
    records which RNG functions were called."""

    def __init__(self, visible, current):
        self.visible, self.current, self.calls = visible, current, []
        self.states = {i: torch.full((16,), i, dtype=torch.uint8) for i in range(visible)}

    def install(self, monkeypatch):
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(cuda, "device_count", lambda: self.visible)
        monkeypatch.setattr(cuda, "get_rng_state", self.get)
        monkeypatch.setattr(cuda, "set_rng_state", self.set)
        monkeypatch.setattr(cuda, "get_rng_state_all", lambda: self.calls.append("get_all"))
        monkeypatch.setattr(cuda, "set_rng_state_all", lambda states: self.calls.append("set_all"))

    def get(self, device="cuda"):
        self.calls.append(("get", device))
        return self.states[self.current].clone()

    def set(self, state, device="cuda"):
        self.calls.append(("set", device))
        self.states[self.current] = state.clone()


def test_rng_state_touches_only_the_current_cuda_device(monkeypatch):
    saved = _FakeCuda(visible=8, current=3)
    saved.install(monkeypatch)
    state = ckpt.capture_rng_state()
    assert state["cuda_device"] == 3 and torch.equal(state["cuda"], saved.states[3])
    assert saved.calls == [("get", "cuda")]
    resumed = _FakeCuda(visible=1, current=0)  # a resume on another GPU count
    resumed.install(monkeypatch)
    ckpt.restore_rng_state(state)
    assert resumed.calls == [("set", "cuda")] and torch.equal(resumed.states[0], saved.states[3])


def test_format_1_rng_lists_restore_the_current_devices_entry(monkeypatch):
    fake = _FakeCuda(visible=2, current=1)
    fake.install(monkeypatch)
    state = ckpt.capture_rng_state()
    state["cuda"] = [torch.full((16,), 10 + i, dtype=torch.uint8) for i in range(4)]  # saved on 4 GPUs
    ckpt.restore_rng_state(state)
    assert torch.equal(fake.states[1], torch.full((16,), 11, dtype=torch.uint8)) and "set_all" not in fake.calls
    small = _FakeCuda(visible=8, current=6)
    small.install(monkeypatch)
    with pytest.warns(RuntimeWarning, match="none for the current device 6"):
        ckpt.restore_rng_state(state)
    assert torch.equal(small.states[6], torch.full((16,), 6, dtype=torch.uint8))


@pytest.mark.gpu
def test_rng_round_trip_on_the_current_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    state = ckpt.capture_rng_state()
    expected = torch.rand(4, device="cuda")
    ckpt.restore_rng_state(state)
    assert torch.equal(torch.rand(4, device="cuda"), expected)


# ------------------------------------------------------------------------------------------------
# issue 47: files are data, the manifest covers what is loaded, a failed save loses nothing
# ------------------------------------------------------------------------------------------------
def _skipped_for(root, model=None, optimizer=None):
    """The one note of a resume that skips step 2 for step 1."""
    notes = []
    assert ckpt.resume_checkpoint("auto", root, log=notes.append, model=model, optimizer=optimizer).name == \
        "step_00000001"
    assert len(notes) == 1 and notes[0].startswith("skipping checkpoint step_00000002"), notes
    return notes[0]


def test_an_unlisted_shard_is_damage_even_when_it_was_changed(tmp_path):
    """K27: a byte of the model shard flipped and its manifest entry removed used to load silently
    (only state.json had to be listed); every file a load reads must be listed and verified."""
    first = _two_checkpoints(tmp_path)
    step = tmp_path / "step_00000002"
    _damage(step / "model" / "__0_0.distcp", "flip")
    _edit_manifest(step, lambda m: m["files"].pop("model/__0_0.distcp"))
    note = _skipped_for(tmp_path)
    assert f"{step / 'model' / '__0_0.distcp'}: not listed in the manifest" in note
    model = make_model(5)
    with pytest.raises(CheckpointError, match=r"model/__0_0\.distcp: not listed in the manifest"):
        load_checkpoint(step, model)
    assert load_checkpoint(tmp_path, model).step == 1
    assert all(torch.equal(model.state_dict()[k], v) for k, v in first.items())


@pytest.mark.parametrize("extra", ["rng/rank_00001.pt", "optimizer/__1_0.distcp", "model/notes.txt",
                                   "model.pt", "optimizer.pt"])
def test_any_unlisted_file_where_a_load_reads_is_damage(tmp_path, extra):
    """A file in model/, optimizer/ or rng/, or a full-state model.pt / optimizer.pt beside them (which
    would make the checkpoint load as the older format), is read unverified unless the manifest
    lists it."""
    _two_checkpoints(tmp_path)
    step = tmp_path / "step_00000002"
    (step / extra).write_bytes((step / "rng" / "rank_00000.pt").read_bytes())
    assert f"{step / extra}: not listed in the manifest" in _skipped_for(tmp_path)


def test_a_shard_the_index_reads_must_be_listed(tmp_path):
    """The DCP index names the files its tensors are read from: one the manifest does not list is
    refused (here a file that is not there at all, which DCP would fail on mid-load)."""
    import pickle

    from support.checkpoints import remanifest

    _two_checkpoints(tmp_path)
    step = tmp_path / "step_00000002"
    file = step / "model" / ".metadata"
    metadata = pickle.loads(file.read_bytes())  # a file this test wrote
    next(iter(metadata.storage_data.values())).relative_path = "__1_0.distcp"
    file.write_bytes(pickle.dumps(metadata))
    remanifest(step, "model/.metadata")
    assert (f"{step / 'model' / '__1_0.distcp'}: read by {step / 'model' / '.metadata'} but not listed in the manifest"
            in _skipped_for(tmp_path))


@pytest.mark.parametrize("content", ["tensor", "list", "no-numpy", "short-python"])
def test_an_rng_file_of_the_wrong_shape_is_damage_named_before_anything_loads(tmp_path, content):
    """K15: an RNG file holding a bare tensor (re-manifested) was an IndexError after the model and
    optimizer had loaded; any wrong shape is now one CheckpointError naming the file, the resume
    falls back, and a direct load refuses before touching the model."""
    from support.checkpoints import remanifest

    _two_checkpoints(tmp_path)
    step = tmp_path / "step_00000002"
    state = ckpt.capture_rng_state()
    bad = {"tensor": torch.arange(5), "list": [state], "no-numpy": {k: v for k, v in state.items() if k != "numpy"},
           "short-python": dict(state, python=(3, state["python"][1][:10], None))}[content]
    torch.save(bad, step / "rng" / "rank_00000.pt")
    remanifest(step, "rng/rank_00000.pt")
    assert f"{step / 'rng' / 'rank_00000.pt'}: not an RNG state (" in _skipped_for(tmp_path)
    model = make_model(5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"rng/rank_00000\.pt: not an RNG state") as error:
        load_checkpoint(step, model, verify=False)
    assert "\n" not in str(error.value)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


@pytest.mark.parametrize("name", ["COMPLETE", "state.json"])
def test_a_fifo_in_place_of_a_small_file_is_skipped_not_waited_on(tmp_path, name):
    """K26: a FIFO as COMPLETE hung the resume (read_bytes waits for a writer); it is refused at once."""
    _two_checkpoints(tmp_path)
    step = tmp_path / "step_00000002"
    (step / name).unlink()
    os.mkfifo(step / name)
    box = {}
    worker = threading.Thread(target=lambda: box.update(note=_skipped_for(tmp_path)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the resume waits on the FIFO"
    assert f"{step / name}: " in box["note"] and "not a regular file" in box["note"]


@pytest.mark.parametrize("name", ["rng/rank_00000.pt", "model.pt", "optimizer.pt"])
def test_a_planted_pickle_in_a_torch_file_runs_no_code(tmp_path, name):
    """RNG files and the older format's model.pt / optimizer.pt are read with torch's weights-only
    unpickler: a re-manifested pickle that would make a marker file is refused, naming the file."""
    from support.checkpoints import plant, remanifest, torch_payload

    marker = tmp_path / "PWNED"
    model, optimizer = trained(0)
    step = save_checkpoint(tmp_path / "root", 1, model, optimizer)
    if name != "rng/rank_00000.pt":  # the older full-state format: model.pt and optimizer.pt listed
        torch.save(model.state_dict(), step / "model.pt")
        torch.save(ckpt.optimizer_state_dict(model, optimizer), step / "optimizer.pt")
        remanifest(step, "model.pt")
        remanifest(step, "optimizer.pt")
    plant(step, name, torch_payload(marker))
    with pytest.raises(CheckpointError, match=re.escape(str(step / name)) + r": cannot be loaded \(UnpicklingError"):
        load_checkpoint(step, make_model(5), torch.optim.AdamW(make_model(5).parameters()))
    assert not marker.exists()
    torch.load(step / name, weights_only=False)  # the payload is live: an unrestricted load runs it
    assert marker.exists()


def _fail_replace_into(target_name, code):
    real = os.replace

    def replace(src, dst):
        if os.path.basename(dst) == target_name:
            raise OSError(code, os.strerror(code), str(src), None, str(dst))
        return real(src, dst)
    return replace


@pytest.mark.parametrize("code,where", [(errno.EROFS, "step_00000002"), (errno.ENOSPC, "COMPLETE"),
                                        (errno.EISDIR, "latest")])
def test_a_refused_save_is_one_line_with_the_path_and_errno(tmp_path, monkeypatch, code, where):
    """K25/K23/K12: the file system refusing a save (here at publishing, at the manifest, at the
    pointer) is one CheckpointWriteError naming the path and the errno; the unpublished directory
    is removed, the previous checkpoint and the pointer stay as they were."""
    model, optimizer = trained()
    first = save_checkpoint(tmp_path, 1, model, optimizer)
    files = sorted(p.relative_to(first) for p in first.rglob("*"))
    monkeypatch.setattr(ckpt.os, "replace", _fail_replace_into(where, code))
    with pytest.raises(ckpt.CheckpointWriteError) as error:
        save_checkpoint(tmp_path, 2, model, optimizer)
    message = str(error.value)
    assert "\n" not in message and error.value.errno == code
    assert message.startswith("checkpoint step 2 not saved: ") and f"({errno.errorcode[code]})" in message
    assert os.strerror(code) in message and where in message
    assert message.endswith("the checkpoints saved before it are intact (newest: step_00000001)")
    monkeypatch.undo()
    assert (tmp_path / "latest").read_text() == "step_00000001\n"
    assert sorted(p.relative_to(first) for p in first.rglob("*")) == files
    ckpt.verify_checkpoint(first)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_a_file_size_limit_mid_save_is_efbig_in_one_line(tmp_path):
    """K23: a real EFBIG (RLIMIT_FSIZE, as ``ulimit -f``) while DCP writes the shards: one line naming
    the errno, nothing published, the previous checkpoint intact."""
    resource = pytest.importorskip("resource")
    model = torch.nn.Linear(512, 512)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    save_checkpoint(tmp_path, 1, model, optimizer)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, hard))  # the model shard is ~1 MB
    try:
        with pytest.raises(ckpt.CheckpointWriteError,
                           match=r"^checkpoint step 2 not saved: .*/\.tmp-step_00000002/model/__0_0\.distcp: "
                                 r"File too large \(the file-size limit, ulimit -f, is 200000 bytes\) \(EFBIG\); "
                                 r"the checkpoints"):
            save_checkpoint(tmp_path, 2, model, optimizer)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert latest_checkpoint(tmp_path).name == "step_00000001" and not (tmp_path / ".tmp-step_00000002").exists()
    ckpt.verify_checkpoint(tmp_path / "step_00000001")


def test_the_checkpoint_root_is_checked_before_a_run(tmp_path):
    """K12/K25 before any step: `latest` a directory, a root that is a file, a file where the root's
    folder would be made; a writable root (made or not yet) passes and is left as it was."""
    ckpt.check_checkpoint_root(tmp_path / "fresh" / "checkpoints")
    assert not (tmp_path / "fresh").exists() and not list(tmp_path.iterdir())
    (tmp_path / "root" / "latest").mkdir(parents=True)
    with pytest.raises(ckpt.CheckpointWriteError, match=r"root/latest: a directory where the checkpoint pointer "
                                                        r"file goes \(EISDIR\)"):
        ckpt.check_checkpoint_root(tmp_path / "root")
    (tmp_path / "a_file").write_text("x")
    for root in (tmp_path / "a_file", tmp_path / "a_file" / "checkpoints"):
        with pytest.raises(ckpt.CheckpointWriteError, match=r"a_file is not a directory \(ENOTDIR\)"):
            ckpt.check_checkpoint_root(root)
    save_checkpoint(tmp_path / "used", 1)
    ckpt.check_checkpoint_root(tmp_path / "used")
    assert sorted(p.name for p in (tmp_path / "used").iterdir()) == ["latest", "step_00000001"]


def test_free_space_and_the_file_size_limit_are_checked_before_a_run(tmp_path, monkeypatch):
    """ENOSPC / EFBIG foreseen: a checkpoint of the model (its state plus AdamW's two moments) larger
    than the file system's free space, or a shard larger than RLIMIT_FSIZE, is refused by name."""
    resource = pytest.importorskip("resource")
    model = torch.nn.Linear(256, 256)  # 263 KB of state, 526 KB of moments
    ckpt.check_checkpoint_space(tmp_path, model)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))
    try:
        with pytest.raises(ckpt.CheckpointWriteError, match=r"the file-size limit \(ulimit -f\) is 100000 bytes, a "
                                                            r"checkpoint's shard file of this model takes at least "
                                                            r"526336 \(EFBIG\)"):
            ckpt.check_checkpoint_space(tmp_path, model)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    real = os.statvfs(tmp_path)

    class Full:  # the file system's answer, with 4 KB free
        f_frsize, f_bavail = real.f_frsize, 4096 // real.f_frsize

    monkeypatch.setattr(ckpt.os, "statvfs", lambda path: Full)
    with pytest.raises(ckpt.CheckpointWriteError, match=r"4096 bytes free on its file system, a checkpoint of this "
                                                        r"model takes at least 789504 \(ENOSPC\)"):
        ckpt.check_checkpoint_space(tmp_path, model)
