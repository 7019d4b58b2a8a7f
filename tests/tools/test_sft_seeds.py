"""tools/sft_seeds.py (the demo's stages up to SFT for several seeds) at the smallest demo sizes:
one row per seed with the evaluation at k = 2 (or the --ks of a --config, on the split eval.split
names) and the memory shares, a rerun skips finished seeds, and the memory shares are those of the
last `<mem>` of each episode."""
import json

from mempo.config import load_config
from mempo.eval import eval_episodes
from mempo.synthetic.build import synthetic_world
from mempo.utils.digest import weights_digest
from support.demo_smoke import SMOKE
from support.paths import REPO, load_script


def load_sft_seeds():
    """tools/sft_seeds.py as a module (tools/ is not a package)."""
    return load_script("tools/sft_seeds.py")


def test_one_row_per_seed_and_a_rerun_continues(tmp_path):
    tool = load_sft_seeds()
    out, episodes = tmp_path / "rows.jsonl", tmp_path / "episodes"
    argv = ["--seeds", "0", "--out", str(out), "--threads", "1", "--episodes-dir", str(episodes), *SMOKE]
    assert tool.main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["seed"] for row in rows] == [0]
    row = rows[0]
    assert row["overrides"] == SMOKE and row["sft_steps"] == 1 and row["threads"] == 1
    assert 0.0 <= row["em_k2"] <= 1.0 and 0.0 <= row["format_k2"] <= 1.0
    assert abs(sum(row["mem_kinds"].values()) - 1.0) < 1e-6
    assert len(row["right_by_position"]) == 2 and all(0.0 <= x <= 1.0 for x in row["right_by_position"])
    assert (episodes / f"{tool.episodes_tag(SMOKE)}_s0.jsonl").is_file()
    assert tool.episodes_tag([]) == "default" and len(tool.episodes_tag(SMOKE)) <= 80

    assert row["cpu_capability"] == tool.cpu_facts()["cpu_capability"]  # the SFT model follows the CPU's kernels

    assert tool.main(argv) == 0  # seed 0 is there: nothing is run again
    assert len(out.read_text().splitlines()) == 1
    # a row made on another CPU model is another measurement: it does not count as done here
    other = dict(row, cpu_model="Another CPU @ 9 GHz")
    out.write_text(json.dumps(other) + "\n")
    assert tool.main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seed"] for r in rows] == [0, 0] and rows[1].get("cpu_model") == row.get("cpu_model")


def test_the_ks_and_the_split_of_a_config_are_evaluated(tmp_path, capsys):
    """--config and --ks: an SFT gate judged at k = 2 and 4 on the validation split (eval.split); each k's
    episodes, named by the config; a k outside eval.objectives is refused before any run."""
    tool = load_sft_seeds()
    out, episodes = tmp_path / "rows.jsonl", tmp_path / "episodes"
    config = REPO / "configs" / "demo.yaml"
    split = ["eval.validation_episodes=2", "eval.split=validation"]
    argv = ["--seeds", "0", "--out", str(out), "--threads", "1", "--episodes-dir", str(episodes),
            "--config", str(config), "--ks", "2", "4", *SMOKE, *split]
    assert tool.main([*argv, "--models-dir", str(tmp_path / "models")]) == 0
    row = json.loads(out.read_text())
    tag = f"demo_{tool.episodes_tag([*SMOKE, *split])}_s0"
    assert row["weights_sha256"] == weights_digest(tmp_path / "models" / tag / "model_sft")
    assert row["split"] == "validation" and row["ks"] == [2, 4] and row["config"] == str(config)
    assert 0.0 <= row["em_k4"] <= 1.0 and len(row["right_by_position_k4"]) == 4 and 0.0 <= row["em_k2"] <= 1.0
    assert row["mem_kinds"] == row["mem_kinds_k2"] and "mem_kinds_k4" in row
    cfg = tool.seed_config(0, [*SMOKE, *split], config)
    validation = eval_episodes(synthetic_world(cfg), cfg)
    for k, path in ((2, episodes / f"{tag}.jsonl"), (4, episodes / f"{tag}_k4.jsonl")):
        ids = [json.loads(line)["episode_id"] for line in path.read_text().splitlines()]
        assert ids == [e.id for e in validation[k]]
    assert load_config(config, [*SMOKE, *split]).eval.split == "validation"
    assert tool.main(argv) == 0 and len(out.read_text().splitlines()) == 1  # the same config and ks: done
    assert tool.main([*argv[:-len(SMOKE) - 2], "6", *SMOKE, *split]) == 2  # --ks 2 4 6: 6 is not evaluated
    assert "--ks: k=[6] is not among eval.objectives [2, 4]" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 1


def test_memory_shares_read_the_last_mem_of_each_episode(tmp_path):
    tool = load_sft_seeds()
    path = tmp_path / "episodes.jsonl"
    records = [
        {"golds": [["Minu"], ["Lidar"]],
         "rounds": [{"assistant": "<mem>\nQ1: ?\nQ2: ?\n</mem>\n<search> q </search>"},
                    {"assistant": "<mem>\nQ1: Bedur was born in the city of Minu.\nQ2: done\n</mem>\n"
                                  "<answer>Minu; unknown</answer>"}]},
        {"golds": [["Rupum"], ["Sokol"]],
         "rounds": [{"assistant": "<mem>\nQ1: Bevat studied at Nefu.\n</mem>\n<search> q </search>"}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert tool.mem_kinds(path) == {"gold": 0.25, "dropped": 0.25, "other": 0.25, "pending": 0.25}


def test_right_by_position_counts_each_answer_slot(tmp_path):
    tool = load_sft_seeds()
    path = tmp_path / "episodes.jsonl"
    records = [{"golds": [["Minu"], ["Lidar"]], "predictions": ["unknown", "lidar"]},  # normalised match
               {"golds": [["Rupum"], ["Sokol"]], "predictions": ["Rupum", "Sokol"]},
               {"golds": [["Tefot"], ["Gadok"]], "predictions": []},  # no answer
               {"golds": [["A"], ["B"]], "predictions": ["B", "A"]}]  # the right names in the wrong slots
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert tool.right_by_position(path) == [0.25, 0.5]
