"""Shared helpers for the rollout and algo tests: tokenizers, a tiny random Qwen2, scripts.

* `chat_tokenizer()`: the span tests' byte-level BPE (~800 ids, trained on protocol-like text) plus
  `<|im_start|>`/`<|im_end|>` as special tokens, wrapped as a transformers fast tokenizer with a
  ChatML chat template (EOS `<|im_end|>`, pad `<|endoftext|>`).
* `raw_tokenizer()`: the same as a bare `tokenizers.Tokenizer` (no chat template: the built-in one).
* `tiny_qwen2(vocab_size, seed)`: a random 2-layer, 64-wide Qwen2 causal LM (float32, eval mode).
* `needle_scripts(...)`: oracle-like round texts over the shared test corpus (`needle-i` documents
  hold the unique word `zebulon<i>`, title "Needle i").
* `merged_closer(tok)`: a vocabulary token that closes an action marker and continues.
* `trajectory(...)`: a hand-made two-round `Trajectory` (the algo tests).
"""
from __future__ import annotations

import functools

from mempo.rollout.backends import TokenBytes
from mempo.records.trajectory import Round, Trajectory

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.lru_cache(maxsize=None)
def raw_tokenizer():
    from tokenizers import Tokenizer

    from support.toy_tokenizers import byte_level_tokenizer

    tokenizer = Tokenizer.from_str(byte_level_tokenizer().to_str())
    tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return tokenizer


@functools.lru_cache(maxsize=None)
def chat_tokenizer():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(raw_tokenizer().to_str()),
                                        eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tiny_qwen2(vocab_size: int, seed: int = 0, layers: int = 2, hidden: int = 64):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.eval()
    return model


def needle_scripts(needle: int, *, correct: bool = True, extra_search: bool = False) -> list[str]:
    """Round continuations (after the forced `<mem>`) of an oracle-like agent answering
    "which document holds zebulon<needle>?" with one search (two with `extra_search`)."""
    rounds = [f"</mem>\n<think>\nI need the document that mentions zebulon{needle}.\n</think>\n"
              f"<search>zebulon{needle}</search>"]
    if extra_search:
        rounds.append(f"zebulon{needle} search done; title is Needle {needle}</mem>\n<think>\ncheck again\n</think>\n"
                      f"<search>zebulon{needle} river</search>")
    answer = f"Needle {needle}" if correct else f"Needle {needle + 1}"
    rounds.append(f"zebulon{needle} is in the document titled Needle {needle}</mem>\n<think>\nanswer now\n</think>\n"
                  f"<answer>{answer}</answer>")
    return rounds


def needle_task(needle: int) -> dict:
    return {"id": f"q{needle}", "prompt": f"Which document mentions zebulon{needle}? Give its title.",
            "golds": [f"Needle {needle}"]}


def identity_weights(model) -> dict:
    """Weights under which a Qwen2 repeats its last input token greedily: every decoder-layer
    projection (and bias) is zero, so the residual stream is the token's embedding, and the LM head
    is the embedding matrix (argmax_v <e_v, e_x / rms(e_x)> = x for random embeddings)."""
    import torch

    state = model.state_dict()
    weights = {}
    for name, tensor in state.items():
        if name == "lm_head.weight":
            weights[name] = state["model.embed_tokens.weight"].detach().clone()
        elif name.startswith("model.layers.") and not name.endswith("layernorm.weight"):
            weights[name] = torch.zeros_like(tensor)
        else:
            weights[name] = tensor.detach().clone()
    return weights


def merged_closer(tok):
    """(id, bytes) of a vocabulary token that starts with '>' and continues (e.g. '>\\n'), so that
    `</search` + it completes the marker with trailing characters in one token."""
    pieces = TokenBytes.of(tok).pieces
    for token_id, piece in enumerate(pieces):
        if piece.startswith(b">") and len(piece) > 1 and b"<" not in piece:
            return token_id, piece
    raise AssertionError("no merged '>' token in the test vocabulary")


def trajectory(golds=("x",), second_mem=(5, 7)):
    """prompt [1 2 3]; round 1 = response [0, 3) + tool [3, 5); round 2 = response [5, 10)."""
    rounds = [Round(index=0, start=0, end=3, tool_end=5, full_end=3, mem_span=(0, 2)),
              Round(index=1, start=5, end=10, tool_end=10, full_end=8, mem_span=second_mem)]
    t = Trajectory(uid="q", sample_index=0, policy="full", prompt_ids=[1, 2, 3],
                   response_ids=[10, 11, 12, 13, 14, 15, 16, 17, 18, 19], response_mask=[1, 1, 1, 0, 0, 1, 1, 1, 1, 1],
                   rounds=rounds, finish_reason="answer", golds=list(golds))
    t.validate()
    return t


def text_trajectory(tok, question: str, rounds, golds, policy: str = "full", uid: str = "q", sample_index: int = 0):
    """A full-policy `Trajectory` from texts: ``rounds`` = [(mem, rest, information or None)], each
    round's ids = encode("<mem>" + mem + "</mem>") + encode(rest), its mem_span the first part; the
    tool segment holds encode(information) alone. The prompt is a ChatML user turn."""
    def encode(text):
        return list(tok.encode(text, add_special_tokens=False))

    prompt = encode(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
    response, made = [], []
    for index, (mem, rest, information) in enumerate(rounds):
        start = len(response)
        response += encode(f"<mem>{mem}</mem>")
        mem_end = len(response)
        response += encode(rest)
        end = len(response)
        info = None
        if information is not None:
            response += encode(information)
            info = (end, len(response))
        made.append(Round(index=index, start=start, end=end, tool_end=len(response), full_end=len(prompt) + start,
                          mem_span=(start, mem_end), information=info))
    t = Trajectory(uid=uid, sample_index=sample_index, policy=policy, prompt_ids=prompt, response_ids=response,
                   response_mask=[1] * len(response), rounds=made, finish_reason="answer", golds=golds)
    t.validate()
    return t
