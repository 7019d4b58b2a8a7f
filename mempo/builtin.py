"""Built-in tiny tokenizer and models (no download), and the protocol scaffold for random models.

* `train_tokenizer(texts, vocab_size)`: a byte-level BPE trained with Hugging Face `tokenizers` on
  `texts`, wrapped as a `transformers.PreTrainedTokenizerFast`. Special tokens: ``<|endoftext|>``
  (pad), ``<|im_start|>``, ``<|im_end|>`` (EOS), and a ChatML chat template identical to the
  built-in rendering of `mempo.rollout.chat`. The protocol tags (``<mem>``, ``<think>``, ...) are NOT
  special tokens: they are ordinary text (BPE merges usually make them one or a few ids).
  Deterministic: the same texts and vocab size give the same tokenizer.
* `default_corpus_texts(world)`: protocol-like texts (the world's documents plus tag templates) to
  train it on.
* `tiny_model(tokenizer, size, seed)`: a randomly initialised `Qwen2ForCausalLM` (float32, untied
  embeddings) of one of `SIZES`:

      tiny:  hidden 64,  2 layers, 4 heads (2 KV), MLP 128
      small: hidden 256, 4 layers, 8 heads (4 KV), MLP 512

* `save_builtin(dir, model, tokenizer)` / `load_builtin(dir)`: ``save_pretrained`` of both, plus a
  marker file ``mempo_builtin.json`` (so `ModelConfig.path` can point at the directory, and the
  trainer knows the model is a built-in one that needs the scaffold).
* `ProtocolScaffold` + `ScaffoldedHFBackend`: a random (or barely trained) model does not follow
  the turn protocol, so every rollout would end after one malformed round. The scaffold is a
  transformers logits processor that shapes each round into

      <mem>[free x mem_tokens]</mem>\\n<think>\\n[free x think_tokens]\\n</think>\\n
        rounds < turns-1:  <search>[free x query_tokens]</search>
        last round:        <answer>{choice: the gold answer | "unknown"}</answer>

  "free" tokens are sampled from the model (tokens whose bytes contain ``<`` or ``>`` and the
  special tokens are banned, and a mem's first token must hold a non-space byte, so every ``<mem>``
  is well formed and non-blank); tags are forced; the answer is a *choice* the model makes: at each
  answer position only the next tokens of the candidates still consistent with what was generated
  are allowed, so P(correct answer) is the model's own (learnable) probability. Outcome rewards thus
  vary inside a group, and memory rewards come from the model's own free memory text. Every token
  (forced or free) is a real generated token, scored by the actor like any other.
  The scaffold is for demos and tests only; real models follow the protocol themselves.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from mempo.atomic import atomic_directory

__all__ = ["SIZES", "SPECIAL_TOKENS", "CHATML_TEMPLATE", "MARKER_FILE", "train_tokenizer", "default_corpus_texts",
           "tiny_model", "save_builtin", "load_builtin", "is_builtin_dir", "ProtocolScaffold",
           "ScaffoldedHFBackend", "answer_text"]

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
MARKER_FILE = "mempo_builtin.json"
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
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
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `texts` (module docstring).

    vocab_size: the target size including the 256 byte tokens and the special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be > {256 + len(SPECIAL_TOKENS)}, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
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
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

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


def save_builtin(directory: Union[str, os.PathLike], model: Any, tokenizer: Any, **info: Any) -> Path:
    """``save_pretrained`` of model and tokenizer into `directory` plus the builtin marker file,
    atomically (`mempo.atomic.atomic_directory`: a crash leaves the previous directory or none)."""
    path = Path(directory)
    with atomic_directory(path) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / MARKER_FILE).write_text(json.dumps({"builtin": True, **info}, sort_keys=True) + "\n",
                                           encoding="utf-8")
    return path


def is_builtin_dir(path: Union[str, os.PathLike, None]) -> bool:
    """True when `path` is a directory written by `save_builtin`."""
    return path is not None and (Path(path) / MARKER_FILE).is_file()


def load_builtin(directory: Union[str, os.PathLike]):
    """(model, tokenizer) saved by `save_builtin` (float32, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.eval()
    return model, AutoTokenizer.from_pretrained(directory)


# ------------------------------------------------------------------------------------------------
# protocol scaffold
# ------------------------------------------------------------------------------------------------
def answer_text(golds: Any) -> str:
    """The answer string of `golds` (first alias of every objective, joined by "; ")."""
    from mempo.reward import objectives_from_golds

    return "; ".join(aliases[0] for aliases in objectives_from_golds(golds))


class ProtocolScaffold:
    """A logits processor shaping each round into a well-formed protocol turn (module docstring).

    Args:
        tokenizer: the policy's tokenizer.
        turns: rounds per trajectory (searches in rounds 1..turns-1, the answer in round `turns`).
        mem_tokens / think_tokens / query_tokens: free tokens of each segment.
        wrong_answer: the alternative to the gold answer in the last round's choice.
    Call `set_answers({task_id: answer})` before a rollout; `begin(requests)` is called by
    `ScaffoldedHFBackend` before each ``generate`` chunk (rows in request order).
    """

    def __init__(self, tokenizer: Any, turns: int = 3, *, mem_tokens: int = 8, think_tokens: int = 4,
                 query_tokens: int = 3, wrong_answer: str = "unknown"):
        import torch

        from mempo.rollout.backends.stopping import TokenBytes

        if turns < 1:
            raise ValueError("turns must be >= 1")
        self.tokenizer = tokenizer
        self.turns = turns
        self.enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
        pieces = TokenBytes.of(tokenizer).pieces
        vocab = max(len(tokenizer), len(pieces))
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        banned = [i for i in range(vocab) if i >= len(pieces) or i in special or not pieces[i]
                  or b"<" in pieces[i] or b">" in pieces[i]]
        self.banned = torch.tensor(sorted(set(banned)), dtype=torch.long)
        blank = [i for i in range(len(pieces)) if pieces[i] and not pieces[i].strip()]
        self.banned_first = torch.tensor(sorted(set(banned) | set(blank)), dtype=torch.long)
        self.sizes = (mem_tokens, think_tokens, query_tokens)
        self.wrong_answer = wrong_answer
        self.answers: dict[str, str] = {}
        self.rows: list[Optional[list]] = []
        self.width: Optional[int] = None
        self._plans: dict[tuple[int, str], list] = {}

    def set_answers(self, answers: Mapping[str, str]) -> None:
        """Gold answer text per task id (the request key's uid, before any "#k" suffix)."""
        self.answers = dict(answers)

    def plan(self, round_index: int, answer: Optional[str]) -> list:
        """The segment plan of one round: ("free", n, first_banned), ("force", ids), ("choice", [ids])."""
        key = (min(round_index, self.turns - 1), answer or "")
        if key in self._plans:
            return self._plans[key]
        mem, think, query = self.sizes
        segments: list = [("free", mem, True), ("force", self.enc("</mem>\n<think>\n")), ("free", think, False)]
        if key[0] < self.turns - 1:
            segments += [("force", self.enc("\n</think>\n<search>")), ("free", query, True),
                         ("force", self.enc("</search>"))]
        else:
            candidates = [self.enc(self.wrong_answer)]
            if answer and self.enc(answer) != candidates[0]:
                candidates.insert(0, self.enc(answer))
            segments += [("force", self.enc("\n</think>\n<answer>")), ("choice", candidates),
                         ("force", self.enc("</answer>"))]
        self._plans[key] = segments
        return segments

    def begin(self, requests: Sequence[Any]) -> None:
        self.rows, self.width = [], None
        for request in requests:
            key = request.key
            if key is None:
                self.rows.append(None)
                continue
            task_id = str(key.uid).split("#", 1)[0]
            self.rows.append(self.plan(key.round_index, self.answers.get(task_id)))

    @staticmethod
    def _constraint(plan: list, generated: list[int]):
        """("free", first_banned) | ("allow", [ids]) | None (plan done) for the next token."""
        pos, n = 0, len(generated)
        for segment in plan:
            kind = segment[0]
            if kind == "free":
                if n - pos < segment[1]:
                    return ("free", segment[2] and n == pos)
                pos += segment[1]
            elif kind == "force":
                k = n - pos
                if k < len(segment[1]):
                    return ("allow", [segment[1][k]])
                pos += len(segment[1])
            else:  # choice
                k = n - pos
                done = [c for c in segment[1] if len(c) <= k and generated[pos:pos + len(c)] == c]
                if done:
                    pos += len(done[0])
                    continue
                allowed = sorted({c[k] for c in segment[1] if len(c) > k and generated[pos:pos + k] == c[:k]})
                return ("allow", allowed) if allowed else None
        return None

    def __call__(self, input_ids, scores):
        import torch

        if self.width is None:
            self.width = input_ids.shape[1]
        new = input_ids[:, self.width:].tolist()
        for row, plan in enumerate(self.rows):
            if plan is None or row >= scores.shape[0]:
                continue
            constraint = self._constraint(plan, new[row])
            if constraint is None:
                continue
            if constraint[0] == "free":
                scores[row, self.banned_first if constraint[1] else self.banned] = float("-inf")
            else:
                keep = scores[row, constraint[1]].clone()
                if not bool(torch.isfinite(keep).any()):
                    keep = torch.zeros_like(keep)
                scores[row] = float("-inf")
                scores[row, constraint[1]] = keep
        return scores


def _scaffolded_backend_class():
    from mempo.rollout.backends.hf import HFBackend

    class ScaffoldedHFBackend(HFBackend):
        """`HFBackend` whose generation is shaped by a `ProtocolScaffold` (module docstring)."""

        def __init__(self, model: Any, tokenizer: Any, scaffold: ProtocolScaffold, **kwargs: Any):
            super().__init__(model, tokenizer, logits_processors=[scaffold], **kwargs)
            self.scaffold = scaffold

        def _generate_chunk(self, requests, sampling):
            self.scaffold.begin(requests)
            return super()._generate_chunk(requests, sampling)

    return ScaffoldedHFBackend


def __getattr__(name: str):
    if name == "ScaffoldedHFBackend":
        cls = _scaffolded_backend_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module 'mempo.builtin' has no attribute {name!r}")
