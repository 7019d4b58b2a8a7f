"""The `mempo eval` command (mempo.apps.eval_command): the synthetic world and QA files, its outputs,
its errors (the reader agent and the files: `support.qa_eval`)."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

from mempo.config import ConfigError
from mempo.env.build import build_retriever
from mempo.eval import EpisodeRecord, EvalReport
from support.qa_eval import answerable, make_cfg, write_jsonl
from support.rollout_fixtures import chat_tokenizer, tiny_qwen2


def test_eval_command(tmp_path):
    from mempo.apps.cli import main

    tok = chat_tokenizer()
    model = tiny_qwen2(len(tok))
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out = tmp_path / "out"
    rc = main(["eval", "--model", str(model_dir), "--out", str(out), "--no-progress", "synthetic.world_entities=30",
               "eval.objectives=[1]", "eval.episodes=1", "eval.max_turns=2", "rollout.max_new_tokens_per_round=8"])
    assert rc == 0
    report = EvalReport.load(out / "eval.json")
    assert [(r.objectives, r.policy, r.episodes) for r in report.rows] == [(1, "memory", 1)]
    assert (out / "eval.md").is_file()
    assert main(["eval", "--model", str(tmp_path / "missing"), "--out", str(out)]) == 2


def test_eval_command_reads_the_split_eval_split_names(tmp_path):
    """eval.split=validation: `mempo eval` evaluates the validation episodes (none of whose entities a
    test episode asks about), --episodes counts within them, and the report names the split."""
    from mempo.apps.cli import main
    from mempo.config import load_config
    from mempo.eval import eval_episodes
    from mempo.synthetic.build import synthetic_world

    tok = chat_tokenizer()
    model_dir = tmp_path / "model"
    tiny_qwen2(len(tok)).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    overrides = ["synthetic.world_entities=40", "eval.objectives=[1]", "eval.episodes=2", "eval.validation_episodes=3",
                 "eval.max_turns=2", "rollout.max_new_tokens_per_round=8"]
    cfg = load_config(None, overrides)
    world = synthetic_world(cfg)
    for split, expected in (("test", eval_episodes(world, cfg, split="test")[1]),
                            ("validation", eval_episodes(world, cfg, split="validation")[1][:2])):
        out = tmp_path / split
        assert main(["eval", "--model", str(model_dir), "--out", str(out), "--no-progress", "--episodes", "2",
                     *overrides, f"eval.split={split}"]) == 0
        report = EvalReport.load(out / "eval.json")
        assert report.metadata["split"] == split and f"split={split}" in (out / "eval.md").read_text()
        ids = [json.loads(line)["episode_id"] for line in (out / "eval_trajectories.jsonl").read_text().splitlines()]
        assert ids == [e.id for e in expected]
    assert main(["eval", "--model", str(model_dir), "--out", str(tmp_path / "more"), "--episodes", "4", *overrides,
                 "eval.split=validation"]) == 2  # 3 validation episodes per k are held out


def test_synthetic_world_follows_the_data_section():
    """train, eval and the demo build the world through `synthetic_world`: the synthetic section's size
    and filler options reach it (a demo config's world is rebuilt exactly by `mempo eval`)."""
    from mempo.config import load_config
    from mempo.synthetic.build import synthetic_world

    cfg = load_config(None, ["synthetic.world_documents=120", "synthetic.article_fillers=[0,1]",
                             "synthetic.world_seed=3"])
    world = synthetic_world(cfg)
    assert world.num_documents == 120
    assert world.manifest()["params"]["article_fillers"] == [0, 1]
    again = synthetic_world(load_config(None, ["synthetic.world_documents=120", "synthetic.article_fillers=[0,1]",
                                               "synthetic.world_seed=3"]))
    assert [d.text for d in again.documents()] == [d.text for d in world.documents()]
    default = synthetic_world(load_config(None, ["synthetic.world_entities=30"]))
    assert len(default.entities) == 30 and "article_fillers" not in default.manifest()["params"]


def test_eval_command_on_files_writes_tables_trajectories_and_report(tmp_path, qa_files, model_dir):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "mempo.apps.cli", "eval", "--model", str(model_dir), "--out", str(out),
               "--no-progress", "eval.objectives=[1,2]", "eval.episodes=2", "eval.max_turns=3",
               "eval.policies=[memory,full]", "rollout.max_new_tokens_per_round=12", "env.doc_chars=200",
               "--data", "files", "--files", str(qa_files[0]), str(qa_files[1]),
               "--corpus", str(tmp_path / "corpus.jsonl")]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)  # the installed package
    assert done.returncode == 0, done.stderr
    report = EvalReport.load(out / "eval.json")
    assert [(r.dataset, r.objectives, r.policy, r.episodes) for r in report.rows] == [
        (d, k, p, 2) for d in ("alpha", "beta", "mixed") for k in (1, 2) for p in ("memory", "full")]
    for row in report.rows:
        assert 0.0 <= row.em <= 1.0 and 1 <= row.mean_turns <= 3 and row.peak_prompt_tokens > 0
    assert report.metadata["data"] == "files" and report.metadata["datasets"]["mixed"]["questions"] == 7
    assert report.metadata["retriever"] == f"bm25 over {tmp_path / 'corpus.jsonl'}"
    markdown = (out / "eval.md").read_text()
    assert markdown.count("### Dataset `") == 3 and markdown.count("| k | policy |") == 6
    # the random model answers nothing right: every table shows a failed episode and says so of the correct one
    assert markdown.count("No correct episode in this table.") + markdown.count("A correct episode") == 6
    assert markdown.count("A failed episode") + markdown.count("No failed episode in this table.") == 6
    assert "[assistant, turn 1] <mem>" in markdown
    lines = (out / "eval_trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 3 * 2 * 2 * 2
    records = [EpisodeRecord.from_dict(json.loads(line)) for line in lines]
    assert all(r.rounds and r.rounds[0].assistant.startswith("<mem>") and r.golds for r in records)
    assert "EM" in done.stdout and "wrote" in done.stdout and "A failed episode" not in done.stdout


def _run(args, capsys):
    from mempo.apps.cli import main

    code = main(["eval", *args])
    return code, capsys.readouterr().err


def test_eval_command_errors_name_the_file_or_field(tmp_path, qa_files, capsys):
    model = tmp_path / "model"
    model.mkdir()  # data errors come before the model is loaded
    base = ["--model", str(model), "--out", str(tmp_path / "out"), "--no-progress"]
    corpus = ["--corpus", str(tmp_path / "corpus.jsonl")]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    small = write_jsonl(tmp_path / "small.jsonl", [answerable(i) for i in range(3)])
    cases = [
        (["--files", str(tmp_path / "absent.jsonl"), *corpus], f"data.eval_files: {tmp_path / 'absent.jsonl'}: "
                                                               "QA file not found"),
        (["--files", str(empty), *corpus], f"{empty}: no QA records"),
        (["eval.objectives=[2,5]", "--files", str(small), *corpus],
         "eval.objectives: k=5 needs at least 5 questions per dataset; dataset 'small'"),
        (["--files", str(small)], "env.corpus_path: must name a corpus"),
        (["--files", str(small), "--corpus", str(tmp_path / "nope.jsonl")],
         f"env.corpus_path: {tmp_path / 'nope.jsonl'}: corpus file not found"),
        (["--data", "files", *corpus], "data.eval_files: must list at least one QA file"),
        (["--files", str(small), *corpus, "--retriever-url", "http://127.0.0.1:1"], "not both"),
        (["--data", "synthetic", "--files", str(small)], "data.source: --files lists QA files"),
        (["--files", str(small), "eval.episodes=2", *corpus], "looks like a config override"),
        (["--files", str(small), *corpus], f"--model: {model} holds no saved model"),
    ]
    for args, message in cases:
        overrides = [] if args[0].startswith("eval.") else ["eval.objectives=[1]"]
        code, err = _run([*base, *overrides, *args], capsys)
        last = err.strip().splitlines()[-1]  # progress lines (an index build) may come first
        assert code == 2 and last.startswith("mempo eval: ") and message in last, (args, err)
    bad = write_jsonl(tmp_path / "bad.jsonl", [answerable(0), {"question": "no gold"}])
    code, err = _run([*base, "eval.objectives=[1]", "--files", str(bad), *corpus], capsys)
    assert code == 2 and f"{bad}:2: missing gold answers" in err


def test_an_unreachable_retriever_fails_before_any_episode(tmp_path, qa_files, capsys):
    import socket

    with socket.socket() as probe:  # a free port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = tmp_path / "model"
    model.mkdir()
    code, err = _run(["--model", str(model), "--out", str(tmp_path / "out"), "eval.objectives=[1]",
                      "--files", str(qa_files[0]),
                      "--retriever-url", f"http://127.0.0.1:{port}"], capsys)
    assert code == 2 and (f"mempo eval: env.retriever_url: retriever at http://127.0.0.1:{port} failed its health "
                          "check") in err
    with pytest.raises(ConfigError, match="env.retriever_url"):
        build_retriever(make_cfg(tmp_path, qa_files, retriever="http", retriever_url="ftp://x"))


def test_every_tool_call_failed_is_exit_2_unless_accepted(tmp_path, qa_files, model_dir, capsys, monkeypatch):
    """Issue 21, case 1: the report is written, then one line saying every call failed and exit 2;
    ``eval.allow_failed_tools=true`` accepts it (exit 0)."""
    import mempo.eval
    from mempo.eval import EvalRow

    def all_failed(model, tokenizer, episodes, retriever, cfg, **kwargs):
        row = EvalRow(objectives=1, policy="memory", episodes=1, em=0.0, f1=0.0, score=0.0, format_rate=1.0,
                      answer_rate=1.0, mean_turns=2.0, prompt_tokens_per_episode=10.0, peak_prompt_tokens=10,
                      mean_prompt_tokens_per_turn=5.0, generated_tokens_per_episode=4.0, dataset="alpha",
                      tool_calls=3, failed_tool_calls=3)
        return EvalReport([row], {"tool_calls": 3, "failed_tool_calls": 3, "retriever_name": "HTTPRetriever at u",
                                    "tools_name": "retriever: HTTPRetriever at u"})

    monkeypatch.setattr(mempo.eval, "evaluate", all_failed)
    base = ["--model", str(model_dir), "--no-progress", "--no-trajectories", "--corpus", str(tmp_path / "corpus.jsonl"),
            "--files", str(qa_files[0])]
    code, err = _run(["--out", str(tmp_path / "o1"), "eval.objectives=[1]", *base], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("mempo eval: eval.allow_failed_tools: every tool call failed (3 calls, "
                                         "retriever: HTTPRetriever at u)"), err
    assert (tmp_path / "o1" / "eval.json").is_file()  # the numbers are kept, with their counts
    code, err = _run(["--out", str(tmp_path / "o2"), "eval.objectives=[1]", "eval.allow_failed_tools=true", *base],
                     capsys)
    assert code == 0, err


def test_eval_command_builds_a_users_tools_and_reward(tmp_path, model_dir, capsys):
    """`mempo eval` with the user's tools and reward named in overrides (tests/support/user_tools.py): the
    episodes are scored by that reward (a random model calls no tool; tests/eval/test_run.py has a scripted
    agent that does), and a reward returning NaN stops the command with one line naming it."""
    from mempo.apps.cli import main
    from support import user_tools

    user_tools.REWARD_CALLS.clear()
    common = ["--no-progress", "synthetic.world_entities=30", "eval.objectives=[1]", "eval.episodes=2",
              "eval.max_turns=2", "rollout.max_new_tokens_per_round=8", "rollout.action_format=json",
              "env.tools=['support.user_tools:lookup', search]"]
    out = tmp_path / "out"
    assert main(["eval", "--model", str(model_dir), "--out", str(out), *common,
                 "rollout.outcome_reward=support.user_tools:overlap_reward"]) == 0
    assert len(user_tools.REWARD_CALLS) == 2 and EvalReport.load(out / "eval.json").rows[0].episodes == 2
    assert main(["eval", "--model", str(model_dir), "--out", str(tmp_path / "nan"), *common,
                 "rollout.outcome_reward=support.user_tools:nan_reward"]) == 2
    err = capsys.readouterr().err
    mine = [line for line in err.splitlines() if line.startswith("mempo eval: ")]  # transformers prints progress
    assert len(mine) == 1 and "Traceback" not in err, err
    assert mine[0].startswith("mempo eval: rollout.outcome_reward: support.user_tools:nan_reward returned nan")
