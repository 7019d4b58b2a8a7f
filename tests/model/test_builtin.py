"""mempo.model.builtin: the trained tokenizer, tiny models, saving them as plain HF directories, and the
answer-blind protocol scaffold."""
import json

import pytest
import torch

from mempo.model.builtin import SIZES, default_corpus_texts, tiny_model, train_tokenizer
from mempo.model.loading import load_model_dir
from mempo.rollout.backends.scaffold import ProtocolScaffold, context_candidates
from mempo.rollout.backends import HFBackend
from mempo.rollout.chat import ChatFormat, render_builtin
from mempo.model.export import PROVENANCE_FILE, save_model_dir


@pytest.fixture(scope="module")
def world():
    from mempo.synthetic.world import World

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
    assert (train_tokenizer(default_corpus_texts(), 300).get_vocab()
            == train_tokenizer(default_corpus_texts(), 300).get_vocab())


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
    save_model_dir(tmp_path / "m", model, tok, provenance={"written_by": "test"})
    assert json.loads((tmp_path / "m" / PROVENANCE_FILE).read_text()) == {"written_by": "test"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging directory left
    loaded, tok2 = load_model_dir(tmp_path / "m")
    ids = torch.tensor([tok.encode("hello <mem> world", add_special_tokens=False)])
    assert torch.allclose(model(ids).logits, loaded(ids).logits)
    assert tok2.encode("<mem>x</mem>") == tok.encode("<mem>x</mem>")
    from mempo.model.loading import build_causal_lm
    from mempo.config import ModelConfig

    assert build_causal_lm(ModelConfig(path=str(tmp_path / "m"))).config.vocab_size == len(tok)


def test_a_saved_tokenizer_encodes_the_same_after_loading(tok, tmp_path):
    """AutoTokenizer loads a saved Qwen2 directory's tokenizer as transformers' Qwen2Tokenizer, which
    installs its own normaliser and pre-tokeniser: the trained tokenizer must already use those, or a
    model trained in memory reads other ids after `mempo train model.path=...` (digits, new lines)."""
    from transformers import AutoTokenizer

    save_model_dir(tmp_path / "m", tiny_model(tok, seed=1), tok)
    loaded = AutoTokenizer.from_pretrained(tmp_path / "m")
    texts = ["<mem>\nStep 2.\nQ1: Tamor was born in the year 1866.\n</mem>\n<think>\nQ2. Search.\n</think>",
             "<information>Doc 1 (ID: person-000805, Title: Fidor) Fidor studied at Nebuk.</information>",
             "  two  spaces,\ttab\r\nCRLF; café 12345 x's", "<|im_start|>user\nhi<|im_end|>\n"]
    for text in texts:
        assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False), text
        assert loaded.decode(tok.encode(text, add_special_tokens=False)) == tok.decode(
            tok.encode(text, add_special_tokens=False))


def test_context_candidates_come_from_information_blocks_only():
    text = ("<|im_start|>user\nWho founded Gold Corp? Answer Zed.<|im_end|>\n<|im_start|>assistant\n<mem> Fake Name "
            "</mem><|im_end|>\n<|im_start|>user\n<information>Doc 1 (ID: x-1, Title: Gold Corp) Gold Corp was founded "
            "by Ada Brel in 1801. the old Tower of Eastern Marsh Lands Far Away stands.</information>"
            "<information>Ada Brel; Ulm</information>")
    # "Eastern Marsh Lands Far Away" has 5 words (> max_words); "Zed" and "Fake Name" are outside
    assert context_candidates(text) == ["Doc 1", "ID", "Title", "Gold Corp", "Ada Brel", "1801", "Tower", "Ulm"]
    assert context_candidates(text, max_words=1) == ["ID", "Title", "1801", "Tower", "Ulm"]
    assert context_candidates(text, limit=2) == ["Doc 1", "ID"]
    assert context_candidates("<information>none here</information> Zed") == []
    assert "1801" in context_candidates("<information>in 1801.</information>")


def test_scaffold_makes_well_formed_trajectories_from_context_strings(world, tok):
    """Tags forced, the answer a choice among the candidates of the answer round's own prompt; the
    scaffold is built without any episode and never holds a gold answer it was not shown."""
    from mempo.env.bm25 import BM25Retriever
    from mempo.env.tools import make_tools
    from mempo.config import RolloutConfig
    from mempo.algo.outcome import score_outcomes
    from mempo.rollout.loop import RolloutEngine

    torch.set_num_threads(1)
    episodes = world.episodes(2, 2, seed=0)
    scaffold = ProtocolScaffold(tok, turns=3)
    backend = HFBackend(tiny_model(tok, seed=0), tok, logits_processors=[scaffold])
    with BM25Retriever.build(list(world.documents())) as retriever:
        tools = make_tools(retriever, options={"search": {"topk": 1, "doc_chars": 200}})
        for policy in ("full", "memory"):
            engine = RolloutEngine(backend, tok, tools, config=RolloutConfig(
                context_policy=policy, group_size=3, max_turns=3, max_new_tokens_per_round=96, seed=0))
            trajectories = score_outcomes(engine.run(episodes))
            assert len(trajectories) == 6
            for t in trajectories:
                assert t.finish_reason == "answer" and len(t.rounds) == 3 and t.outcome["format_ok"]
                assert len(t.scored_rounds()) == 2
                last = t.rounds[-1]
                context = t.prompt_ids + t.response_ids[:last.start] if last.prompt_ids is None else last.prompt_ids
                options = context_candidates(tok.decode(context))
                parts = [p.strip() for p in t.final_answer.split(";")]
                assert options and 1 <= len(parts) <= 4 and all(p in options for p in parts), (t.final_answer, options)


def test_scaffold_answer_grammar():
    """The answer automaton: candidates (one a token prefix of another), "; " between parts up to
    max_parts, then the closing tag; None once closed."""
    segment = ("answer", [[5, 6], [5, 6, 7], [9]], [3], [1, 2], 2)
    allowed = ProtocolScaffold._answer_allowed
    assert allowed(segment, []) == [5, 9]
    assert allowed(segment, [5]) == [6]
    assert allowed(segment, [5, 6]) == [1, 3, 7]  # done (close or separator) or go on to [5, 6, 7]
    assert allowed(segment, [5, 6, 3]) == [5, 9]
    assert allowed(segment, [5, 6, 3, 9]) == [1]  # max_parts reached: only the closing tag
    assert allowed(segment, [9, 1]) == [2]
    assert allowed(segment, [9, 1, 2]) is None


def test_tied_embeddings_and_shape_overrides(tok, tmp_path):
    model = tiny_model(tok, "tiny", seed=2, tie_word_embeddings=True, num_hidden_layers=1)
    assert model.config.num_hidden_layers == 1 and model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    untied = tiny_model(tok, "tiny", seed=2)
    assert sum(p.numel() for p in untied.parameters()) > sum(p.numel() for p in model.parameters())
    save_model_dir(tmp_path / "t", model, tok)
    loaded, _ = load_model_dir(tmp_path / "t")
    ids = torch.tensor([tok.encode("hello <mem> world", add_special_tokens=False)])
    assert torch.allclose(model(ids).logits, loaded(ids).logits)
