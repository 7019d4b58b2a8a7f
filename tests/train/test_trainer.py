"""mempo.train.step / trainer / CLI: an end-to-end tiny run, advantages on <mem> spans, checkpoints,
and an exact resume after SIGKILL.

The rollouts use the built-in tiny Qwen2 with `mempo.rollout.backends.scaffold.ProtocolScaffold`, which
configs/tiny.yaml opts into (``rollout.protocol_scaffold``): an HF logits processor that forces the protocol tags and
lets the model sample the memory, reasoning, query and its answer, a choice among strings of its
own search results (it is never told the gold answer: tests/test_no_gold.py)."""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mempo.config import load_config
from support.paths import REPO

CONFIG = REPO / "configs" / "tiny.yaml"
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
    adv, traj = result.token_advantages.advantages, result.trajectories
    found = 0
    for b, t in enumerate(traj):
        outside = adv[b, torch.tensor(t.response_mask + [0] * (adv.shape[1] - len(t.response_mask))).bool()]
        for r, reward in zip(t.scored_rounds(), result.memory_rewards[b]):
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
    assert m["rollout/tool_calls"] > 0 and m["rollout/tool_errors"] == 0


def test_a_mixed_k_step_rolls_out_and_scores_each_episode_at_its_own_k(tmp_path):
    from mempo.train.step import train_step
    from mempo.train.trainer import build_run

    torch.set_num_threads(1)
    run = build_run(_cfg(tmp_path, "data.num_objectives=[1, 2]", "algorithm.skip_zero_variance_groups=false"))
    assert [e.num_objectives for e in run.episodes[:4]] == [1, 2, 1, 2]
    result = train_step(run.ctx, run.episodes[:2], 1)
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert sorted({len(t.golds) for t in result.trajectories}) == [1, 2]
    assert result.metrics["memory/scored_rounds"] > 0 and result.metrics["actor/num_tokens"] > 0
    for t in result.trajectories:  # every rollout asks its own episode's questions only
        prompt = run.tokenizer.decode(t.prompt_ids)
        assert len(t.golds) == sum(q in prompt for e in run.episodes[:2] for q in e.questions)


def _dead_url():
    import socket

    with socket.socket() as sock:  # a port nothing listens on once this socket is closed
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_failed_tool_calls_are_counted_and_determinism_follows_the_config(tmp_path):
    """A retriever that dies after the start: every search fails; the step says so in its metrics.
    trainer.deterministic=false switches deterministic algorithms off (on by default on CPU)."""
    from mempo.env.client import HTTPRetriever
    from mempo.train.step import train_step
    from mempo.train.trainer import build_run, step_episodes

    torch.set_num_threads(1)
    try:
        run = build_run(_cfg(tmp_path, "trainer.deterministic=false", "env.doc_chars=100"),
                        retriever=HTTPRetriever(_dead_url(), retries=0, timeout=2))
        assert not torch.are_deterministic_algorithms_enabled()
        m = train_step(run.ctx, step_episodes(run.episodes, 1, 2, seed=0), 1).metrics
        assert m["rollout/tool_calls"] > 0 and m["rollout/tool_errors"] == m["rollout/tool_calls"]
    finally:
        torch.use_deterministic_algorithms(True, warn_only=True)


def test_configure_determinism(monkeypatch):
    from mempo.train.trainer import configure_determinism

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        assert configure_determinism(None, cuda=False) and torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory
        assert not configure_determinism(False, cuda=False) and not torch.are_deterministic_algorithms_enabled()
        assert not configure_determinism(None, cuda=True) and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        assert configure_determinism(True, cuda=True) and torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # cuBLAS is deterministic only with it
        assert not torch.utils.deterministic.fill_uninitialized_memory  # no NaN-filling memset of every tensor
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own choice stays
        configure_determinism(True, cuda=True)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        configure_determinism(None, cuda=False)


