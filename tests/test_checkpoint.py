"""mempo.train.checkpoint (round trip, atomicity under crashes, RNG restore, keep-last-K) and
mempo.train.logging (metrics.jsonl that survives resume, TensorBoard fallback, timers, progress)."""
import importlib.util
import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
import torch

from mempo.train import checkpoint as ckpt
from mempo.train import logging as mlog
from mempo.train.checkpoint import (latest_checkpoint, list_checkpoints, load_checkpoint, prune_checkpoints,
                                    save_checkpoint)
from mempo.train.logging import MetricsLogger, StageTimer, progress, read_metrics


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
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(tmp_path, 2, model, optimizer)
    monkeypatch.setattr(ckpt.os, "replace", real_replace)
    temp = tmp_path / ".tmp-step_00000002"
    assert (temp / "model.pt").is_file() and (temp / "COMPLETE").is_file()  # fully written, never published
    assert latest_checkpoint(tmp_path) == first
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    save_checkpoint(tmp_path, 2, model, optimizer)
    assert latest_checkpoint(tmp_path).name == "step_00000002" and not temp.exists()


def test_crash_while_writing_files_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model, optimizer = trained()
    first = save_checkpoint(tmp_path, 1, model, optimizer)
    real_save = torch.save

    def half_then_crash(obj, handle, *args, **kwargs):
        if "param_groups" in obj:  # the optimizer file: leave a torn file behind
            handle.write(b"PK\x03\x04 torn")
            raise RuntimeError("simulated crash in the middle of optimizer.pt")
        return real_save(obj, handle, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", half_then_crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        save_checkpoint(tmp_path, 2, model, optimizer)
    assert latest_checkpoint(tmp_path) == first
    assert not (tmp_path / "step_00000002").exists()


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys, torch
    from mempo.train import checkpoint as ckpt
    root, point = sys.argv[1], sys.argv[2]
    model = torch.nn.Linear(64, 64)
    ckpt.save_checkpoint(root, 1, model)
    if point == "rename":
        real = os.replace
        def die(src, dst):
            if os.path.basename(dst).startswith("step_"):
                os.kill(os.getpid(), signal.SIGKILL)
            return real(src, dst)
        ckpt.os.replace = die
    elif point == "model":
        real_save = torch.save
        def die(obj, handle, *a, **k):
            handle.write(b"partial")
            handle.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        ckpt.torch.save = die
    elif point == "pointer":
        real = os.replace
        def die(src, dst):
            if os.path.basename(dst) == "latest":
                os.kill(os.getpid(), signal.SIGKILL)
            return real(src, dst)
        ckpt.os.replace = die
    ckpt.save_checkpoint(root, 2, torch.nn.Linear(64, 64))
""")


@pytest.mark.parametrize("point", ["model", "rename", "pointer"])
def test_sigkill_mid_save_never_exposes_a_partial_checkpoint(tmp_path, point):
    result = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(tmp_path), point], capture_output=True,
                            timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()
    latest = latest_checkpoint(tmp_path)
    if point == "pointer":  # renamed into place, pointer not updated: the pointer's (older) one wins
        assert (tmp_path / "step_00000002" / "COMPLETE").is_file()
    assert latest.name == "step_00000001"
    model = torch.nn.Linear(64, 64)
    assert load_checkpoint(tmp_path, model).step == 1


def test_latest_ignores_incomplete_and_temp_dirs_and_bad_pointer(tmp_path):
    save_checkpoint(tmp_path, 3)
    (tmp_path / "step_00000009").mkdir()  # no marker
    (tmp_path / ".tmp-step_00000010").mkdir()
    assert latest_checkpoint(tmp_path).name == "step_00000003"
    (tmp_path / "latest").write_text("step_00000042\n")  # names a missing dir
    assert latest_checkpoint(tmp_path).name == "step_00000003"
    assert latest_checkpoint(tmp_path / "nothing") is None
    with pytest.raises(FileNotFoundError):
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
    with pytest.raises(FileNotFoundError):
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
