"""mempo.builtin: the trained tokenizer, tiny models, save/load, and the protocol scaffold."""
import pytest
import torch

from mempo.builtin import (
    SIZES, ProtocolScaffold, ScaffoldedHFBackend, answer_text, default_corpus_texts, is_builtin_dir, load_builtin,
    save_builtin, tiny_model, train_tokenizer,
)
from mempo.rollout.chat import ChatFormat, render_builtin


@pytest.fixture(scope="module")
def world():
    from mempo.env.world import World

    return World.generate(seed=0, num_entities=25)


@pytest.fixture(scope="module")
def tok(world):
    return train_tokenizer(default_corpus_texts(world), vocab_size=768)


def test_tokenizer_specials_and_chat(tok):
    assert len(tok) == 768
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert tok.convert_tokens_to_ids(special) in tok.all_special_ids
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for tag in ("<mem>", "</mem>", "<think>", "<search>", "<answer>"):  # protocol tags are plain text
        ids = tok.encode(tag, add_special_tokens=False)
        assert not set(ids) & set(tok.all_special_ids)
        assert tok.decode(ids) == tag
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q?"}]
    assert ChatFormat(tok).render(messages) == render_builtin(messages)
    text = "<mem> Q1: founder of X = Tamsk </mem>"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert train_tokenizer(default_corpus_texts(), 300).get_vocab() == train_tokenizer(default_corpus_texts(), 300).get_vocab()


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_tiny_model_sizes_and_seed(tok, size):
    model = tiny_model(tok, size, seed=3)
    assert model.config.hidden_size == SIZES[size]["hidden_size"]
    assert model.config.num_hidden_layers == SIZES[size]["num_hidden_layers"]
    assert model.config.vocab_size == len(tok)
    again = tiny_model(tok, size, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_save_and_load(tok, tmp_path):
    model = tiny_model(tok, seed=1)
    save_builtin(tmp_path / "m", model, tok)
    assert is_builtin_dir(tmp_path / "m") and not is_builtin_dir(tmp_path)
    loaded, tok2 = load_builtin(tmp_path / "m")
    ids = torch.tensor([tok.encode("hello <mem> world", add_special_tokens=False)])
    assert torch.allclose(model(ids).logits, loaded(ids).logits)
    assert tok2.encode("<mem>x</mem>") == tok.encode("<mem>x</mem>")
    from mempo.train.actor import build_causal_lm
    from mempo.train.config import ModelConfig

    assert build_causal_lm(ModelConfig(path=str(tmp_path / "m"))).config.vocab_size == len(tok)


def test_scaffold_makes_well_formed_trajectories(world, tok):
    from mempo.env.retriever import BM25Retriever
    from mempo.env.tools import make_tools
    from mempo.rollout import RolloutConfig, RolloutEngine

    episodes = world.episodes(2, 2, seed=0)
    scaffold = ProtocolScaffold(tok, turns=3)
    scaffold.set_answers({e.id: answer_text(e.golds) for e in episodes})
    backend = ScaffoldedHFBackend(tiny_model(tok, seed=0), tok, scaffold)
    with BM25Retriever.build(list(world.documents())) as retriever:
        tools = make_tools(retriever, options={"search": {"topk": 1, "doc_chars": 200}})
        for policy in ("full", "memory"):
            engine = RolloutEngine(backend, tok, tools, config=RolloutConfig(
                policy=policy, group_size=3, max_turns=3, max_new_tokens=96, seed=0))
            trajectories = engine.run(episodes)
            assert len(trajectories) == 6
            for t in trajectories:
                assert t.finish_reason == "answer" and len(t.rounds) == 3 and t.outcome["format_ok"]
                assert len(t.scored_rounds()) == 2
                assert t.final_answer in (answer_text(t.golds), "unknown")


def test_tied_embeddings_and_shape_overrides(tok, tmp_path):
    model = tiny_model(tok, "tiny", seed=2, tie_word_embeddings=True, num_hidden_layers=1)
    assert model.config.num_hidden_layers == 1 and model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    untied = tiny_model(tok, "tiny", seed=2)
    assert sum(p.numel() for p in untied.parameters()) > sum(p.numel() for p in model.parameters())
    save_builtin(tmp_path / "t", model, tok)
    loaded, _ = load_builtin(tmp_path / "t")
    ids = torch.tensor([tok.encode("hello <mem> world", add_special_tokens=False)])
    assert torch.allclose(model(ids).logits, loaded(ids).logits)