@pytest.mark.gpu
def test_deterministic_cuda_matmul_warns_nothing():
    import warnings

    from mempo.train.trainer import configure_determinism

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    try:
        configure_determinism(True)
        a = torch.randn(256, 256, device="cuda")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            first, second = a @ a, a @ a
        assert torch.equal(first, second)
    finally:
        configure_determinism(None)


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
    # rollout correction's metrics: HF generation with the actor's own fp32 weights is the trained policy's
    # computation (actor.rollout_is auto: not applied), so its weights are 1 and its KL 0 up to rounding
    for row in rows:
        assert row["actor/rollout_is_applied"] == 0.0 and row["actor/rollout_is_tokens"] > 0
        assert abs(row["actor/rollout_is_mean"] - 1) < 1e-4 and abs(row["actor/rollout_is_max"] - 1) < 1e-3
        assert abs(row["actor/rollout_kl"]) < 1e-5 and row["actor/rollout_is_clipped_frac"] == 0.0
    # the run report reads exactly the names the step writes (mempo.train.metric_names), none other
    from mempo.apps.report import CURVE

    assert all(key in row for row in rows for _, key in CURVE)
    assert not {"kl", "entropy", "clip_fraction"} & set(rows[0])
    assert (tmp_path / "config.yaml").is_file() and (tmp_path / "tokenizer" / "tokenizer.json").is_file()


def test_async_save_writes_the_same_checkpoints_as_the_foreground(tmp_path):
    """trainer.async_save: each checkpoint written in the background during the next step holds that
    step's state, the same tensors as a foreground run's, and the run's numbers do not change."""
    from mempo.train.checkpoint import latest_checkpoint, list_checkpoints
    from mempo.train.logging import read_metrics
    from mempo.train.sharded import read_tensors, tensor_specs
    from mempo.train.trainer import train

    torch.set_num_threads(1)
    steps = ["trainer.total_steps=3", "trainer.save_every=1", "trainer.keep_last=null"]
    train(_cfg(tmp_path / "foreground", *steps))
    result = train(_cfg(tmp_path / "background", *steps, "trainer.async_save=true"))
    assert result.checkpoint == latest_checkpoint(tmp_path / "background" / "checkpoints")
    assert result.checkpoint.name == "step_00000003"
    saved = {run: list_checkpoints(tmp_path / run / "checkpoints") for run in ("foreground", "background")}
    assert [s for s, _ in saved["background"]] == [s for s, _ in saved["foreground"]] == [1, 2, 3]
    for (_, a), (_, b) in zip(saved["foreground"], saved["background"]):
        for folder in ("model", "optimizer"):
            keys = tensor_specs(a / folder)
            assert keys == tensor_specs(b / folder)
            ta, tb = read_tensors(a / folder, keys), read_tensors(b / folder, keys)
            assert all(torch.equal(ta[k], tb[k]) for k in keys), (a.name, folder)
        assert json.loads((a / "state.json").read_text()) == json.loads((b / "state.json").read_text())
    plain = [{k: v for k, v in r.items() if k != "time" and not k.startswith(("time/", "perf/"))}
             for r in read_metrics(tmp_path / "foreground" / "metrics.jsonl")]
    assert plain == [{k: v for k, v in r.items() if k != "time" and not k.startswith(("time/", "perf/"))}
                     for r in read_metrics(tmp_path / "background" / "metrics.jsonl")]


