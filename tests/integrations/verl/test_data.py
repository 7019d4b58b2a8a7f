"""The verl example: QA files -> verl parquet (read back as verl's dataset rows and by the agent loop's
readers), and the launch script's overrides and agent-loop YAML checked against verl 0.9.1's config."""
import json
import re

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install .[verl])")
pq = pytest.importorskip("pyarrow.parquet")
pytestmark = pytest.mark.verl

from omegaconf import OmegaConf  # noqa: E402
from support.paths import REPO  # noqa: E402

from mempo.integrations.verl.agent_loop import _golds, _question, loop_settings  # noqa: E402
from mempo.integrations.verl.data import main  # noqa: E402
from mempo.protocol.reward import objectives_from_golds  # noqa: E402

EXAMPLE = REPO / "examples" / "verl"


def _qa(path, n, source="nq"):
    path.write_text("".join(json.dumps({"id": f"{source}{i}", "question": f"who wrote book {i}?",
                                        "golden_answers": [f"Author {i}", f"A. {i}"], "data_source": source}) + "\n"
                            for i in range(n)))
    return path


def test_parquet_rows_are_what_verl_and_the_loop_read(tmp_path, capsys):
    train, val = _qa(tmp_path / "train.jsonl", 6), _qa(tmp_path / "val.jsonl", 3, "hotpotqa")
    assert main(["--train", str(train), "--val", str(val), "--out", str(tmp_path / "data")]) == 0
    rows = pq.read_table(tmp_path / "data" / "train.parquet").to_pandas()
    assert len(rows) == 6 and set(rows["agent_name"]) == {"mempo_agent"} and set(rows["data_source"]) == {"nq"}
    row = rows.iloc[0]
    question, system = _question(row["prompt"])  # numpy arrays of dicts, as verl's dataset hands them on
    assert system is None and "who wrote book" in question and "<answer>" in question
    golds = _golds(row["reward_model"])
    i = int(re.search(r"book (\d+)", question).group(1))
    assert objectives_from_golds(golds) == [[f"Author {i}", f"A. {i}"]]
    assert "Author" not in question
    val_rows = pq.read_table(tmp_path / "data" / "val.parquet").to_pandas()
    assert set(val_rows["agent_name"]) == {"mempo_agent_eval"} and set(val_rows["data_source"]) == {"hotpotqa"}
    assert main(["--train", str(train), "--val", str(val), "--out", str(tmp_path / "k2"), "--objectives", "2",
                 "--train-episodes", "5"]) == 0
    two = pq.read_table(tmp_path / "k2" / "train.parquet").to_pandas()
    assert len(two) == 5 and len(objectives_from_golds(_golds(two.iloc[0]["reward_model"]))) == 2
    assert main(["--train", str(train), "--val", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


def _has(config, dotted):
    *path, last = dotted.split(".")
    node = config
    for part in path:
        if part not in node.keys():
            return False
        node = node[part]
    return last in node.keys()


def test_launch_script_overrides_exist_in_verls_config_and_the_yaml_is_valid():
    import verl
    from pathlib import Path

    config = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    script = (EXAMPLE / "run_qwen2.5-3b_sglang.sh").read_text()
    keys = re.findall(r"^\s+(\+?[a-z_][\w.]*)=", script, re.M)
    assert "trainer.v1.trainer_mode" in keys and len(keys) > 30
    assert [k for k in keys if not k.startswith("+") and not _has(config, k)] == []
    assert [k for k in keys if k.startswith("+") and not k.startswith("+algorithm.mempo.")] == []
    assert "trainer.v1.trainer_mode=mempo_sync" in script and "rollout.name=sglang" in script
    for entry in OmegaConf.load(EXAMPLE / "agents.yaml"):
        options = {k: v for k, v in OmegaConf.to_container(entry).items() if k not in ("name", "_target_")}
        loop_settings(options, entry=entry.name, score_memory=entry.name == "mempo_agent", response_length=6144)
        assert entry._target_.startswith("mempo.integrations.verl.agent_loop.")
    for entry in OmegaConf.load(REPO / "mempo" / "integrations" / "verl" / "agents.yaml"):
        options = {k: v for k, v in OmegaConf.to_container(entry).items() if k not in ("name", "_target_")}
        loop_settings(options, entry=entry.name, score_memory=entry.name == "mempo_agent", response_length=4096)


def test_outputs_and_episode_counts_that_cannot_work_are_one_line(tmp_path, capsys):
    """Issue 47 V02, V04, V05: --out an existing file and ``train.parquet`` a folder were tracebacks,
    --train-episodes 0 wrote a parquet of no rows and no columns with exit 0; a write that fails
    (here ``train.parquet.partial`` is a folder) was an OSError traceback."""
    train, val = _qa(tmp_path / "train.jsonl", 4), _qa(tmp_path / "val.jsonl", 2)
    (tmp_path / "afile").write_text("keep me")
    (tmp_path / "d" / "train.parquet").mkdir(parents=True)
    (tmp_path / "p" / "train.parquet.partial").mkdir(parents=True)
    cases = [(["--out", str(tmp_path / "afile")], f"--out: {tmp_path / 'afile'} exists and is not a directory"),
             (["--out", str(tmp_path / "afile" / "sub")], "cannot be made"),
             (["--out", str(tmp_path / "d")], "train.parquet is a directory; a file is written there"),
             (["--out", str(tmp_path / "o"), "--train-episodes", "0"], "--train-episodes: must be a number of "
                                                                       "episodes >= 1"),
             (["--out", str(tmp_path / "o"), "--val-episodes", "0"], "--val-episodes: must be"),
             (["--out", str(tmp_path / "p")], "Is a directory")]
    for argv, expected in cases:
        assert main(["--train", str(train), "--val", str(val), *argv]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("mempo verl data: ") and expected in err[0], (argv, err)
    assert (tmp_path / "afile").read_text() == "keep me" and not (tmp_path / "o").exists()


def test_the_prompt_style_for_your_tools_names_no_tool(tmp_path, capsys):
    from mempo.env.data import TOOLS_INSTRUCTIONS, parse_episode_prompt

    train, val = _qa(tmp_path / "train.jsonl", 2), _qa(tmp_path / "val.jsonl", 2)
    assert main(["--train", str(train), "--val", str(val), "--out", str(tmp_path / "default")]) == 0
    question, _ = _question(pq.read_table(tmp_path / "default" / "train.parquet").to_pandas().iloc[0]["prompt"])
    assert "<search>" in question  # the built-in tools' instructions
    assert main(["--train", str(train), "--val", str(val), "--out", str(tmp_path / "tools"),
                 "--prompt-style", "tools"]) == 0
    for split in ("train", "val"):
        question, _ = _question(pq.read_table(tmp_path / "tools" / f"{split}.parquet").to_pandas().iloc[0]["prompt"])
        assert question.startswith(TOOLS_INSTRUCTIONS) and "search" not in question and "access" not in question
        assert parse_episode_prompt(question)[0].startswith("who wrote book")
    capsys.readouterr()
    with pytest.raises(SystemExit) as caught:
        main(["--train", str(train), "--val", str(val), "--out", str(tmp_path / "x"), "--prompt-style", "xml"])
    assert caught.value.code == 2 and "--prompt-style: invalid choice: 'xml'" in capsys.readouterr().err
