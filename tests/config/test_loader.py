"""mempo.config.loader: YAML round trip, dotted overrides with type conversion, file errors naming the file."""
import os
import subprocess
import sys
import threading

import pytest

from mempo.config import ConfigError, MempoConfig, dump_config, load_config


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


def _alias_bomb(levels: int, field_value: str) -> str:
    """A config whose fields nest `levels` lists of ten aliases each (10^levels values expanded), the
    last one given as the value of ``trainer.`` `field_value`."""
    names = "abcdefghij"[:levels]
    lines = ["bomb:", f"  - &{names[0]} [1,1,1,1,1,1,1,1,1,1]"]
    for previous, name in zip(names, names[1:]):
        lines.append(f"  - &{name} [" + ",".join([f"*{previous}"] * 10) + "]")
    return "\n".join(lines).replace("bomb:", "x:") + f"\ntrainer:\n  {field_value}: *{names[-1]}\n"


def test_nesting_and_alias_expansion_are_bounded(tmp_path):
    """Issue 21, cases 5 and 6: YAML nested 50,000 deep was a RecursionError; an alias bomb of nine
    levels ran out of memory (or made a 39 MB error line)."""
    from mempo.config.loader import MAX_YAML_DEPTH, MAX_YAML_NODES

    deep = tmp_path / "deep.yaml"
    deep.write_text("trainer:\n  seed: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(ConfigError, match=f"deep.yaml: too large a config: nested deeper than {MAX_YAML_DEPTH} "
                                          r"levels \(line 2\)"):
        load_config(deep)
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb(9, "total_steps"))
    assert len(bomb.read_bytes()) < 600
    with pytest.raises(ConfigError, match=f"bomb.yaml: too large a config: more than {MAX_YAML_NODES} values") as error:
        load_config(bomb)
    assert len(str(error.value)) < 200
    # the same bound on an override's list text (it was a RecursionError with a 3,000-line traceback)
    with pytest.raises(ConfigError, match=f"eval.objectives: nested deeper than {MAX_YAML_DEPTH} levels"):
        load_config(None, ["eval.objectives=" + "[" * 5_000 + "]" * 5_000])
    with pytest.raises(ConfigError, match="eval.objectives: not a valid list"):
        load_config(None, ["eval.objectives=[2, 4"])
    # a deep mapping / sequence under the bound is still a config (here: a list where an int is wanted)
    ok = tmp_path / "ok.yaml"
    ok.write_text("trainer:\n  seed: " + "[" * 20 + "1" + "]" * 20 + "\n")
    with pytest.raises(ConfigError, match="trainer.seed: expected int"):
        load_config(ok)


def test_a_config_is_read_with_a_bound_and_a_pipe_still_works(tmp_path):
    """Issue 47 C34: ``--config /dev/zero`` read without a bound (a MemoryError); a FIFO is read as the
    pipe it is (C44), and a file over `MAX_CONFIG_BYTES` is one line."""
    from mempo.config.loader import MAX_CONFIG_BYTES

    with pytest.raises(ConfigError, match=f"/dev/zero: too large a config: more than {MAX_CONFIG_BYTES:,} bytes"):
        load_config("/dev/zero")
    big = tmp_path / "big.yaml"
    big.write_text("trainer:\n  seed: 1\n" + "#" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match="big.yaml: too large a config"):
        load_config(big)
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("trainer:\n  total_steps: 7\n"))
    writer.start()
    assert load_config(fifo).trainer.total_steps == 7
    writer.join(10)
