"""Every error a user can cause ends in one line naming the problem and exit code 2, never a
traceback (`mempo.apps.cli.main` prints each `mempo.errors.MempoError` as ``mempo <command>: <message>``).

Each case runs the installed ``mempo`` command line as a subprocess outside the source tree; the
cases are independent, so they run a few at a time (one fixture) and each test checks its own.
"""
import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.paths import REPO

TINY = str(REPO / "configs" / "tiny.yaml")
FAST = ["trainer.tensorboard=false", "trainer.progress=false", "data.questions_per_step=1", "rollout.group_size=2"]


def _dead_url() -> str:
    with socket.socket() as sock:  # nothing listens on this port once the socket is closed
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """{name: (mempo arguments, text the one line must contain)}; files the cases need are made here."""
    a_file = tmp / "a_file"
    a_file.write_text("not a directory\n")
    (tmp / "empty_model").mkdir()
    (tmp / "junk_model").mkdir()
    (tmp / "junk_model" / "notes.txt").write_text("no model here\n")
    (tmp / "empty.jsonl").write_text("")
    (tmp / "no_assistant.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    (tmp / "latin1.yaml").write_bytes(b"trainer:\n  total_steps: 2\n# r\xe9sum\xe9\n")
    (tmp / "dup.yaml").write_text("trainer:\n  total_steps: 2\nactor:\n  lr: 0.001\ntrainer:\n  save_every: 1\n")
    anchors = ["&a [1,1,1,1,1,1,1,1,1,1]"] + [f"&{n} [{','.join(['*' + p] * 10)}]" for p, n in zip("abc", "bcd")]
    bomb = "trainer:\n  seed: [" + ", ".join(anchors) + "]\n"  # 11,110 values: under the node bound, a long value
    (tmp / "bomb_in_field.yaml").write_text(bomb)
    (tmp / "qa_dir.jsonl").mkdir()
    (tmp / "newline.jsonl").write_text(json.dumps({"question": "who\nwrote it?", "answer": "x"}) + "\n")
    used = tmp / "used_run" / "checkpoints" / "step_00000002"
    used.mkdir(parents=True)
    index = tmp / "index"
    from mempo.env.corpus import Document, write_corpus
    from mempo.env.bm25 import load_or_build_bm25

    write_corpus(tmp / "corpus.jsonl", [Document(f"d{i}", f"title {i}", f"text number {i} about things")
                                        for i in range(20)])
    load_or_build_bm25(tmp / "corpus.jsonl", index).close()
    offsets = index / "documents.offsets.npy"
    offsets.write_bytes(offsets.read_bytes()[:40])  # a torn file
    url = _dead_url()
    (tmp / "rel.yaml").write_text("synthetic: {world_relations: [no_such_relation]}\n")
    for run in ("model_run", "sft_run"):  # a run directory whose model/ someone else filled
        (tmp / run / "model").mkdir(parents=True)
        (tmp / run / "model" / "mine.txt").write_text("not mempo's\n")

    def train(out, *overrides):
        return ["train", "--config", TINY, "--out", str(out), *FAST, *overrides]

    return {
        "threads": (["train", "--threads", "-1", "--out", str(tmp / "r1")], "--threads: must be"),
        "out_is_a_file": (train(a_file), "exists and is not a directory"),
        "missing_model_path": (train(tmp / "r2", "model.path=/nonexistent/model"),
                               "model.path: /nonexistent/model: no such directory"),
        "missing_corpus": (train(tmp / "r3", f"env.corpus_path={tmp / 'missing.jsonl'}"),
                           "missing.jsonl: corpus file not found"),
        "resume_nonexistent": (train(tmp / "r4", "trainer.resume=/nonexistent"),
                               "trainer.resume: /nonexistent: no such checkpoint directory"),
        "used_run_dir": (train(tmp / "used_run"), "already holds checkpoints"),
        "dead_retriever": (train(tmp / "r5", "env.retriever=http", f"env.retriever_url={url}"),
                           f"env.retriever_url: retriever at {url} failed its health check"),
        "latin1_yaml": (["train", "--config", str(tmp / "latin1.yaml"), "--out", str(tmp / "r6")],
                        "latin1.yaml:3: not valid UTF-8"),
        "duplicate_yaml_key": (["train", "--config", str(tmp / "dup.yaml"), "--out", str(tmp / "r7")],
                               "key 'trainer' appears twice in one mapping (lines 1 and 5)"),
        "small_world": (train(tmp / "r8", "synthetic.world_entities=8"), "synthetic.world_entities: must be"),
        "eval_empty_model_dir": (["eval", "--model", str(tmp / "empty_model"), "--out", str(tmp / "e1")],
                                 "--model: " + str(tmp / "empty_model") + " holds no saved model"),
        "eval_non_model_dir": (["eval", "--model", str(tmp / "junk_model"), "--out", str(tmp / "e2")],
                               "holds no saved model (none of config.json)"),
        "corrupt_index": (["serve-retriever", "--index-dir", str(index), "--port", "0"], "damaged BM25 index"),
        # issue 21 case 4: output paths are checked before the model loads (empty_model would fail that)
        "eval_out_is_a_file": (["eval", "--model", str(tmp / "empty_model"), "--out", str(a_file)],
                               f"--out: {a_file} exists and is not a directory"),
        # a second round of probes: --out under a file crashed after the whole evaluation
        "eval_out_under_a_file": (["eval", "--model", str(tmp / "empty_model"), "--out", str(a_file / "sub")],
                                  f"--out: {a_file / 'sub'}: cannot be made, {a_file} is not a directory"),
        "eval_empty_name": (["eval", "--model", str(tmp / "empty_model"), "--out", str(tmp / "e3"), "--name", ""],
                            "--name: '' is not a plain file stem"),
        "eval_hidden_name": (["eval", "--model", str(tmp / "empty_model"), "--out", str(tmp / "e4"), "--name",
                              ".x"], "--name: '.x' is not a plain file stem"),
        # issue 21 case 6: a value of 10^4 aliased items in one field: the one line stays short
        "alias_bomb_in_a_field": (["train", "--config", str(tmp / "bomb_in_field.yaml"), "--out", str(tmp / "r9")],
                                  "trainer.seed: expected int"),
        # issue 21 case 5: loaders check what later stages assume, before the model loads
        "train_files_directory": (train(tmp / "r10", "data.source=files", f"data.train_files=[{tmp / 'qa_dir.jsonl'}]",
                                        f"env.corpus_path={tmp / 'corpus.jsonl'}", "trainer.eval_every=0"),
                                  "qa_dir.jsonl: is a directory, not a QA file"),
        "eval_question_with_newline": (["eval", "--model", str(tmp / "empty_model"), "--out", str(tmp / "e5"),
                                        "eval.objectives=[1]", "--files", str(tmp / "newline.jsonl"), "--corpus",
                                        str(tmp / "corpus.jsonl")], "newline.jsonl:1: field 'question' holds a line "
                                                                    "break"),
        # issue 21 cases 5 and 6: model / tokenizer size mismatches refused at start-up (tiny.yaml:
        # rollout.max_response_tokens 1024)
        "vocab_below_tokenizer": (train(tmp / "r11", "model.vocab_size=16"),
                                  "model.vocab_size: the model has 16 token embeddings but the tokenizer has"),
        "context_below_sequence": (train(tmp / "r12", "model.max_position_embeddings=512"),
                                   "model.max_position_embeddings: the model's context is 512 positions, below the "
                                   "1024 ids"),
        "sft_empty_file": (["sft", "--config", TINY, "--out", str(tmp / "s1"), "--trajectories",
                            str(tmp / "empty.jsonl")], "empty.jsonl: no records"),
        "sft_no_assistant_turns": (["sft", "--config", TINY, "--out", str(tmp / "s2"), "--trajectories",
                                    str(tmp / "no_assistant.jsonl")], "no_assistant.jsonl: no assistant turns"),
        # issue 47, a third round of probes (C34, C36-C40, C38, C42): tracebacks or unbounded before
        "plan_config_dev_zero": (["plan", "--config", "/dev/zero"], "/dev/zero: too large a config: more than"),
        "world_unknown_relation": (["train", "--config", str(tmp / "rel.yaml"), "--out", str(tmp / "r13"), *FAST],
                                   "synthetic.world_relations: relations must be a non-empty subset of"),
        "world_hops_50": (train(tmp / "r14", "synthetic.world_question_hops=[50]"),
                          "synthetic.world_question_hops: hops must be in 1..4"),
        "world_documents_1": (train(tmp / "r15", "synthetic.world_documents=1"),
                              "synthetic.world_documents: num_documents=1 is too small"),
        "objectives_1000": (train(tmp / "r16", "data.num_objectives=1000"),
                            "data.num_objectives: the synthetic world (world_entities=25) cannot make episodes of "
                            "1000 objectives"),
        "world_distractors_1e7": (train(tmp / "r17", "synthetic.world_distractor_ratio=1e7"),
                                  "synthetic.world_distractor_ratio: 10000000.0 distractors for each of 25 entities"),
        "world_entities_1e7": (train(tmp / "r18", "synthetic.world_entities=10000000"),
                               "synthetic.world_entities: must be at most 1,000,000"),
        # issue 47: <out>/model is replaced at the end only when mempo wrote it; refused at the start
        "train_model_dir_not_mempo_s": (train(tmp / "model_run"), f"trainer.out_dir: {tmp / 'model_run' / 'model'} is "
                                                                  "a directory mempo did not write"),
        "sft_model_dir_not_mempo_s": (["sft", "--config", TINY, "--out", str(tmp / "sft_run"), "--trajectories",
                                       str(tmp / "no_assistant.jsonl")],
                                      f"trainer.out_dir: {tmp / 'sft_run' / 'model'} is a directory mempo did "
                                      "not write"),
    }


CASE_NAMES = ["threads", "out_is_a_file", "missing_model_path", "missing_corpus", "resume_nonexistent",
              "used_run_dir", "dead_retriever", "latin1_yaml", "duplicate_yaml_key", "small_world",
              "eval_empty_model_dir", "eval_non_model_dir", "corrupt_index", "sft_empty_file",
              "sft_no_assistant_turns", "eval_out_is_a_file", "eval_out_under_a_file", "eval_empty_name",
              "eval_hidden_name", "alias_bomb_in_a_field", "train_files_directory", "eval_question_with_newline",
              "vocab_below_tokenizer", "context_below_sequence", "plan_config_dev_zero", "world_unknown_relation",
              "world_hops_50", "world_documents_1", "objectives_1000", "world_distractors_1e7", "world_entities_1e7",
              "train_model_dir_not_mempo_s", "sft_model_dir_not_mempo_s"]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli_errors")
    cases = _cases(tmp)
    assert sorted(cases) == sorted(CASE_NAMES)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

    def run(name):
        argv, _ = cases[name]
        done = subprocess.run([sys.executable, "-m", "mempo.apps.cli", *argv], env=env, cwd=tmp, timeout=300,
                              capture_output=True, text=True)
        return name, done

    with ThreadPoolExecutor(max_workers=3) as pool:
        done = dict(pool.map(run, CASE_NAMES))
    return {name: (done[name], cases[name][1]) for name in CASE_NAMES}


@pytest.mark.parametrize("name", CASE_NAMES)
def test_user_error_is_one_line_and_exit_2(outcomes, name):
    done, expected = outcomes[name]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("mempo"), lines[0]
    assert expected in lines[0], lines[0]
    assert len(lines[0]) < 1200, lines[0][:3000]


def test_dotted_overrides_go_anywhere_among_the_options():
    """As people type them: overrides before, between and after the options, for every command."""
    from mempo.apps.ask_command import _question_and_overrides
    from mempo.apps.cli import build_parser
    from mempo.apps.eval_command import _eval_config
    from mempo.config import ConfigError

    parser = build_parser()
    args = parser.parse_args(["eval", "--model", "M", "eval.objectives=[2]", "--episodes", "8",
                              "eval.closed_book=false", "--out", "o"])
    assert (args.model, args.out, args.episodes) == ("M", "o", 8)
    assert args.overrides == ["eval.objectives=[2]", "eval.closed_book=false"]
    cfg = _eval_config(args)
    assert cfg.eval.objectives == [2] and cfg.eval.closed_book is False
    asked = _question_and_overrides(parser.parse_args(["ask", "--model", "M", "eval.max_turns=3",
                                                       "Who founded Wehel?", "--json", "eval.temperature=0.5"]))
    assert asked.question == "Who founded Wehel?" and asked.json
    assert asked.overrides == ["eval.max_turns=3", "eval.temperature=0.5"]
    with pytest.raises(ConfigError, match="give one question"):
        _question_and_overrides(parser.parse_args(["ask", "--model", "M", "Who?", "Where?"]))
    for argv in (["train", "a.b=1", "--config", "c", "--out", "o", "c.d=2"],
                 ["plan", "--config", "c", "a.b=1", "--nnodes", "2", "c.d=2"],
                 ["serve", "a.b=1", "--model", "M", "--port", "0", "c.d=2"]):
        assert parser.parse_args(argv).overrides == ["a.b=1", "c.d=2"], argv
    with pytest.raises(SystemExit):  # an unknown option is still argparse's error, exit 2
        parser.parse_args(["eval", "--model", "M", "--out", "o", "--no-such-option"])
