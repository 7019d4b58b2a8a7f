"""bench/bench_learning.py (the pre-registered ablation's runner) end to end on a smoke demo's output:
every arm (grpo, mempo, a --best arm with its own pooling overrides) and seed runs RL from the same SFT
model, paired by seed; the overrides reach the runs wherever they stand on the command line; the
run files, results, paired differences, table and plot are written; a rerun with the same settings
skips every finished run, also one kept in a --runs folder elsewhere; a run file of other settings
is refused (exit 2) unless --rerun; an evaluation of entities the demo's SFT data did not leave out
is refused; ``eval.split=validation`` evaluates the validation episodes instead (disjoint by entity
from the test ones); the monitors (turns, answers with a question pending, memory / full prompt
tokens) are recorded; the statistics and `check_held_out` themselves."""
import json
import math
import shutil

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from support.demo_smoke import SMOKE
from support.paths import load_script

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _bench_learning():
    return load_script("bench/bench_learning.py")


def test_the_ablation_runs_paired_arms_resumes_and_refuses_other_settings(tmp_path, capsys, monkeypatch):
    from mempo.apps.cli import main as mempo_main
    from mempo.apps.demo import load_demo_config

    demo_out = tmp_path / "demo_out"  # with a validation split of 2 episodes per k, held out of SFT and RL too
    assert mempo_main(["demo", "--out", str(demo_out), "--no-progress", *SMOKE, "eval.validation_episodes=2"]) == 0
    bench = _bench_learning()
    out = tmp_path / "ablation"
    # the override stands after a list option: it must not be read as a value of --ks; the --best
    # arm's overrides are that arm's only
    argv = ["--demo-out", str(demo_out), "--out", str(out), "--seeds", "0", "1", "--steps", "1", "--episodes", "2",
            "--best", "all_fixes", "--best-overrides", "algorithm.memory_pooling=group_seen",
            "algorithm.memory_std_floor=0.05", "--ks", "2", "rollout.group_size=4"]
    assert bench.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 1 and results["ks"] == [2] and results["group_size"] == 4
    # RL on the k cycle of the demo's config (configs/demo.yaml, read with the smoke's overrides)
    demo_rl_k = load_demo_config(None, SMOKE).data.num_objectives
    assert results["rl_k"] == demo_rl_k and isinstance(demo_rl_k, list) and len(set(demo_rl_k)) > 1
    assert results["episodes"] == 2 and results["reused_runs"] == 0
    arms = ["grpo", "mempo", "mempo_all_fixes"]
    assert [(r["arm"], r["seed"]) for r in results["runs"]] == [(a, s) for s in (0, 1) for a in arms]  # seed-major
    configs = {(r["arm"], r["seed"]): r["settings"]["config"] for r in results["runs"]}
    for seed in (0, 1):  # paired: the same rollout / torch seed, questions and model in every arm
        assert {configs[(a, seed)]["rollout"]["seed"] for a in arms} == {seed}
        assert {configs[(a, seed)]["trainer"]["seed"] for a in arms} == {seed}
        assert len({json.dumps(r["settings"]["rl_episodes_sha256"]) + r["settings"]["model_sha256"]
                    for r in results["runs"]}) == 1
    assert configs[("grpo", 0)]["algorithm"]["memory_weight"] == 0.0
    assert configs[("mempo", 0)]["algorithm"]["memory_weight"] == 1.0
    assert configs[("mempo", 0)]["scoring"]["threshold"] == 0.5  # the paper's, though the demo's is null
    assert configs[("mempo", 0)]["algorithm"]["memory_pooling"] == "group"
    best = configs[("mempo_all_fixes", 0)]
    assert best["scoring"]["comparator"] == "history_mem" and best["scoring"]["reward"] == "log"
    assert best["algorithm"]["memory_pooling"] == "group_seen" and best["algorithm"]["memory_std_floor"] == 0.05
    for record in results["runs"]:
        row = record["rows"]["2"]
        assert 0.0 <= row["em"] <= 1.0 and row["prompt_tokens_per_episode"] > 0
        assert row["turns"] >= 1 and row["full_context_tokens_per_episode"] >= row["prompt_tokens_per_episode"] > 0
        ratio = row["prompt_tokens_per_episode"] / row["full_context_tokens_per_episode"]
        assert row["token_ratio"] == pytest.approx(ratio)
        assert (row["answered_pending"] is None) == (row["answered"] == 0)
        assert row["answered_pending"] is None or 0.0 <= row["answered_pending"] <= 1.0
        assert len(row["em_per_episode"]) == 2 and sum(row["em_per_episode"]) / 2 == pytest.approx(row["em"])
        assert record["training"]["steps"] == 1 and record["training"]["trained_tokens"] > 0
        saved = json.loads((out / "runs" / f"{record['arm']}_s{record['seed']}.json").read_text())
        assert saved == record
        metrics = (out / record["arm"] / f"seed{record['seed']}" / "metrics.jsonl").read_text()
        assert len(metrics.splitlines()) == 1  # one RL step each
        # kept beside the run file, so a kept runs folder holds each finished run's curve
        assert (out / "runs" / "metrics" / f"{record['arm']}_s{record['seed']}.jsonl").read_text() == metrics
    # the paired differences are the per-seed differences to grpo, their mean and SE
    em = {(r["arm"], r["seed"]): r["rows"]["2"]["em"] for r in results["runs"]}
    for arm in ("mempo", "mempo_all_fixes"):
        paired = results["paired"][arm]["2"]["em"]
        diffs = [em[(arm, s)] - em[("grpo", s)] for s in (0, 1)]
        assert paired["per_seed"] == {"0": pytest.approx(diffs[0]), "1": pytest.approx(diffs[1])}
        assert paired["n"] == 2 and paired["mean"] == pytest.approx(sum(diffs) / 2)
        assert paired["se"] == pytest.approx(abs(diffs[0] - diffs[1]) / 2)
    assert "grpo" not in results["paired"]
    for record in results["runs"]:  # RL's gain over the SFT model on the same episodes, with its paired SE
        gain = results["gain_over_sft"][record["arm"]]["2"][str(record["seed"])]
        diffs = [b - a for a, b in zip(results["sft"]["2"]["em_per_episode"], record["rows"]["2"]["em_per_episode"])]
        assert gain["gain"] == pytest.approx(sum(diffs) / 2)
        assert gain["se"] == pytest.approx(abs(diffs[0] - diffs[1]) / 2)
    table = (out / "results.md").read_text()
    assert "| SFT (no RL) | 2 |" in table and "| grpo | 2 |" in table and "| mempo_all_fixes | 2 |" in table
    assert "Paired difference to grpo" in table
    assert f"RL: 1 steps on k = {', '.join(str(k) for k in demo_rl_k)} in turn" in table
    assert "RL's EM gain over the SFT model per seed" in table and "| mempo | 2 | 0: " in table
    assert "2 held-out test episodes per k" in table and results["split"] == "test"
    assert "| turns | answered with a question pending | memory / full prompt tokens |" in table
    assert (out / "ablation.png").read_bytes()[:8] == PNG_MAGIC
    capsys.readouterr()

    # a rerun with the same settings runs nothing: every run is finished
    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(bench, "train", no_training)
    assert bench.main(argv) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["reused_runs"] == 6 and again["runs"] == results["runs"] and again["paired"] == results["paired"]
    assert capsys.readouterr().out.count("finished before") == 6
    # --runs: the run files kept elsewhere (under git, on a fresh machine) are the ones reused
    kept = tmp_path / "kept_runs"
    shutil.copytree(out / "runs", kept)
    elsewhere = tmp_path / "fresh_machine"
    assert bench.main([*argv[:3], str(elsewhere), *argv[4:], "--runs", str(kept)]) == 0
    moved = json.loads((elsewhere / "results.json").read_text())
    assert moved["reused_runs"] == 6 and moved["runs"] == results["runs"] and not (elsewhere / "runs").exists()
    capsys.readouterr()
    # a finished run of other settings is refused before anything runs, naming what differs
    other = [w if w != "rollout.group_size=4" else "rollout.group_size=2" for w in argv]
    assert bench.main(other) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_learning: ") and "made with other settings" in err and "config.rollout" in err
    monkeypatch.undo()
    # --rerun replaces it (one arm, one seed: only that run)
    assert bench.main(["--demo-out", str(demo_out), "--out", str(out), "--seeds", "1", "--steps", "1", "--episodes",
                       "2", "--variants", "grpo", "--ks", "2", "rollout.group_size=2", "--rerun"]) == 0
    assert json.loads((out / "runs" / "grpo_s1.json").read_text())["settings"]["config"]["rollout"]["group_size"] == 2
    assert json.loads((out / "results.json").read_text())["paired"] == {}  # grpo alone: nothing to pair

    # an evaluation asking about entities the demo's SFT data was not kept from is refused before anything runs
    capsys.readouterr()
    refused = tmp_path / "refused"
    assert bench.main(["--demo-out", str(demo_out), "--out", str(refused), "--seeds", "0", "--steps", "1",
                       "--ks", "6", "--episodes", "2"]) == 2
    assert "were not held out of the demo's SFT data" in capsys.readouterr().err and not refused.exists()
    # eval.split=validation: the validation episodes (none of the test split's entities), the split named
    from mempo.config import load_config
    from mempo.eval import eval_episodes
    from mempo.synthetic.build import synthetic_world
    from mempo.synthetic.heldout import held_out_subjects

    val_out = tmp_path / "validation"
    val_argv = ["--demo-out", str(demo_out), "--out", str(val_out), "--seeds", "0", "--steps", "1", "--episodes", "2",
                "--variants", "grpo", "--ks", "2", "4", "eval.split=validation"]
    assert bench.main(val_argv) == 0
    validated = json.loads((val_out / "results.json").read_text())
    cfg = load_config(demo_out / "config.yaml")
    world = synthetic_world(cfg)
    validation, test = eval_episodes(world, cfg, split="validation"), eval_episodes(world, cfg, split="test")
    assert validated["split"] == "validation" and not held_out_subjects(validation) & held_out_subjects(test)
    settings = validated["runs"][0]["settings"]
    assert settings["split"] == "validation" and settings["eval_episodes_sha256"] == {
        str(k): bench.episodes_digest(validation[k]) for k in (2, 4)}
    assert settings["eval_episodes_sha256"]["2"] != results["runs"][0]["settings"]["eval_episodes_sha256"]["2"]
    assert "2 held-out validation episodes per k" in (val_out / "results.md").read_text()
    capsys.readouterr()
    assert bench.main([*val_argv[:9], "3", *val_argv[10:]]) == 2  # the demo held out 2 validation episodes per k
    assert "eval.validation_episodes: 2 validation episodes per k are held out; 3 asked for" in capsys.readouterr().err
    assert bench.main(["--demo-out", str(demo_out), "--episodes", "0"]) == 2
    assert "--episodes and --steps must be >= 1, got 0" in capsys.readouterr().err
    # an override for every arm that an arm replaces is an error naming it, not a silent drop
    small = ["--demo-out", str(demo_out), "--out", str(tmp_path / "refused"), "--episodes", "2", "--ks", "2"]
    assert bench.main([*small, "--variants", "--best", "log", "algorithm.memory_weight=2"]) == 2
    assert ("the override 'algorithm.memory_weight=2' is replaced in arm mempo_log's runs "
            "(algorithm.memory_weight = 1.0 there)") in capsys.readouterr().err
    assert bench.main([*small, "--variants", "grpo", "rollout.seed=3"]) == 2
    assert "the override 'rollout.seed=3' is replaced in arm grpo's runs" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()  # refused before anything ran
    assert bench.main(["--demo-out", str(demo_out), "--best-overrides", "algorithm.memory_pooling=group_seen"]) == 2
    assert "--best-overrides needs --best" in capsys.readouterr().err
    assert bench.main(["--demo-out", str(demo_out), "--best", "log", "--best-overrides", "data.seed=3"]) == 2
    assert "only 'section.field=value' of the algorithm/scoring sections" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a variant it does not know is an argparse error naming it
        bench.main(["--demo-out", str(demo_out), "--variants", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err
    assert bench.main(["--demo-out", str(demo_out), "--variants"]) == 2  # no fixed arm and no --best: nothing to run
    assert "the arms must be distinct and at least one, got []" in capsys.readouterr().err


def test_mean_se_and_paired_differences():
    bench = _bench_learning()
    assert bench.mean_se([]) == (None, None)
    assert bench.mean_se([0.25]) == (0.25, None)  # one seed: no SE, never NaN
    mean, se = bench.mean_se([0.1, 0.3, 0.2])
    assert mean == pytest.approx(0.2) and se == pytest.approx(0.1 / math.sqrt(3))

    def record(arm, seed, em):
        return {"arm": arm, "seed": seed, "rows": {"2": {m: em for m in bench.METRICS}}}

    runs = [record("grpo", 0, 0.5), record("grpo", 1, 0.4), record("grpo", 2, 0.3),
            record("mempo", 0, 0.7), record("mempo", 1, 0.6), record("mempo", 3, 0.9)]  # seed 3 has no grpo
    paired = bench.paired_differences(runs, "mempo", [2])["2"]["em"]
    assert paired["per_seed"] == {"0": pytest.approx(0.2), "1": pytest.approx(0.2)} and paired["n"] == 2
    assert paired["mean"] == pytest.approx(0.2) and paired["se"] == pytest.approx(0.0) and paired["ahead"] is True
    one = bench.paired_differences(runs[:1] + runs[3:4], "mempo", [2])["2"]["em"]
    assert one["n"] == 1 and one["se"] is None and one["ahead"] is None


def test_gain_over_sft_pairs_episodes_and_leaves_the_se_out_for_old_run_files():
    bench = _bench_learning()
    sft = {"4": {"em": 0.25, "em_per_episode": [0.0, 0.5, 0.25, 0.25]}}
    runs = [{"arm": "mempo", "seed": 1, "rows": {"4": {"em": 0.5, "em_per_episode": [0.5, 0.5, 0.5, 0.5]}}},
            {"arm": "mempo", "seed": 0, "rows": {"4": {"em": 0.375}}},  # a run file made before per-episode EM
            {"arm": "grpo", "seed": 0, "rows": {"4": {"em": 0.0, "em_per_episode": [0.0, 0.0, 0.0]}}}]
    gains = bench.gain_over_sft(sft, runs, "mempo", [4])["4"]
    assert list(gains) == ["0", "1"]  # by seed
    assert gains["0"] == {"gain": pytest.approx(0.125), "se": None}
    diffs = [0.5, 0.0, 0.25, 0.25]  # after - before, per episode
    mean = sum(diffs) / 4
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3 / 4)
    assert gains["1"]["gain"] == pytest.approx(0.25) and gains["1"]["se"] == pytest.approx(se)
    assert bench.gain_over_sft(sft, runs, "grpo", [4])["4"]["0"]["se"] is None  # other episode count: not paired


def test_check_held_out_names_how_many_subjects_were_not_held_out():
    bench = _bench_learning()
    bench.check_held_out(frozenset({"Tamor", "Belis"}), frozenset({"Tamor"}))
    with pytest.raises(bench.NotHeldOut, match="^1 of the 2 entities"):
        bench.check_held_out(frozenset({"Tamor"}), frozenset({"Tamor", "Nekat"}))
