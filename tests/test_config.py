"""mempo.config: YAML round trip, dotted overrides with type conversion, errors naming fields."""
import subprocess
import sys

import pytest

from mempo.config import (ActorConfig, ConfigError, EvalConfig, MempoConfig, config_from_dict, dump_config,
                                load_config)


def test_defaults_match_the_brief():
    cfg = MempoConfig()
    assert cfg.rollout.group_size == 16 and cfg.rollout.max_turns == 8
    assert cfg.scoring.threshold == 0.5 and cfg.algorithm.epsilon == 1e-6 and cfg.algorithm.norm_adv_by_std
    assert cfg.algorithm.skip_zero_variance_groups and cfg.algorithm.memory_weight == 1.0
    a = cfg.actor
    assert (a.lr, a.grad_clip, a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c) == (1e-6, 1.0, 0.2, 0.28, 3.0)
    assert (a.loss_agg_mode, a.kl_coef, a.kl_estimator, a.entropy_coef, a.ppo_epochs) == \
        ("token-mean", 0.001, "low_var_kl", 0.0, 1)
    assert cfg.eval.max_turns == 64 and cfg.eval.objectives[:2] == [2, 4]


def test_yaml_round_trip(tmp_path):
    cfg = load_config(None, ["actor.lr=3e-6", "eval.objectives=[2, 8]", "scoring.threshold=null",
                             "rollout.context_policy=memory", "trainer.wandb=yes"])
    path = tmp_path / "run.yaml"
    text = dump_config(cfg, path)
    assert "lr: 3.0e-06" in text or "lr: 3e-06" in text
    again = load_config(path)
    assert again == cfg
    assert dump_config(again) == text


def test_load_yaml_with_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("actor:\n  lr: 1e-6\n  loss_agg_mode: seq-mean-token-mean\nrollout:\n  group_size: 4\n")
    cfg = load_config(path, overrides=["actor.lr=1e-5", "rollout.group_size=8", "actor.clip_ratio_c=none",
                                       "actor.micro_batch_tokens=4_096", "eval.policies=full,memory"])
    assert cfg.actor.lr == 1e-5 and isinstance(cfg.actor.lr, float)  # YAML 1.1 reads "1e-6" as a string
    assert cfg.rollout.group_size == 8 and cfg.actor.loss_agg_mode == "seq-mean-token-mean"
    assert cfg.actor.clip_ratio_c is None and cfg.actor.micro_batch_tokens == 4096
    assert cfg.eval.policies == ["full", "memory"]
    assert load_config(tmp_path / "c.yaml").actor.lr == 1e-6


def test_empty_yaml_is_all_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == MempoConfig()


@pytest.mark.parametrize("override, field, allowed", [
    ("actor.lr=fast", "actor.lr", "expected float"),
    ("actor.lr=0", "actor.lr", "must be > 0"),
    ("actor.lrr=1", "actor.lrr", "ActorConfig has:"),
    ("actors.lr=1", "actors", "MempoConfig has:"),
    ("rollout.group_size=0", "rollout.group_size", "must be > 0"),
    ("rollout.group_size=2.5", "rollout.group_size", "expected int"),
    ("rollout.context_policy=window", "rollout.context_policy", "'full', 'memory'"),
    ("rollout.backend=vllm", "rollout.backend", "'hf', 'sglang'"),
    ("scoring.method=fast", "scoring.method", "'packed', 'reference', 'cached'"),
    ("actor.loss_agg_mode=mean", "actor.loss_agg_mode", "'token-mean'"),
    ("actor.kl_estimator=k4", "actor.kl_estimator", "'low_var_kl'"),
    ("actor.clip_ratio_low=-0.1", "actor.clip_ratio_low", "must be > 0"),
    ("actor.clip_ratio_c=0.9", "actor.clip_ratio_c", "must be > 1"),
    ("algorithm.norm_adv_by_std=maybe", "algorithm.norm_adv_by_std", "expected bool"),
    ("eval.objectives=[2, x]", "eval.objectives[1]", "expected int"),
    ("eval.policies=[memory, window]", "eval.policies[1]", "'full', 'memory'"),
    ("trainer.keep_last=0", "trainer.keep_last", "must be > 0"),
    ("actor=1", "actor", "is a section"),
    ("actor.lr.x=1", "actor.lr", "is a field"),
    ("actor.lr", "actor.lr", "section.field=value"),
    ("rollout.sglang_url=http://127.0.0.1:30000", "rollout.sglang_url", "only used with backend 'sglang'"),
    ("rollout.sglang_mem_fraction=1.5", "rollout.sglang_mem_fraction", "must be in (0, 1)"),
    ("rollout.chat_template= ", "rollout.chat_template", "'auto', 'builtin' or the path"),
])
def test_errors_name_the_field_and_what_is_allowed(override, field, allowed):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert info.value.field == field
    assert str(info.value).startswith(field + ":")
    assert allowed in str(info.value)


