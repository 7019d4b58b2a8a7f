"""mempo.train.sft: per-turn sequences with the rollout's chat format, assistant-only loss, loss goes down."""
import copy
import json

import pytest
import torch

from mempo.model.builtin import default_corpus_texts, tiny_model, train_tokenizer
from mempo.rollout.chat import ChatFormat
from mempo.config import config_from_dict
from mempo.env.data import DataError
from mempo.train.sft import examples_from_trajectories, load_sft_records, run_sft
from support.paths import REPO


def _sft(model, tok, trajectories, *, seed=0, save_every=0, keep_last=None, checkpoint_root=None, resume_from=None,
         max_steps=None, actor=None, **sft):
    """`run_sft` with the ``sft`` section's fields `sft`, the trainer's checkpoint settings and the
    ``actor`` section's fields `actor`."""
    cfg = config_from_dict({"sft": sft, "trainer": {"save_every": save_every, "keep_last": keep_last},
                            "actor": actor or {}})
    return run_sft(cfg, model, tok, trajectories, seed=seed, checkpoint_root=checkpoint_root,
                   resume_from=resume_from, max_steps=max_steps)


@pytest.fixture(scope="module")
def setup():
    from mempo.synthetic.oracle import run_oracle_episodes
    from mempo.env.bm25 import BM25Retriever
    from mempo.synthetic.world import World

    world = World.generate(seed=0, num_entities=25)
    tok = train_tokenizer(default_corpus_texts(world), vocab_size=768)
    with BM25Retriever.build(list(world.documents())) as retriever:
        trajectories = run_oracle_episodes(world.episodes(2, 3, seed=1), retriever, policy="memory", max_turns=8)
    return tok, trajectories


def test_mask_covers_exactly_the_assistant_tokens(setup):
    tok, trajectories = setup
    examples = examples_from_trajectories(trajectories, tok)
    rounds = [r for t in trajectories for r in t.rounds]
    assert len(examples) == len(rounds) > 0
    chat = ChatFormat(tok)
    for example, round_ in zip(examples, rounds):
        prompt = chat.prompt_ids(round_.messages)
        assert example.input_ids[:len(prompt)] == prompt
        assert example.loss_mask == [0] * len(prompt) + [1] * (len(example.input_ids) - len(prompt))
        assert tok.decode(example.input_ids[len(prompt):]) == round_.assistant.lstrip()
        assert example.input_ids[len(prompt):len(prompt) + len(chat.prefix_ids)] == chat.prefix_ids


def test_chat_records_and_jsonl(setup, tmp_path):
    tok, trajectories = setup
    path = tmp_path / "chats.jsonl"
    chat = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                         {"role": "assistant", "content": "<mem></mem><answer>a</answer>"},
                         {"role": "user", "content": "again"}, {"role": "assistant", "content": "plain"}]}
    path.write_text(json.dumps(chat) + "\n" + json.dumps(trajectories[0].to_json()) + "\n")
    records = load_sft_records(path)
    examples = examples_from_trajectories(records, tok)
    assert len(examples) == 2 + len(trajectories[0].rounds)
    assert tok.decode([t for t, m in zip(examples[1].input_ids, examples[1].loss_mask) if m]) == "plain"


def test_loss_decreases(setup):
    tok, trajectories = setup
    torch.manual_seed(0)
    model = tiny_model(tok, seed=0)
    metrics = _sft(model, tok, trajectories, steps=12, lr=3e-3, batch_tokens=8192, seed=0)
    assert metrics["steps"] == 12 and all(torch.isfinite(torch.tensor(metrics["losses"])))
    assert metrics["last_loss"] < 0.8 * metrics["first_loss"]


def test_selective_logits_equal_full_logits(setup):
    """Logits on the assistant positions only give the same losses as the full logits (fallback path)."""
    import copy

    tok, trajectories = setup
    model = tiny_model(tok, seed=0)
    wrapped = _FullLogits(copy.deepcopy(model))
    a = _sft(model, tok, trajectories, steps=3, lr=1e-3, batch_tokens=8192, seed=0)
    b = _sft(wrapped, tok, trajectories, steps=3, lr=1e-3, batch_tokens=8192, seed=0)
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-4)


