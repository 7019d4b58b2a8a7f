"""mempo.apps.demo: the configuration file equals the built-in one; a drastically reduced demo completes."""
from pathlib import Path

import pytest
import yaml

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from mempo.apps.demo import DEFAULT_CONFIG, load_demo_config

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

SMOKE = [
    "data.world_documents=120", "demo.vocab_size=400", "demo.tokenizer_documents=60", "demo.model_size=tiny",
    "demo.max_position_embeddings=2048", "sft.objectives=[1]", "sft.episodes=2", "sft.steps=1",
    "sft.batch_tokens=2048", "demo.torch_threads=1",
    "trainer.total_steps=1", "data.questions_per_step=1", "rollout.group_size=2", "rollout.max_turns=2",
    "rollout.max_new_tokens_per_round=16", "rollout.max_response_tokens=512",
    "eval.objectives=[2,4]", "eval.episodes=2", "eval.max_turns=2",
]


def test_config_file_equals_builtin_defaults():
    assert yaml.safe_load((REPO / "configs" / "demo.yaml").read_text()) == DEFAULT_CONFIG
    cfg = load_demo_config(REPO / "configs" / "demo.yaml")
    assert cfg == load_demo_config(None)
    assert cfg.eval.objectives == [2, 4] and cfg.eval.policies == ["memory"] and cfg.demo.model_size == "small"
    assert cfg.sft.objectives == [1, 2, 3, 4] and cfg.sft.lr == 3e-3 and cfg.sft.oracle_think == "short"


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
    for stage in ("world", "oracle", "tokenizer", "model", "sft", "eval-before", "rl", "eval-after", "report"):
        assert f"| {stage} |" in text
    assert "SKIPPED" not in text
    assert "## Before / after RL" in text and "1 logged steps" in text
    for name in ("reward", "memory_reward", "tokens", "sft"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC
    # the KL plot needs an actor update; a step whose update was skipped (no loss token) logs no KL
    from mempo.train.logging import read_metrics

    updated = any("actor/kl_loss" in row for row in read_metrics(out / "rl" / "metrics.jsonl"))
    assert (out / "kl.png").is_file() == updated and ("kl.png (no such metrics logged)" in text) == (not updated)
    for name in ("eval_before.json", "eval_after.json", "stages.json", "rl/metrics.jsonl", "model_rl/config.json"):
        assert (out / name).is_file(), name