@pytest.mark.parametrize("overrides, field, allowed", [
    (["rollout.backend=sglang", "rollout.sglang_url=127.0.0.1:30000"], "rollout.sglang_url", "http(s) URL"),
    (["rollout.backend=sglang", "rollout.protocol_scaffold=true"], "rollout.protocol_scaffold", "needs backend 'hf'"),
])
def test_cross_field_errors_name_the_field(overrides, field, allowed):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert info.value.field == field and allowed in str(info.value)


def test_sglang_backend_without_url_is_a_valid_config():
    """sglang_url null means the in-process engine (whether sglang is installed is checked when the
    backend is built: mempo.rollout.backends.factory)."""
    cfg = load_config(None, ["rollout.backend=sglang"])
    assert cfg.rollout.backend == "sglang" and cfg.rollout.sglang_url is None


def test_errors_from_yaml_name_nested_fields(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("actor:\n  ppo_epochs: 0\n")
    with pytest.raises(ConfigError, match=r"^actor\.ppo_epochs: must be > 0"):
        load_config(path)
    path.write_text("model:\n  hidden_size: 30\n")
    with pytest.raises(ConfigError, match=r"^model\.hidden_size: must be a multiple"):
        load_config(path)
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(path)
    path.write_text("actor: 3\n")
    with pytest.raises(ConfigError, match=r"^actor: expected a mapping of ActorConfig"):
        load_config(path)


def test_sections_validate_on_construction():
    with pytest.raises(ConfigError, match="^lr: must be > 0"):
        ActorConfig(lr=-1.0)
    assert ActorConfig(lr="2e-6").lr == 2e-6
    with pytest.raises(ConfigError, match=r"^objectives\[0\]: must be >= 1"):
        EvalConfig(objectives=[0])
    assert config_from_dict({"actor": {"lr": 2}}).actor.lr == 2.0


def test_importing_config_is_light():
    code = ("import sys, mempo.config, mempo.train; "
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_duplicated_key_is_an_error_naming_it_and_both_lines(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("actor:\n  lr: 1.0e-5\ntrainer:\n  total_steps: 3\nactor:\n  kl_coef: 0.0\n")
    with pytest.raises(ConfigError, match=r"dup.yaml: key 'actor' appears twice in one mapping \(lines 1 and 5\)"):
        load_config(path)
    path.write_text("actor:\n  lr: 1.0e-5\n  kl_coef: 0.1\n  lr: 2.0e-5\n")  # nested too
    with pytest.raises(ConfigError, match=r"key 'lr' appears twice in one mapping \(lines 2 and 4\)"):
        load_config(path)
    from mempo.config import read_yaml_mapping

    path.write_text("x: &b {lr: 1.0e-5, kl_coef: 0.1}\ny:\n  <<: *b\n  lr: 3.0e-5\n")
    assert read_yaml_mapping(path)["y"] == {"lr": 3.0e-5, "kl_coef": 0.1}  # a merged key may be overridden


def test_unreadable_config_files_are_one_line_config_errors(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"actor:\n  lr: 1.0e-5\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin.yaml:3: not valid UTF-8"):
        load_config(latin)
    with pytest.raises(ConfigError, match=r"nope.yaml: config file not found"):
        load_config(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("actor:\n  lr: [1,\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: not valid YAML: .* at line \d+") as error:
        load_config(broken)
    assert "\n" not in str(error.value)


def test_resume_defaults_to_never_and_determinism_to_auto():
    assert MempoConfig().trainer.resume == "never" and MempoConfig().trainer.deterministic is None
    assert config_from_dict({}, ["trainer.deterministic=false"]).trainer.deterministic is False
    with pytest.raises(ConfigError, match="data.world_entities: must be >= 20"):
        config_from_dict({}, ["data.world_entities=8"])


@pytest.mark.parametrize("impl", ["flash_attention_2", "flash_attention_3", "kernels-community/flash-attn"])
def test_flash_attention_refuses_fp32_weights(impl):
    """flash-attn has no fp32 kernels and actor.param_dtype covers only the FSDP training forward:
    fp32 weights with a flash implementation are refused, naming both fields; half precision or
    SDPA in fp32 are accepted."""
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"model.attn_implementation={impl}"])  # model.dtype defaults to float32
    assert info.value.field == "model.dtype"
    assert "attn_implementation" in str(info.value) and "bfloat16" in str(info.value)
    with pytest.raises(ConfigError, match="^model.dtype:"):
        load_config(None, [f"model.attn_implementation={impl}", "model.dtype=float32", "actor.param_dtype=bfloat16"])
    for dtype in ("bfloat16", "float16"):
        assert load_config(None, [f"model.attn_implementation={impl}", f"model.dtype={dtype}"]).model.dtype == dtype
    assert load_config(None, ["model.attn_implementation=sdpa", "model.dtype=float32"]).model.dtype == "float32"