def _cli(out, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return [sys.executable, "-m", "mempo.apps.cli", "train", "--config", str(CONFIG), "--out", str(out),
            "--threads", "1", *FAST, "trainer.total_steps=3", "trainer.save_every=1", *extra], env


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


# ------------------------------------------------------------------------------------------------
# periodic evaluation (trainer.eval_every)
# ------------------------------------------------------------------------------------------------
EVAL = ["eval.objectives=[2]", "eval.episodes=1", "eval.max_turns=2", "eval.policies=[memory,full]"]
RATES = ("em", "f1", "score", "format_rate", "answer_rate")  # the eval/ metrics that are shares in [0, 1]


def test_periodic_eval_logs_eval_metrics_at_its_steps(tmp_path):
    """eval_every=2 over 3 steps: eval/ metrics on step 2 only (logged although log_every=3), equal to
    a direct `mempo.eval.evaluate` of the step-2 policy; training itself is unchanged by evaluating;
    eval_every=0 logs no eval/ metrics."""
    from mempo.synthetic.build import build_world
    from mempo.eval import eval_episodes, evaluate
    from mempo.model.loading import build_causal_lm
    from mempo.train.checkpoint import checkpoint_dir, load_checkpoint
    from mempo.train.logging import read_metrics
    from mempo.train.trainer import train

    torch.set_num_threads(1)
    plain_dir, eval_dir = tmp_path / "plain", tmp_path / "eval"
    plain = train(_cfg(plain_dir, "trainer.total_steps=3", "trainer.save_every=1", "trainer.keep_last=null", *EVAL))
    cfg = _cfg(eval_dir, "trainer.total_steps=3", "trainer.eval_every=2", "trainer.log_every=3", *EVAL)
    evaluated = train(cfg)

    assert not any(k.startswith("eval/") for r in read_metrics(plain_dir / "metrics.jsonl") for k in r)
    rows = read_metrics(eval_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [2, 3]
    logged = {k: v for k, v in rows[0].items() if k.startswith("eval/")}
    assert not any(k.startswith("eval/") for k in rows[1])
    for policy in ("memory", "full"):
        for name in RATES:
            value = logged[f"eval/{name}@k2_{policy}"]
            assert value is not None and math.isfinite(value) and 0.0 <= value <= 1.0, (name, policy, value)
        assert logged[f"eval/prompt_tokens_per_episode@k2_{policy}"] > 0 and logged[f"eval/mean_turns@k2_{policy}"] >= 1
    assert rows[0]["time/eval"] > 0

    for a, b in zip(plain.metrics, evaluated.metrics):  # evaluating does not disturb training
        assert a["actor/loss"] == b["actor/loss"] and a["reward/mean"] == b["reward/mean"]

    model = build_causal_lm(cfg.model, len(plain.tokenizer))  # the step-2 policy, evaluated directly
    load_checkpoint(checkpoint_dir(plain_dir / "checkpoints", 2), model, restore_rng=False)
    world, retriever = build_world(cfg)
    report = evaluate(model, plain.tokenizer, eval_episodes(world, cfg), retriever, cfg, show_progress=False)
    assert report.scalars("eval/") == pytest.approx(logged)


# ------------------------------------------------------------------------------------------------
# data.source=files with env.corpus_path
# ------------------------------------------------------------------------------------------------
FACTS = [  # (document id, title, text, question, answer)
    ("zorvath-observatory", "Zorvath Observatory", "The Zorvath Observatory stands in the town of Quellmoor.",
     "In which town does the Zorvath Observatory stand?", "Quellmoor"),
    ("brindle-canal", "Brindle Canal", "The Brindle Canal was dug by the engineer Ottoline Vasque.",
     "Which engineer dug the Brindle Canal?", "Ottoline Vasque"),
    ("marrow-lake", "Marrow Lake", "Marrow Lake is fed by the river Tessent.",
     "Which river feeds Marrow Lake?", "Tessent"),
    ("kestrel-bridge", "Kestrel Bridge", "The Kestrel Bridge is painted a deep cobalt colour.",
     "What colour is the Kestrel Bridge painted?", "cobalt"),
    ("fennick-library", "Fennick Library", "The Fennick Library holds the Ambrose Codex.",
     "Which codex does the Fennick Library hold?", "Ambrose Codex"),
    ("orrin-tower", "Orrin Tower", "Orrin Tower was built in the year 1712.",
     "In which year was Orrin Tower built?", "1712"),
]


def _files_run_dir(tmp_path):
    """A corpus jsonl (mempo.env.corpus) of FACTS' documents; QA jsonl (mempo.env.data) files: the first
    four questions for training (Search-R1 fields), the last two for evaluation (``answer`` alias)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "corpus.jsonl").write_text("".join(json.dumps({"id": d, "title": t, "text": x}) + "\n"
                                               for d, t, x, _, _ in FACTS))
    (data / "train.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "question": q, "golden_answers": [a]}) + "\n"
                                              for i, (_, _, _, q, a) in enumerate(FACTS[:4])))
    (data / "eval.jsonl").write_text("".join(json.dumps({"question": q, "answer": a}) + "\n"
                                             for _, _, _, q, a in FACTS[4:]))
    return data, ["data.source=files", f"data.train_files=[{data / 'train.jsonl'}]",
                  f"data.eval_files=[{data / 'eval.jsonl'}]", f"env.corpus_path={data / 'corpus.jsonl'}"]


def test_files_source_trains_on_the_given_questions_and_corpus(tmp_path):
    from mempo.env.bm25 import BM25Retriever
    from mempo.train.step import train_step
    from mempo.train.trainer import build_run, step_episodes

    torch.set_num_threads(1)
    _, files = _files_run_dir(tmp_path)
    run = build_run(_cfg(tmp_path / "run", *files))
    assert isinstance(run.retriever, BM25Retriever) and run.retriever.num_docs == len(FACTS)
    served = run.ctx.tools["search"].run("Kestrel Bridge colour")  # the step's search tool queries our corpus
    assert served.ok and "(ID: kestrel-bridge, Title: Kestrel Bridge)" in served.text
    train_questions = {q: a for _, _, _, q, a in FACTS[:4]}
    assert {q for e in run.episodes for q in e.questions} <= set(train_questions)

    result = train_step(run.ctx, step_episodes(run.episodes, 1, 2, seed=0), 1)
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert result.metrics["reward/format_rate"] == 1.0
    doc_ids = {d for d, _, _, _, _ in FACTS}
    for t in result.trajectories:
        prompt = run.tokenizer.decode(t.prompt_ids)
        asked = [q for q in train_questions if q in prompt]
        assert len(asked) == 2  # num_objectives of our questions in every rollout prompt
        assert t.golds == [[train_questions[q]] for q in sorted(asked, key=prompt.index)]
        for r in t.rounds:  # every search answer names only documents of our corpus
            if r.action == "search" and r.information is not None:
                text = run.tokenizer.decode(t.response_ids[r.information[0]:r.information[1]])
                assert all(hit in doc_ids for hit in re.findall(r"\(ID: ([^,]+),", text)), text


def test_cli_train_on_files_with_periodic_eval(tmp_path):
    """`mempo train` with data.source=files: 2 steps, eval on data.eval_files after each step."""
    from mempo.train.logging import read_metrics

    _, files = _files_run_dir(tmp_path)
    out = tmp_path / "run"
    cmd, env = _cli(out, *files, "trainer.total_steps=2", "trainer.eval_every=1", *EVAL)
    done = subprocess.run(cmd, env=env, cwd=tmp_path, timeout=240, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for policy in ("memory", "full"):
            for name in RATES:
                assert 0.0 <= row[f"eval/{name}@k2_{policy}"] <= 1.0
    assert (out / "model" / "config.json").is_file()


def test_files_source_config_errors_name_the_field(tmp_path):
    from mempo.config import ConfigError
    from mempo.train.trainer import build_run

    data, files = _files_run_dir(tmp_path)
    no_corpus = [f for f in files if not f.startswith("env.corpus_path")]
    with pytest.raises(ConfigError, match=r"^env\.corpus_path: must name a corpus"):
        build_run(_cfg(tmp_path / "run", *no_corpus))
    no_eval_files = [f for f in files if not f.startswith("data.eval_files")]
    with pytest.raises(ConfigError, match=r"^data\.eval_files: must list"):
        _cfg(tmp_path / "run", *no_eval_files, "trainer.eval_every=1")
    with pytest.raises(ConfigError, match=r"^eval\.objectives: k=4 needs at least 4 questions"):
        build_run(_cfg(tmp_path / "run", *files, "trainer.eval_every=1", "eval.objectives=[2,4]"))


def test_a_resume_steps_with_the_optimizer_settings_of_its_config(tmp_path):
    """Issue 47 (K22): resumed with another actor.lr (and weight decay and beta2), the run said the
    config differed but stepped with the checkpoint's values (the saved optimizer's param_groups
    overwrote them). The step after the resume now runs at the config's lr (``actor/lr``, read off
    the optimizer as it steps) and the optimizer saved after it holds the config's settings."""
    from mempo.train.checkpoint import load_checkpoint
    from mempo.train.trainer import train

    torch.set_num_threads(1)
    steps = ["trainer.total_steps=2", "trainer.save_every=1"]
    first = train(_cfg(tmp_path, *steps, "actor.lr=0.001"), max_steps=1)
    assert first.last_step == 1 and first.metrics[-1]["actor/lr"] == 0.001
    resumed = train(_cfg(tmp_path, *steps, "trainer.resume=auto", "actor.lr=1e-05", "actor.weight_decay=0.5",
                         "actor.beta2=0.95"))
    assert resumed.resumed_from == 1 and [m["step"] for m in resumed.metrics] == [2]
    assert resumed.metrics[-1]["actor/lr"] == 1e-05
    optimizer = torch.optim.AdamW(resumed.model.parameters(), lr=0.123)
    load_checkpoint(resumed.checkpoint, resumed.model, optimizer, restore_rng=False)  # as saved after step 2
    settings = {(g["lr"], tuple(g["betas"]), g["weight_decay"]) for g in optimizer.param_groups}
    assert settings == {(1e-05, (0.9, 0.95), 0.5)}


