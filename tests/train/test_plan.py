"""mempo.train.plan and `mempo plan`: the planner's model-state bytes (sharded parameters,
gradients, AdamW moments) are within 20 % of what torch holds on each of 2 gloo ranks (FSDP2) and in
one process, for three small configs; parameters are counted exactly; the presets fit 8 x 80 GiB
and the command says what to turn when a config does not fit."""
import json

import pytest

pytest.importorskip("transformers")

from support.dist import torchrun  # noqa: E402
from support.paths import REPO, SUPPORT  # noqa: E402
from support.plan_worker import run  # noqa: E402

from mempo.apps.cli import main  # noqa: E402
from mempo.config import ConfigError, load_config  # noqa: E402
from mempo.model.loading import build_causal_lm  # noqa: E402
from mempo.train.plan import format_plan, model_shape, parse_bytes, plan_memory  # noqa: E402


def _within(result, share=0.20):
    for name, row in result.items():
        assert abs(row["predicted"] - row["measured"]) <= share * row["measured"], (name, row)


def test_model_state_prediction_matches_torch_on_2_ranks_and_1_process(tmp_path):
    (tmp_path / "two").mkdir()
    torchrun(SUPPORT / "plan_worker.py", tmp_path / "two", nproc=2, what="the 2-rank model-state measurement")
    two = json.loads((tmp_path / "two" / "model_state.json").read_text())
    one = run(tmp_path)
    assert len(two) == len(one) == 3 and all(row["world"] == 2 for row in two.values())
    _within(two)
    _within(one)
    for name in one:  # sharding halves the model state (up to padding)
        assert two[name]["measured"] <= 0.55 * one[name]["measured"]


def test_parameters_are_counted_exactly():
    cfg = load_config(REPO / "configs" / "tiny.yaml", ["model.vocab_size=500"])
    shape = model_shape(cfg)
    model = build_causal_lm(cfg.model)
    assert shape.parameters == sum(p.numel() for p in model.parameters())


def test_presets_fit_8_gpus_and_a_big_config_gets_advice(capsys):
    for preset in ("qwen2.5-3b-8gpu.yaml", "qwen2.5-7b-8gpu.yaml"):
        assert main(["plan", "--config", str(REPO / "configs" / preset), "--nproc-per-node", "8",
                     "--gpu-memory", "80GiB"]) == 0
        assert "fits" in capsys.readouterr().out
    cfg = load_config(REPO / "configs" / "qwen2.5-7b-8gpu.yaml", ["actor.gradient_checkpointing=false"])
    plan = plan_memory(cfg, 1, parse_bytes("80GiB"))
    assert not plan.fits and any("gradient_checkpointing" in tip for tip in plan.advice)
    assert plan.parameters == 7_615_616_512  # the published Qwen2.5-7B: 7.62 B
    # trainer.async_save: the host copy of each rank's parameter and moment shards (fp32: 12 bytes per
    # parameter over 8 ranks, padding aside), said per rank; nothing without it
    preset = REPO / "configs" / "qwen2.5-7b-8gpu.yaml"
    assert plan_memory(load_config(preset, ["trainer.async_save=false"]), 8, parse_bytes("80GiB")).host == {}
    saving = plan_memory(load_config(preset, ["trainer.async_save=true", "model.dtype=float32"]), 8,
                         parse_bytes("80GiB"))
    (part, host), = saving.host.items()
    assert "async save" in part and abs(host - 12 * saving.parameters / 8) <= 0.01 * host
    assert f"host memory per rank: {part}: {host / 2 ** 30:.2f} GiB" in format_plan(saving)
    with pytest.raises(ConfigError, match="--gpu-memory"):
        parse_bytes("lots")
    assert parse_bytes("80GiB") == 80 << 30 and parse_bytes("141GB") == 141 * 10 ** 9


def test_teacher_scoring_gathers_one_layer_and_only_hf_generation_the_whole_model():
    cfg = load_config(REPO / "configs" / "qwen2.5-7b-8gpu.yaml")
    assert cfg.rollout.backend == "sglang"
    stages = {stage.name: stage for stage in plan_memory(cfg, 8, parse_bytes("80GiB")).stages}
    scoring = stages["teacher scoring (on the shards)"]
    assert "whole model gathered" not in scoring.parts
    assert scoring.parts["one layer gathered"] < 0.05 * plan_memory(cfg, 8, parse_bytes("80GiB")).parameters * 2
    assert not any(name.startswith("HF generation") for name in stages)
    hf = plan_memory(load_config(REPO / "configs" / "qwen2.5-7b-8gpu.yaml",
                                 ["rollout.backend=hf", "rollout.dtype=null"]), 8, parse_bytes("80GiB"))
    generation = next(stage for stage in hf.stages if stage.name.startswith("HF generation"))
    assert generation.parts["whole model gathered"] == hf.parameters * 2  # bf16 compute


@pytest.mark.parametrize("argv, expected", [
    # issue 47 P04: int(inf) in parse_bytes was an OverflowError traceback
    (["--gpu-memory", "1e400GiB"], "--gpu-memory: '1e400GiB' is larger than any memory"),
    (["--gpu-memory", "1e30GiB"], "--gpu-memory: '1e30GiB' is larger than any memory"),
    # P08: the meta model overflowed torch's storage size (or took minutes to build 10^5 layers)
    (["model.hidden_size=1000000000", "model.intermediate_size=4000000000", "model.num_hidden_layers=100000"],
     "model.num_hidden_layers: must be at most 10,000"),
    (["model.hidden_size=1000000000", "model.intermediate_size=4000000000"],
     "model.intermediate_size: a 1000000000 x 4000000000 weight (hidden_size x intermediate_size) in float32 "
     "would reach 2^63 bytes"),
    # cosmetic: --nnodes 0 named --nproc-per-node
    (["--nnodes", "0"], "--nnodes: must be >= 1, got 0"),
])
def test_absurd_sizes_are_one_line_not_an_overflow(argv, expected, capsys):
    assert main(["plan", "--config", str(REPO / "configs" / "tiny.yaml"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mempo plan: ") and expected in err[0], err


def test_a_huge_model_that_torch_can_size_gets_a_plan_that_does_not_fit(capsys):
    assert main(["plan", "--config", str(REPO / "configs" / "tiny.yaml"), "model.hidden_size=1000000",
                 "model.intermediate_size=4000000", "model.num_hidden_layers=1000"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
