"""Building and loading the policy model: a transformers causal LM from `ModelConfig` or a saved
model directory, with one-line ConfigErrors that name the setting.

A source is local when it exists, or starts with ".", "/" or "~", or has more than one "/" (a hub
id is ``name`` or ``org/name``). dtypes are named as in `ModelConfig.dtype` ("float32",
"bfloat16", "float16").
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import transformers
from torch import nn

from mempo.config import ConfigError, ModelConfig
from mempo.model.adapter import DTYPES
from mempo.utils.types import PathLike

__all__ = ["build_causal_lm", "load_pretrained", "load_model_dir", "check_model_fits"]

_PRETRAINED_FILES = {"model": ("config.json",),
                     "tokenizer": ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")}


def load_pretrained(load: Callable[[str], Any], source: str, field: str, kind: str) -> Any:
    """``load(source)`` (a transformers ``from_pretrained``) with one-line errors: a ConfigError
    naming `field` when `source` is a local path that is missing, a file, or a directory without a
    saved `kind` ("model": config.json; "tokenizer": tokenizer.json, tokenizer_config.json, ...),
    and when loading fails (a hub id that cannot be fetched, damaged files)."""
    needed = _PRETRAINED_FILES[kind]
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(field, f"{source} is a file, not a directory with a saved {kind}")
        if not any((path / name).is_file() for name in needed):
            raise ConfigError(field, f"{source} holds no saved {kind} (none of {', '.join(needed)})")
    elif source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise ConfigError(field, f"{source}: no such directory")
    try:
        return load(str(path) if path.exists() else source)
    except Exception as error:  # whatever transformers raises for a file it cannot use; the message names it
        detail = " ".join(str(error).split())[:300]
        raise ConfigError(field, f"cannot load the {kind} {source!r} ({type(error).__name__}: {detail})") from None


def build_causal_lm(model_config: ModelConfig, vocab_size: Optional[int] = None, *,
                    on_meta: bool = False) -> nn.Module:
    """A transformers causal LM from `ModelConfig`: ``from_pretrained(path)``, or for
    ``path == "builtin-tiny"`` a randomly initialised Qwen2 of the configured sizes (uses the torch
    RNG; vocab from ``model_config.vocab_size`` or `vocab_size`).

    on_meta: the same architecture with every tensor on the meta device (no memory, no weights
    read): a rank that receives its shards from rank 0 (`mempo.train.actor.Actor`'s
    ``broadcast_from_rank0``)."""
    dtype = DTYPES[model_config.dtype]
    if model_config.path != "builtin-tiny":
        if on_meta:
            config = load_pretrained(transformers.AutoConfig.from_pretrained, model_config.path, "model.path",
                                     "model")
            with torch.device("meta"):
                return transformers.AutoModelForCausalLM.from_config(
                    config, dtype=dtype, attn_implementation=model_config.attn_implementation)
        return load_pretrained(lambda source: transformers.AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=model_config.attn_implementation), model_config.path,
            "model.path", "model")
    vocab = model_config.vocab_size or vocab_size
    if vocab is None:
        raise ValueError("builtin-tiny needs a vocabulary size: set model.vocab_size or pass the tokenizer's")
    qwen_config = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=model_config.hidden_size, intermediate_size=model_config.intermediate_size,
        num_hidden_layers=model_config.num_hidden_layers, num_attention_heads=model_config.num_attention_heads,
        num_key_value_heads=model_config.num_key_value_heads,
        max_position_embeddings=model_config.max_position_embeddings, tie_word_embeddings=False)
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        return transformers.AutoModelForCausalLM.from_config(
            qwen_config, dtype=dtype, attn_implementation=model_config.attn_implementation)


def load_model_dir(path: PathLike, dtype: str = "float32"):
    """(model in eval mode, tokenizer) from a directory holding a saved HF causal LM and its
    tokenizer; a ConfigError naming ``--model`` when it holds none (`load_pretrained`)."""
    source = str(path)
    model = load_pretrained(lambda s: transformers.AutoModelForCausalLM.from_pretrained(
        s, dtype=getattr(torch, dtype)), source, "--model", "model")
    tokenizer = load_pretrained(transformers.AutoTokenizer.from_pretrained, source, "--model", "tokenizer")
    model.eval()
    return model, tokenizer


def check_model_fits(model: Any, tokenizer: Any, sequence_tokens: Optional[int] = None, *,
                     vocab_field: str = "model.vocab_size",
                     context_field: str = "model.max_position_embeddings") -> None:
    """Refuse, before any rollout, a model that cannot take the tokenizer's ids or the run's sequences:
    a ConfigError naming `vocab_field` when the model has fewer token embeddings than the tokenizer
    has tokens (an id past the table is an IndexError mid-rollout), and naming `context_field` when
    its ``max_position_embeddings`` is below `sequence_tokens` (positions past it are unseen; with
    rotary embeddings transformers only warns). A model without those facts passes."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is None:
        rows = getattr(getattr(model, "config", None), "vocab_size", None)
    try:
        tokens = len(tokenizer)
    except TypeError:
        tokens = None
    if rows is not None and tokens is not None and int(rows) < tokens:
        raise ConfigError(vocab_field, f"the model has {int(rows)} token embeddings but the tokenizer has {tokens} "
                                       f"tokens (ids {int(rows)}..{tokens - 1} would index past the table); use a "
                                       f"vocabulary of at least {tokens} or the model's own tokenizer")
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if sequence_tokens is not None and context is not None and int(context) < sequence_tokens:
        raise ConfigError(context_field, f"the model's context is {int(context)} positions, below the "
                                         f"{sequence_tokens} ids a sequence of this run may hold; raise it or "
                                         "lower rollout.max_response_tokens")
