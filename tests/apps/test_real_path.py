"""The path a user takes with their own model, end to end on CPU, through the command line:

    a Qwen2 saved with save_pretrained (random small weights, its own BPE tokenizer with a ChatML
    chat template; nothing marks it as built-in)
    -> mempo sft --trajectories oracle.jsonl            (a subprocess)
    -> torchrun --nproc_per_node 2 -m mempo.apps.cli train   (gloo, FSDP2; QA files over a corpus)

and checks that every model directory loads as a plain HF model, the final one whole (the FSDP2
shards gathered) and trained (it differs from the SFT model), the metrics are finite, and no gold
string reached generation in any process (tests/support/gold_trace_site puts the instrumentation of
tests/support/gold_trace.py into every Python process of the run). Each stage is one `_cli` call on the
files made by `_user_files`; the last one evaluates the trained model:

    -> mempo eval --data files --files qa_eval.jsonl --corpus corpus.jsonl   (BM25 over the corpus)

which must write finite numbers for every k, its trajectories and a rendered report.
"""
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.dist import free_port
from support.gold_trace import read_records, summary, violations
from support.paths import SUPPORT, python_path_env

CONFIG = """\
data:
  source: files
  num_objectives: 1
  questions_per_step: 2
  seed: 0
env:
  topk: 1
  doc_chars: 200
rollout:
  group_size: 2
  max_turns: 2
  max_new_tokens_per_round: 24
  max_response_tokens: 256
  context_policy: memory
  chat_template: auto
actor:
  lr: 1.0e-3
  micro_batch_tokens: 4096
algorithm:
  skip_zero_variance_groups: false   # a random model earns reward 0: update anyway, so the export differs
trainer:
  total_steps: 2
  save_every: 0
  tensorboard: false
  progress: false
  resume: never
eval:
  objectives: [1, 2]
  episodes: 2
  max_turns: 3
  policies: [memory]
"""


def _user_files(root: Path) -> dict[str, Path]:
    """What a user brings: a corpus, QA files, oracle trajectories for SFT, a config and an HF model."""
    from mempo.model.builtin import default_corpus_texts, tiny_model, train_tokenizer
    from mempo.synthetic.oracle import run_oracle, write_trajectories_jsonl
    from mempo.env.bm25 import BM25Retriever
    from mempo.env.tools import make_tools
    from mempo.synthetic.world import World

    world = World.generate(seed=0, num_entities=25)
    files = {name: root / name for name in ("corpus.jsonl", "qa_train.jsonl", "qa_eval.jsonl", "oracle.jsonl",
                                            "config.yaml", "base_model")}
    files["corpus.jsonl"].write_text("".join(json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n"
                                             for d in world.documents()))
    for name, seed in (("qa_train.jsonl", 1), ("qa_eval.jsonl", 2)):
        episodes = world.episodes(1, 6, seed=seed)
        files[name].write_text("".join(json.dumps({"id": e.id, "question": e.questions[0],
                                                   "golden_answers": list(e.golds[0])}) + "\n" for e in episodes))
    with BM25Retriever.build(list(world.documents())) as retriever:
        tools = make_tools(retriever, options={"search": {"topk": 1, "doc_chars": 200}})
        oracle = [run_oracle(e, tools, policy="memory") for e in world.episodes(1, 4, seed=3)]
    write_trajectories_jsonl(files["oracle.jsonl"], oracle)
    files["config.yaml"].write_text(CONFIG)
    texts = default_corpus_texts(world) + [t.prompt for t in oracle] + [t.response_text for t in oracle]
    tokenizer = train_tokenizer(texts, vocab_size=600)
    assert tokenizer.chat_template  # ChatML, the tokenizer's own
    model = tiny_model(tokenizer, "tiny", seed=0)
    model.save_pretrained(files["base_model"])
    tokenizer.save_pretrained(files["base_model"])
    return files