# ------------------------------------------------------------------------------------------------
# a user's tools and outcome reward (tests/support/user_tools.py, outside the package) through `mempo train`
# ------------------------------------------------------------------------------------------------

USER = ["rollout.action_format=json", "env.tools=['support.user_tools:lookup', search]",
        "rollout.outcome_reward=support.user_tools:overlap_reward"]


def test_mempo_train_with_a_users_tool_and_reward_in_the_json_format(tmp_path):
    """The scaffold calls the first configured tool (the user's lookup) as a Hermes JSON call, the user's
    reward scores every trajectory from its example, and the memory reward still runs on the world's golds."""
    from mempo.apps.cli import main
    from support import user_tools

    torch.set_num_threads(1)
    user_tools.LOOKUPS.clear()
    user_tools.REWARD_CALLS.clear()
    out = tmp_path / "run"
    assert main(["train", "--config", str(CONFIG), "--out", str(out), "--threads", "1", *FAST, *USER,
                 "trainer.total_steps=1", "trainer.save_every=0"]) == 0
    (row,) = _comparable(out / "metrics.jsonl")
    trajectories = 2 * 3
    assert len(user_tools.LOOKUPS) == row["rollout/tool_calls"] > 0 and row["rollout/tool_errors"] == 0
    assert len(user_tools.REWARD_CALLS) == trajectories
    for answer, example in user_tools.REWARD_CALLS:
        assert len(example["golds"]) == len(example["questions"]) == 2 and example["prompt"]
    assert row["reward/format_rate"] == 1.0 and row["memory/scored_rounds"] > 0


