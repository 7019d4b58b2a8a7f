"""run_sft's prompt_loss_weight: language modelling of the prompt tokens on top of the assistant loss."""
import copy

import pytest
import torch

from mempo.builtin import default_corpus_texts, tiny_model, train_tokenizer
from mempo.train.config import config_from_dict
from mempo.train.sft import examples_from_trajectories, run_sft


@pytest.fixture(scope="module")
def setup():
    from mempo.env.oracle import run_oracle_episodes
    from mempo.env.retriever import BM25Retriever
    from mempo.env.world import World

    world = World.generate(seed=0, num_entities=25)
    tok = train_tokenizer(default_corpus_texts(world), vocab_size=768)
    with BM25Retriever.build(list(world.documents())) as retriever:
        trajectories = run_oracle_episodes(world.episodes(2, 2, seed=1), retriever, policy="memory", max_turns=8)
    return tok, trajectories


class _FullLogits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.wrapped = model

    def forward(self, **kwargs):
        return self.wrapped(**kwargs)


def test_prompt_loss_weight(setup):
    tok, trajectories = setup
    cfg = config_from_dict({})
    base = tiny_model(tok, seed=0)
    plain = run_sft(cfg, copy.deepcopy(base), tok, trajectories, steps=2, lr=1e-3, batch_tokens=8192, seed=0)
    zero = run_sft(cfg, copy.deepcopy(base), tok, trajectories, steps=2, lr=1e-3, batch_tokens=8192, seed=0,
                   prompt_loss_weight=0.0)
    assert plain["losses"] == zero["losses"]  # the default: assistant tokens only
    weighted = run_sft(cfg, copy.deepcopy(base), tok, trajectories, steps=2, lr=1e-3, batch_tokens=8192, seed=0,
                       prompt_loss_weight=0.5)
    assert weighted["first_loss"] > plain["first_loss"]  # a random model: the prompt term adds ~0.5 * log(V)
    full = run_sft(cfg, _FullLogits(copy.deepcopy(base)), tok, trajectories, steps=2, lr=1e-3, batch_tokens=8192,
                   seed=0, prompt_loss_weight=0.5)
    assert weighted["losses"] == pytest.approx(full["losses"], rel=1e-4)  # selective logits == full logits
