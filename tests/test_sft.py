"""mempo.train.sft: per-turn sequences with the rollout's chat format, assistant-only loss, loss goes down."""
import json

import pytest
import torch

from mempo.builtin import default_corpus_texts, tiny_model, train_tokenizer
from mempo.rollout.chat import ChatFormat
from mempo.train.config import config_from_dict
from mempo.train.sft import examples_from_trajectories, load_sft_records, run_sft


@pytest.fixture(scope="module")
def setup():
    from mempo.env.oracle import run_oracle_episodes
    from mempo.env.retriever import BM25Retriever
    from mempo.env.world import World

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
    assert tok.decode([t for t, m in zip(*examples[1]) if m]) == "plain"


def test_loss_decreases(setup):
    tok, trajectories = setup
    torch.manual_seed(0)
    model = tiny_model(tok, seed=0)
    cfg = config_from_dict({})
    metrics = run_sft(cfg, model, tok, trajectories, steps=12, lr=3e-3, batch_tokens=8192, seed=0)
    assert metrics["steps"] == 12 and all(torch.isfinite(torch.tensor(metrics["losses"])))
    assert metrics["last_loss"] < 0.8 * metrics["first_loss"]


def test_selective_logits_equal_full_logits(setup):
    """Logits on the assistant positions only give the same losses as the full logits (fallback path)."""
    import copy

    tok, trajectories = setup
    model = tiny_model(tok, seed=0)
    wrapped = _FullLogits(copy.deepcopy(model))
    cfg = config_from_dict({})
    a = run_sft(cfg, model, tok, trajectories, steps=3, lr=1e-3, batch_tokens=8192, seed=0)
    b = run_sft(cfg, wrapped, tok, trajectories, steps=3, lr=1e-3, batch_tokens=8192, seed=0)
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
    cfg = config_from_dict({})
    metrics = run_sft(cfg, model, tok, trajectories, steps=10, lr=1e-3, batch_tokens=2048, seed=0,
                      schedule="cosine", warmup=0.2)
    assert metrics["steps"] == 10
    timed = run_sft(cfg, tiny_model(tok, seed=0), tok, trajectories, steps=10_000, lr=1e-3, batch_tokens=2048,
                    seed=0, max_seconds=0.5, schedule="cosine")
    assert 1 <= timed["steps"] < 10_000 and timed["seconds"] < 30
    with pytest.raises(ValueError):
        run_sft(cfg, tiny_model(tok, seed=0), tok, trajectories, steps=1, schedule="linear")
