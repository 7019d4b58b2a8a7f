"""bench/bench_learning.py (the ablation command) end to end on a smoke demo's output: every variant
and seed runs RL from the same SFT model, the overrides reach the runs wherever they stand on the
command line, and the results, table and plot are written; an evaluation of entities the demo's SFT
data did not leave out is refused; `check_held_out` itself."""
import importlib.util
import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from support.demo_smoke import SMOKE
from support.paths import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _bench_learning():
    spec = importlib.util.spec_from_file_location("bench_learning", REPO / "bench" / "bench_learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_ablation_runs_every_variant_and_seed_from_one_sft_model(tmp_path, capsys):
    from mempo.apps.cli import main as mempo_main

    demo_out = tmp_path / "demo_out"
    assert mempo_main(["demo", "--out", str(demo_out), "--no-progress", *SMOKE]) == 0
    bench = _bench_learning()
    out = tmp_path / "ablation"
    # the override stands after a list option: it must not be read as a value of --ks
    assert bench.main(["--demo-out", str(demo_out), "--out", str(out), "--seeds", "0", "1", "--steps", "1",
                       "--variants", "grpo", "mempo_nothresh", "--ks", "2", "rollout.group_size=4"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 1 and results["ks"] == [2] and results["group_size"] == 4
    assert [(r["variant"], r["seed"]) for r in results["runs"]] == [
        ("grpo", 0), ("grpo", 1), ("mempo_nothresh", 0), ("mempo_nothresh", 1)]
    for run in results["runs"]:
        row = run["rows"]["2"]
        assert 0.0 <= row["em"] <= 1.0 and row["prompt_tokens_per_episode"] > 0
        metrics = (out / run["variant"] / f"seed{run['seed']}" / "metrics.jsonl").read_text().splitlines()
        assert len(metrics) == 1  # one RL step each
    table = (out / "results.md").read_text()
    assert "| SFT (no RL) | 2 |" in table and "| grpo | 2 |" in table and "| mempo_nothresh | 2 |" in table
    assert (out / "ablation.png").read_bytes()[:8] == PNG_MAGIC
    # an evaluation asking about entities the demo's SFT data was not kept from is refused before anything runs
    capsys.readouterr()
    refused = tmp_path / "refused"
    assert bench.main(["--demo-out", str(demo_out), "--out", str(refused), "--seeds", "0", "--steps", "1",
                       "--ks", "6"]) == 2
    assert "were not held out of the demo's SFT data" in capsys.readouterr().err and not refused.exists()
    with pytest.raises(SystemExit):  # a variant it does not know is an argparse error naming it
        bench.main(["--demo-out", str(demo_out), "--variants", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_check_held_out_names_how_many_subjects_were_not_held_out():
    bench = _bench_learning()
    bench.check_held_out(frozenset({"Tamor", "Belis"}), frozenset({"Tamor"}))
    with pytest.raises(bench.NotHeldOut, match="^1 of the 2 entities"):
        bench.check_held_out(frozenset({"Tamor"}), frozenset({"Tamor", "Nekat"}))