class _FullLogits(torch.nn.Module):
    """A wrapper with no ``.model`` / output head: run_sft computes every logit."""

    def __init__(self, model):
        super().__init__()
        self.wrapped = model

    def forward(self, **kwargs):
        return self.wrapped(**kwargs)


def test_cosine_schedule_and_time_bound(setup):
    tok, trajectories = setup
    model = tiny_model(tok, seed=0)
    metrics = _sft(model, tok, trajectories, steps=10, lr=1e-3, batch_tokens=2048, seed=0,
                      schedule="cosine", warmup=0.2)
    assert metrics["steps"] == 10 and metrics["time_bound"] is False
    timed = _sft(tiny_model(tok, seed=0), tok, trajectories, steps=10_000, lr=1e-3, batch_tokens=2048,
                    seed=0, max_seconds=0.5, schedule="cosine")
    assert 1 <= timed["steps"] < 10_000 and timed["seconds"] < 30 and timed["time_bound"] is True
    with pytest.raises(ValueError):
        _sft(tiny_model(tok, seed=0), tok, trajectories, steps=1, schedule="linear")


def test_interrupted_run_resumes_to_the_uninterrupted_result(setup, tmp_path):
    """A 7-step cosine-schedule run interrupted after step 4 (checkpoints every 2 steps), then resumed
    into a model with other weights by a fresh call, ends with the losses and parameters of an
    uninterrupted 7-step run. One trajectory makes 3 batches per epoch: the resumed part starts
    mid-epoch and crosses an epoch boundary."""
    from mempo.train.checkpoint import latest_checkpoint, list_checkpoints
    from mempo.train.sft import _epoch_batches

    tok, trajectories = setup
    trajectories = trajectories[:1]
    common = dict(steps=7, lr=3e-3, batch_tokens=2048, seed=3, schedule="cosine", warmup=0.2)
    assert len(_epoch_batches(examples_from_trajectories(trajectories, tok), 2048, 3, 0)) == 3
    full_model = tiny_model(tok, seed=0)
    full = _sft(full_model, tok, trajectories, **common)

    root = tmp_path / "checkpoints"
    first = _sft(tiny_model(tok, seed=0), tok, trajectories, checkpoint_root=root, save_every=2,
                    max_steps=4, **common)
    assert first["steps"] == 4 and [step for step, _ in list_checkpoints(root)] == [2, 4]
    assert first["checkpoint"] == latest_checkpoint(root)
    resumed_model = tiny_model(tok, seed=1)  # other weights: everything must come from the checkpoint
    second = _sft(resumed_model, tok, trajectories, checkpoint_root=root, save_every=2, resume_from=root,
                     **common)
    assert second["resumed_from"] == 4 and second["steps"] == 7 and len(second["losses"]) == 3
    assert first["losses"] + second["losses"] == pytest.approx(full["losses"], abs=1e-6)
    assert second["tokens"] == full["tokens"] and second["epochs"] == full["epochs"] == 3
    for (name, a), (_, b) in zip(full_model.named_parameters(), resumed_model.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    assert [step for step, _ in list_checkpoints(root)] == [2, 4, 6, 7]  # every 2 steps and at the end


def test_resume_refuses_a_checkpoint_of_other_data(setup, tmp_path):
    tok, trajectories = setup
    _sft(tiny_model(tok, seed=0), tok, trajectories, steps=1, batch_tokens=2048, seed=0,
            checkpoint_root=tmp_path)
    with pytest.raises(ValueError, match="seed 0 and .* seed 1"):
        _sft(tiny_model(tok, seed=0), tok, trajectories, steps=2, batch_tokens=2048, seed=1,
                resume_from=tmp_path)
    with pytest.raises(ValueError, match="training sequences"):
        _sft(tiny_model(tok, seed=0), tok, trajectories[:1], steps=2, batch_tokens=2048, seed=0,
                resume_from=tmp_path)


def test_cli_sft_resume(tmp_path):
    """`mempo sft` checkpoints under <out>/sft/checkpoints; `--resume` continues the run to --steps and
    its metrics file keeps one line per step."""
    import os
    import subprocess
    import sys
    from mempo.train.checkpoint import latest_checkpoint
    from mempo.train.logging import read_metrics

    config = REPO / "configs" / "tiny.yaml"
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

    def sft(*extra, code=0):
        cmd = [sys.executable, "-m", "mempo.apps.cli", "sft", "--config", str(config), "--out", str(out),
               "--threads", "1", "--episodes", "2", "--batch-tokens", "2048", "trainer.save_every=1",
               "trainer.tensorboard=false", "trainer.resume=never", *extra]
        done = subprocess.run(cmd, env=env, cwd=tmp_path, timeout=240, capture_output=True, text=True)
        assert done.returncode == code, done.stderr[-2000:]
        return done.stderr

    assert "(resumed from None)" in sft("--steps", "2")
    refused = sft("--steps", "3", code=2).strip().splitlines()  # a used run directory without --resume
    assert len(refused) == 1 and refused[0].startswith("mempo sft: trainer.resume:") and "--resume" in refused[0]
    resumed = sft("--steps", "3", "--resume")  # --resume wins over the trainer.resume=never above
    assert "sft: 3 steps" in resumed and "(resumed from 2)" in resumed
    assert latest_checkpoint(out / "sft" / "checkpoints").name == "step_00000003"
    assert [r["step"] for r in read_metrics(out / "sft" / "metrics.jsonl")] == [1, 2, 3]
    assert (out / "model" / "config.json").is_file()


def test_prompt_loss_weight(setup):
    """run_sft's prompt_loss_weight: language modelling of the prompt tokens on top of the assistant loss."""
    tok, trajectories = setup
    base = tiny_model(tok, seed=0)
    plain = _sft(copy.deepcopy(base), tok, trajectories, steps=2, lr=1e-3, batch_tokens=8192, seed=0)
    zero = _sft(copy.deepcopy(base), tok, trajectories, steps=2, lr=1e-3, batch_tokens=8192, seed=0,
                   prompt_loss_weight=0.0)
    assert plain["losses"] == zero["losses"]  # the default: assistant tokens only
    weighted = _sft(copy.deepcopy(base), tok, trajectories, steps=2, lr=1e-3, batch_tokens=8192, seed=0,
                       prompt_loss_weight=0.5)
    assert weighted["first_loss"] > plain["first_loss"]  # a random model: the prompt term adds ~0.5 * log(V)
    full = _sft(_FullLogits(copy.deepcopy(base)), tok, trajectories, steps=2, lr=1e-3, batch_tokens=8192,
                   seed=0, prompt_loss_weight=0.5)
    assert weighted["losses"] == pytest.approx(full["losses"], rel=1e-4)  # selective logits == full logits


def test_an_assistant_context_is_read_not_trained(setup, tmp_path):
    """A chat record's assistant ``context`` (the scoring layout's <mem>): encoded alone after the forced
    prefix, then the content alone (as teacher scoring builds mem_ctx + answer), and in neither loss."""
    tok, _ = setup
    from mempo.algo.contexts import build_answer
    messages = [{"role": "system", "content": ""}, {"role": "user", "content": "1. Where was Ada born?"}]
    mem, answer = ("<mem>\nStep 2.\nQ1: Ada was born in Rome.\n</mem>",
                   "\n<think>\nok\n</think>\n<answer>\nRome\n</answer>")
    record = {"messages": messages + [{"role": "assistant", "context": mem, "content": answer}]}
    (example,) = examples_from_trajectories([record], tok)
    chat = ChatFormat(tok)
    prompt = chat.prompt_ids(messages)
    read = list(chat.prefix_ids) + chat.encode(mem[len("<mem>"):])
    own = chat.encode(answer)
    assert example.input_ids == prompt + read + own
    assert example.loss_mask == [0] * (len(prompt) + len(read)) + [1] * len(own)
    assert example.lm_mask == [1] * len(prompt) + [0] * (len(read) + len(own))
    template = "\n<think>\nok\n</think>\n<answer>\n{answer}\n</answer>"
    assert own == list(build_answer(tok, "Rome", template)[0])  # the ids teacher scoring puts after the <mem>
    # one step's loss: the assistant term over the content, the prompt term over the prompt alone
    base = tiny_model(tok, seed=0)
    with_context = _sft(copy.deepcopy(base), tok, [record], steps=1, lr=1e-3, seed=0, prompt_loss_weight=1.0)
    by_hand = copy.deepcopy(base)
    ids = torch.tensor([example.input_ids])
    with torch.no_grad():
        logits = by_hand(ids).logits[0, :-1]
    targets = ids[0, 1:]
    loss_mask = torch.tensor(example.loss_mask[1:], dtype=torch.bool)
    lm_mask = torch.tensor(example.lm_mask[1:], dtype=torch.bool) & ~loss_mask
    expected = (torch.nn.functional.cross_entropy(logits[loss_mask], targets[loss_mask])
                + torch.nn.functional.cross_entropy(logits[lm_mask], targets[lm_mask]))
    assert with_context["first_loss"] == pytest.approx(float(expected), rel=1e-5)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": messages + [{"role": "assistant", "context": 3, "content": answer}]}) + "\n")
    with pytest.raises(DataError, match="context"):
        load_sft_records(bad)


@pytest.mark.parametrize("content, message", [
    ('{"messages": []}\n\n{"messages": [\n', r"bad.jsonl:3: not valid JSON"),  # the file's line, not JSON's
    ("", r"bad.jsonl: no records"),
    ('{"messages": [{"role": "user", "content": "q"}]}\n', r"bad.jsonl: no assistant turns"),
    ('{"messages": []}\n{"messages": "hello"}\n', r"bad.jsonl:2: messages: expected a list"),
    ('[1, 2]\n', r"bad.jsonl:1: expected an oracle trajectory"),
])
def test_bad_sft_files_name_the_file_and_line(tmp_path, content, message):
    from mempo.errors import MempoError

    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(MempoError, match=message):
        load_sft_records(path)


def test_sft_flags_set_the_sft_section(tmp_path):
    """`mempo sft` flags are shorthands for ``sft`` fields, applied after the config and the overrides."""
    from mempo.apps.cli import build_parser
    from mempo.apps.train_commands import SFT_FLAGS, _run_config
    from mempo.config import ConfigError

    tiny = str(REPO / "configs" / "tiny.yaml")
    parse = build_parser().parse_args
    cfg = _run_config(parse(["sft", "--config", tiny, "--out", str(tmp_path), "--steps", "3", "--lr", "0.01",
                             "--trajectories", "t.jsonl", "sft.lr=0.5", "sft.schedule=cosine"]), SFT_FLAGS)
    assert (cfg.sft.steps, cfg.sft.lr, cfg.sft.schedule, cfg.sft.trajectories) == (3, 0.01, "cosine", "t.jsonl")
    # the section's defaults
    assert (cfg.synthetic.oracle_episodes, cfg.sft.batch_tokens, cfg.sft.epochs) == (16, 4096, None)
    assert cfg.trainer.out_dir == str(tmp_path)
    assert _run_config(parse(["sft", "--config", tiny, "synthetic.oracle_episodes=5"]),
                       SFT_FLAGS).synthetic.oracle_episodes == 5
    with pytest.raises(ConfigError, match=r"^sft\.steps: must be > 0"):
        _run_config(parse(["sft", "--config", tiny, "--steps", "0"]), SFT_FLAGS)
    with pytest.raises(ConfigError, match=r"^sft\.schedule: must be one of"):
        _run_config(parse(["sft", "--config", tiny, "sft.schedule=linear"]), SFT_FLAGS)


def test_sft_oracle_data_by_training_episodes_or_by_objectives(tmp_path):
    """`mempo sft` without a trajectories file: the first ``synthetic.oracle_episodes`` training episodes (every
    trajectory kept), or with ``synthetic.oracle_objectives`` the demo's cold start (`oracle_cold_start`: per k,
    no question about an entity the evaluation asks about, correct trajectories only)."""
    from mempo.apps.train_commands import _oracle_records
    from mempo.config import ConfigError, load_config
    from mempo.env.data import parse_episode_prompt
    from mempo.eval import eval_episodes
    from mempo.train.trainer import build_run

    tiny = REPO / "configs" / "tiny.yaml"
    base = ["trainer.tensorboard=false", "trainer.progress=false", f"trainer.out_dir={tmp_path}"]
    cfg = load_config(tiny, base + ["synthetic.oracle_episodes=3"])
    run = build_run(cfg)
    records, source = _oracle_records(cfg, run)
    assert [r.episode_id for r in records] == [e.id for e in run.episodes[:3]] and source == "oracle on 3 episodes"
    assert all(r.policy == cfg.rollout.context_policy for r in records)
    # the tools are the env section's (`mempo.env.build.build_tools`), as in train and eval
    records, _ = _oracle_records(load_config(tiny, base + ["synthetic.oracle_episodes=3", "env.topk=2"]), run)
    searches = [rnd for r in records for rnd in r.rounds if rnd.tool_kind == "search_results" and rnd.tool_ok]
    assert searches and all(rnd.tool_metadata["topk"] == 2 for rnd in searches)

    by_k = load_config(tiny, base + ["synthetic.oracle_episodes=4", "synthetic.oracle_objectives=[1,2]",
                                     "synthetic.oracle_think=short",
                                     "eval.objectives=[1,2]", "eval.episodes=2"])  # what is held out
    records, source = _oracle_records(by_k, run)
    evaluated = eval_episodes(run.world, by_k)
    held_out = {step["subject"] for eps in evaluated.values() for e in eps for r in e.metadata["records"]
                for step in r["chain"]}
    named = {q for eps in evaluated.values() for e in eps for q in e.questions}
    assert records and all(r.score["score"] == 1.0 and r.policy == "memory" for r in records)
    assert {len(r.golds) for r in records} <= {1, 2} and len(records) <= 8
    asked = {q for r in records for q in parse_episode_prompt(r.prompt)}
    assert asked and not asked & named and not [s for s in held_out for q in asked if s in q]
    assert source == "oracle on 4 episodes of each of [1, 2] objectives"

    run.world = None  # QA-file data: no world to draw from
    with pytest.raises(ConfigError, match=r"^synthetic\.oracle_objectives: draws synthetic-world episodes"):
        _oracle_records(by_k, run)


def test_a_time_bound_that_does_not_bind_leaves_the_steps_schedule(setup):
    """Bounded by steps, the learning rates (so the model) do not depend on the wall time the
    safety-net bound allows: a far bound gives exactly the unbounded run's parameters."""
    tok, trajectories = setup
    runs = []
    for max_seconds in (None, 3600):
        model = tiny_model(tok, seed=0)
        metrics = _sft(model, tok, trajectories, steps=6, lr=1e-3, batch_tokens=2048, seed=0, schedule="cosine",
                       warmup=0.2, max_seconds=max_seconds)
        assert metrics["steps"] == 6 and metrics["time_bound"] is False
        runs.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_a_resume_reads_no_planted_index_and_steps_with_the_configured_optimizer(setup, tmp_path):
    """Issue 47: an SFT resume from a checkpoint whose model index is a pickle that runs code (the
    manifest rewritten to match) refuses it, naming the file and the class, and no code runs; a
    resume under other actor betas / weight decay steps with those (the saved param_groups no longer
    win), as the optimizer saved after it shows."""
    import shutil

    from mempo.train.checkpoint import CheckpointError, load_checkpoint
    from support.checkpoints import index_with_payload, plant

    tok, trajectories = setup
    common = dict(batch_tokens=2048, seed=0, lr=1e-3)
    root = tmp_path / "checkpoints"
    _sft(tiny_model(tok, seed=0), tok, trajectories[:1], steps=1, checkpoint_root=root, save_every=1, **common)
    planted = tmp_path / "planted"
    shutil.copytree(root, planted)
    step = planted / "step_00000001"
    marker = tmp_path / "PWNED"
    plant(step, "model/.metadata", index_with_payload(step / "model" / ".metadata", marker))
    with pytest.raises(CheckpointError, match=r"model/\.metadata: refused: it names pathlib\.Path\.touch"):
        _sft(tiny_model(tok, seed=0), tok, trajectories[:1], steps=2, resume_from=planted, **common)
    assert not marker.exists()
    model = tiny_model(tok, seed=0)
    result = _sft(model, tok, trajectories[:1], steps=2, checkpoint_root=root, save_every=1, resume_from=root,
                  actor={"beta2": 0.95, "weight_decay": 0.3}, **common)
    assert result["resumed_from"] == 1 and result["steps"] == 2
    optimizer = torch.optim.AdamW(model.parameters())
    load_checkpoint(result["checkpoint"], model, optimizer, restore_rng=False)  # as saved after step 2
    assert {(tuple(g["betas"]), g["weight_decay"]) for g in optimizer.param_groups} == {((0.9, 0.95), 0.3)}
