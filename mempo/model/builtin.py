"""Built-in tiny tokenizer and models (no download): `train_tokenizer`, `default_corpus_texts`
(texts to train it on) and `tiny_model` (a random `Qwen2ForCausalLM`, float32, of one of `SIZES`).
Save one with `mempo.model.export.save_model_dir`: a plain HF directory, usable as ``model.path``;
nothing marks it as built-in. The answer-blind protocol scaffold for such models lives with the
generation backends (`mempo.rollout.backends.scaffold`).
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

__all__ = ["SIZES", "SPECIAL_TOKENS", "CHATML_TEMPLATE", "train_tokenizer", "default_corpus_texts", "tiny_model"]

#: Qwen2's pre-tokenisation regex (transformers `models/qwen2/tokenization_qwen2.py`, PRETOKENIZE_REGEX).
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                           r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    # "mini" is the CPU demo's size
    "mini": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "small": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4),
}
_PROTOCOL_TEXTS = (
    "<mem> Step 1. Q1: not started </mem>\n<think>\nI should search.\n</think>\n<search> query </search>",
    "<mem> Q1: founder of X = ? (tried 1) </mem>\n<think>\nlook again\n</think>\n<access> doc-0001 2 </access>",
    "<mem> Q1: birthplace of Y = Tamsk </mem>\n<think>\nI have the answer.\n</think>\n<answer>\nTamsk\n</answer>",
    "<information>Doc 1(Title: A) text</information>", "unknown", "; ",
)


# ------------------------------------------------------------------------------------------------
# tokenizer
# ------------------------------------------------------------------------------------------------
def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024, *, min_frequency: int = 2):
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `texts`; deterministic (the same texts
    and vocab size give the same tokenizer).

    Special tokens: ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (EOS), and a ChatML
    chat template identical to the built-in rendering of `mempo.rollout.chat`. The protocol tags
    (``<mem>``, ``<think>``, ...) are NOT special tokens: they are ordinary text.

    vocab_size: the target size including the 256 byte tokens and the special tokens.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be > {256 + len(SPECIAL_TOKENS)}, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    # Normaliser, pre-tokeniser and decoder as transformers' Qwen2Tokenizer installs them on a
    # tokenizer.json it loads (``AutoTokenizer`` loads a saved one as a Qwen2 tokenizer and replaces
    # these parts), so the tokenizer encodes the same after the round trip.
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(list(texts) + list(_PROTOCOL_TEXTS), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=IM_END, pad_token=PAD_TOKEN,
                                      additional_special_tokens=[IM_START])
    wrapped.chat_template = CHATML_TEMPLATE
    return wrapped


def default_corpus_texts(world: Any = None, limit: int = 2000) -> list[str]:
    """Texts to train the built-in tokenizer on: the world's documents (up to `limit`) + protocol text."""
    texts = list(_PROTOCOL_TEXTS)
    if world is not None:
        for i, doc in enumerate(world.documents()):
            if i >= limit:
                break
            texts.append(f"{doc.title}\n{doc.text}")
    return texts


# ------------------------------------------------------------------------------------------------
# model
# ------------------------------------------------------------------------------------------------
def tiny_model(tokenizer: Any, size: str = "tiny", seed: int = 0, *, max_position_embeddings: int = 8192,
               tie_word_embeddings: bool = False, **shape: Any):
    """A random `Qwen2ForCausalLM` of `SIZES[size]` over the tokenizer's vocabulary (float32, eval
    mode). Seeded: the torch global RNG is forked, so the caller's RNG state is untouched.

    tie_word_embeddings: share the input embedding and the output head (fewer parameters; a
    small model copies names from its context more easily). shape: `Qwen2Config` fields that
    override those of the size (e.g. ``num_hidden_layers=2``, ``hidden_size=384``)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    config = Qwen2Config(vocab_size=len(tokenizer), max_position_embeddings=max_position_embeddings,
                         tie_word_embeddings=bool(tie_word_embeddings), eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **{**SIZES[size], **shape})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.eval()
    return model
