"""mempo.apps.demo: the configuration file equals the built-in one; a drastically reduced demo completes."""

import pytest
import yaml

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from mempo.apps.demo import DEFAULT_CONFIG, load_demo_config
from support.demo_smoke import SMOKE
from support.paths import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_config_file_equals_builtin_defaults():
    assert yaml.safe_load((REPO / "configs" / "demo.yaml").read_text()) == DEFAULT_CONFIG
    cfg = load_demo_config(REPO / "configs" / "demo.yaml")
    assert cfg == load_demo_config(None)
    assert cfg.eval.objectives == [2, 4] and cfg.eval.policies == ["memory"] and cfg.demo.model_size == "mini"
    assert cfg.sft.objectives == [1, 2, 3, 4] and cfg.sft.lr == 1e-3 and cfg.sft.oracle_think == "minimal"
    assert cfg.sft.keep == "all" and 0 < cfg.sft.oracle_drop_fact_prob < 1 and cfg.demo.copy_warmup_steps > 0


def test_unknown_demo_key_is_an_error():
    from mempo.config import ConfigError

    with pytest.raises(ConfigError, match="demo.nope"):
        load_demo_config(None, ["demo.nope=1"])
    with pytest.raises(ConfigError, match="demo.model_size"):
        load_demo_config(None, ["demo.model_size=huge"])


def test_sft_settings_the_demo_cannot_follow_fail_before_anything_runs(tmp_path):
    from mempo.apps.cli import main
    from mempo.apps.demo import run_demo
    from mempo.config import ConfigError

    with pytest.raises(ConfigError, match="^sft.objectives: the demo draws"):
        run_demo(load_demo_config(None, ["sft.objectives=null"]), tmp_path / "a")
    with pytest.raises(ConfigError, match="^sft.trajectories: the demo makes"):
        run_demo(load_demo_config(None, [f"sft.trajectories={tmp_path / 'x.jsonl'}"]), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert main(["demo", "--out", str(tmp_path / "c"), "sft.objectives=null"]) == 2


def test_smoke_demo(tmp_path):
    from mempo.apps.cli import main

    out = tmp_path / "demo_out"
    # Re-running the demo into the same --out works: the RL checkpoints of an earlier run there are
    # its own stage directory (cleared first), not a used run directory to refuse.
    earlier = out / "rl" / "checkpoints" / "step_00000007"
    earlier.mkdir(parents=True)
    (out / "rl" / "checkpoints" / "latest").write_text("step_00000007\n")
    assert main(["demo", "--out", str(out), "--no-progress", *SMOKE]) == 0
    assert not earlier.exists()
    text = (out / "report.md").read_text()
    for stage in ("world", "oracle", "tokenizer", "model", "copy-warmup", "sft", "eval-before", "rl", "eval-after",
                  "report"):
        assert f"| {stage} |" in text
    assert "SKIPPED" not in text
    assert "## Before / after RL" in text and "1 logged steps" in text
    assert "## One held-out episode before and after RL" in text
    for name in ("reward", "memory_reward", "tokens", "sft"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC
    # the KL plot needs an actor update; a step whose update was skipped (no loss token) logs no KL
    from mempo.train.logging import read_metrics

    updated = any("actor/kl_loss" in row for row in read_metrics(out / "rl" / "metrics.jsonl"))
    assert (out / "kl.png").is_file() == updated and ("kl.png (no such metrics logged)" in text) == (not updated)
    for name in ("eval_before.json", "eval_after.json", "stages.json", "rl/metrics.jsonl", "model_rl/config.json"):
        assert (out / name).is_file(), name
