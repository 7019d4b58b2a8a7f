"""mempo.train.step / trainer / CLI: an end-to-end tiny run, advantages on <mem> spans, checkpoints,
and an exact resume after SIGKILL.

The rollouts use the built-in tiny Qwen2 with `mempo.builtin.ProtocolScaffold` (an HF logits
processor that forces the protocol tags and lets the model sample the memory, reasoning, query and
the choice between the gold answer and "unknown")."""
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mempo.train.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "tiny.yaml"
FAST = ["data.questions_per_step=2", "rollout.group_size=3", "trainer.tensorboard=false", "trainer.progress=false"]


def _cfg(tmp_path, *extra):
    return load_config(CONFIG, FAST + [f"trainer.out_dir={tmp_path}", "trainer.resume=never", *extra])


@pytest.mark.parametrize("policy", ["full", "memory"])
def test_step_advantages_on_mem_spans(tmp_path, policy):
    from mempo.train.step import train_step
    from mempo.train.trainer import build_run, step_episodes

    torch.set_num_threads(1)
    cfg = _cfg(tmp_path, f"rollout.context_policy={policy}", "algorithm.skip_zero_variance_groups=false")
    run = build_run(cfg)
    result = train_step(run.ctx, step_episodes(run.episodes, 1, 2, seed=0), 1)
    m = result.metrics
    assert all(math.isfinite(v) for v in m.values())
    assert m["reward/format_rate"] == 1.0 and m["memory/scored_rounds"] > 0
    adv, traj = result.advantages, result.trajectories
    found = 0
    for b, t in enumerate(traj):
        outside = adv[b, torch.tensor(t.response_mask + [0] * (adv.shape[1] - len(t.response_mask))).bool()]
        for r, reward in zip(t.scored_rounds(), t.memory_rewards):
            start, end = r.mem_span
            span = adv[b, start:end]
            assert torch.all(span == span[0])  # one value per span
            outcome = adv[b, r.end - 1]  # the round's last token carries the outcome advantage only
            if abs(float(span[0] - outcome)) > 1e-6:
                found += 1
        assert outside.numel() > 0
    assert found > 0, "no <mem> span carries a memory advantage"
    batch = result.batch
    if policy == "memory":  # one row per round, each carrying its round's advantages
        assert len(batch.row_round) == sum(len(t.rounds) for t in traj)
        for i, (b, k) in enumerate(zip(batch.row_traj, batch.row_round)):
            r = traj[b].rounds[k]
            n = r.end - r.start
            row_len = int(batch.attention_mask[i].sum())
            assert torch.equal(batch.advantages[i, row_len - n:row_len], adv[b, r.start:r.end])
    else:
        assert len(batch.row_traj) == len(traj)
    assert m["actor/num_tokens"] > 0 and math.isfinite(m["actor/loss"])


def test_train_writes_metrics_and_checkpoints(tmp_path):
    from mempo.train.checkpoint import latest_checkpoint
    from mempo.train.logging import read_metrics
    from mempo.train.trainer import train

    torch.set_num_threads(1)
    result = train(_cfg(tmp_path, "trainer.total_steps=2", "trainer.save_every=1"))
    assert result.last_step == 2 and result.checkpoint is not None
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_00000002"
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["actor/loss"]) for r in rows)
    assert (tmp_path / "config.yaml").is_file() and (tmp_path / "tokenizer" / "tokenizer.json").is_file()


def _cli(out, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return [sys.executable, "-m", "mempo.cli", "train", "--config", str(CONFIG), "--out", str(out), "--threads", "1",
            *FAST, "trainer.total_steps=3", "trainer.save_every=1", *extra], env


def _comparable(path):
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not (k == "time" or k.startswith("time/") or k.startswith("perf/"))}
            for r in rows]


def test_sigkill_and_resume_match_an_uninterrupted_run(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    cmd, env = _cli(full)
    subprocess.run(cmd, env=env, check=True, cwd=tmp_path, timeout=240, capture_output=True)
    cmd, env = _cli(killed)
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 180
        latest = killed / "checkpoints" / "latest"
        while not (latest.exists() and latest.read_text().strip() == "step_00000002"):
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.time() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # mid-run: during step 3
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    cmd, env = _cli(killed, "--resume")
    done = subprocess.run(cmd, env=env, cwd=tmp_path, timeout=240, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from 2" in done.stderr
    a, b = _comparable(full / "metrics.jsonl"), _comparable(killed / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for key in ra:
            assert ra[key] == pytest.approx(rb[key], rel=1e-6, abs=1e-9), (ra["step"], key)


def test_cli_bad_config_exits_2(tmp_path):
    cmd, env = _cli(tmp_path, "actor.clip_ratio_low=2")
    done = subprocess.run(cmd, env=env, cwd=tmp_path, timeout=60, capture_output=True, text=True)
    assert done.returncode == 2 and "actor.clip_ratio_low" in done.stderr