def _cli(args: list[str], cwd: Path, trace: str, *, nproc: int = 1, timeout: int = 150) -> str:
    """Run one `mempo` command (under torchrun when nproc > 1) with the gold trace installed."""
    env = python_path_env(dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
                               MASTER_ADDR="127.0.0.1", MEMPO_TEST_GOLD_TRACE=trace), SUPPORT / "gold_trace_site")
    launcher = [sys.executable, "-m", "mempo.apps.cli"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "mempo.apps.cli"]
    proc = subprocess.Popen(launcher + args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"mempo {args[0]} timed out")
    assert proc.returncode == 0, output[-4000:]
    return output


def _parameters(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


def test_hf_model_through_sft_and_two_process_training(tmp_path):
    from transformers import AutoTokenizer

    from mempo.eval import EvalReport
    from mempo.train.logging import read_metrics

    _user_files(tmp_path)
    trace = str(tmp_path / "trace" / "gold")
    Path(trace).parent.mkdir()
    data = ["data.train_files=[qa_train.jsonl]", "data.eval_files=[qa_eval.jsonl]", "env.corpus_path=corpus.jsonl"]

    out = _cli(["sft", "--config", "config.yaml", "--out", "sft", "--trajectories", "oracle.jsonl", "--steps", "4",
                "--threads", "1", "model.path=base_model", *data], tmp_path, trace)
    assert "sft: 4 steps" in out
    sft_model = tmp_path / "sft" / "model"
    assert {p.name for p in sft_model.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json",
                                                     "mempo_provenance.json"}
    assert not (sft_model / "mempo_builtin.json").exists()  # nothing switches behaviour on how it was made

    _cli(["train", "--config", "config.yaml", "--out", "rl", "--threads", "1", f"model.path={sft_model}", *data],
         tmp_path, trace, nproc=2)
    final = tmp_path / "rl" / "model"
    trained, started = _parameters(final), _parameters(sft_model)
    assert trained.keys() == started.keys()
    assert all(trained[k].shape == started[k].shape for k in trained)  # whole tensors, not rank 0's shards
    assert any(not torch.equal(trained[k], started[k]) for k in trained)
    assert AutoTokenizer.from_pretrained(final).get_vocab() == AutoTokenizer.from_pretrained(sft_model).get_vocab()
    rows = read_metrics(tmp_path / "rl" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for r in rows for v in r.values()), rows

    records = read_records(trace)
    counts = summary(records)
    assert counts["tasks"] >= 4 and counts["generate_calls"] >= 4, counts  # both ranks, both steps
    generating = [p for p in Path(trace).parent.iterdir() if '"kind": "generate"' in p.read_text()]
    assert len(generating) == 2  # one trace file per training rank
    assert violations(records, AutoTokenizer.from_pretrained(sft_model)) == []

    out = _cli(["eval", "--config", "config.yaml", "--model", str(final), "--out", "eval", "--no-progress",
                "--data", "files", "--files", "qa_eval.jsonl", "--corpus", "corpus.jsonl"], tmp_path, trace)
    rows = EvalReport.load(tmp_path / "eval" / "eval.json").rows
    assert sorted((r.dataset, r.objectives, r.policy) for r in rows) == [
        ("qa_eval", 1, "memory"), ("qa_eval", 2, "memory")], rows
    for row in rows:
        assert row.episodes == 2
        assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in (row.em, row.f1, row.format_rate)), row
        assert row.prompt_tokens_per_episode > 0 and math.isfinite(row.mean_turns), row
    episodes = [json.loads(line) for line in (tmp_path / "eval" / "eval_trajectories.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 * 2 and all(e["rounds"] for e in episodes)  # k = 1, 2 x 2 episodes
    assert "qa_eval" in (tmp_path / "eval" / "eval.md").read_text()
    records = read_records(trace)  # the evaluation's generation requests too
    assert summary(records)["generate_calls"] > counts["generate_calls"]
    assert violations(records, AutoTokenizer.from_pretrained(final)) == []