def test_mempo_train_stops_with_one_line_on_a_bad_tool_or_reward(tmp_path, capsys):
    from mempo.apps.cli import main

    base = [*FAST, "trainer.total_steps=1", "trainer.save_every=0", "rollout.action_format=json"]
    cases = [(["env.tools=['support.user_tools:nope']"],
              "env.tools[0]: 'support.user_tools:nope': 'support.user_tools' has no attribute 'nope'"),
             (["env.tools=['support.user_tools:NOT_A_TOOL']"], "expected a mempo.tools.Tool, got int"),
             (["rollout.outcome_reward=support.user_tools:TABLE"],
              "rollout.outcome_reward: 'support.user_tools:TABLE'"),
             (["rollout.outcome_reward=support.user_tools:nan_reward"],
              "rollout.outcome_reward: support.user_tools:nan_reward returned nan on trajectory"),
             (["rollout.outcome_reward=support.user_tools:string_reward"], "returned str '1.0'")]
    for i, (overrides, expected) in enumerate(cases):
        assert main(["train", "--config", str(CONFIG), "--out", str(tmp_path / f"r{i}"), "--threads", "1", *base,
                     *overrides]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("mempo train: ") and expected in err[0], err


def test_a_task_without_reference_answers_trains_with_the_memory_reward_off(tmp_path):
    """``data.gold_field: null``: QA records with no answer, a user's reward that needs none, the memory
    reward off (the config refuses it on: tests/config/test_schema.py), and tools of the user's only (no
    retriever, no corpus)."""
    from mempo.apps.cli import main
    from support import user_tools

    torch.set_num_threads(1)
    qa = tmp_path / "questions.jsonl"
    qa.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What colour is thing {i}?", "topic": "colour"})
                          + "\n" for i in range(4)))
    user_tools.REWARD_CALLS.clear()
    out = tmp_path / "run"
    assert main(["train", "--config", str(CONFIG), "--out", str(out), "--threads", "1", *FAST,
                 "trainer.total_steps=1", "trainer.save_every=0", "data.source=files", f"data.train_files=[{qa}]",
                 "data.num_objectives=1", "data.gold_field=null", "algorithm.memory_weight=0",
                 "env.tools=['support.user_tools:lookup']",
                 "rollout.outcome_reward=support.user_tools:answered_reward"]) == 0
    (row,) = _comparable(out / "metrics.jsonl")
    assert len(user_tools.REWARD_CALLS) == 2 * 3 and row["rollout/tool_calls"] > 0
    assert all(example["golds"] is None and example["metadata"]["records"] == [{"topic": "colour"}]
               for _, example in user_tools.REWARD_CALLS)
    assert row["memory/scored_rounds"] == 0 and row["memory/unscored_rounds"] > 0
