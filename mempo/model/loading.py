"""Building and loading the policy model: a transformers causal LM from `ModelConfig` or a saved
model directory, with one-line ConfigErrors that name the setting.

A source is local when it exists, or starts with ".", "/" or "~", or has more than one "/" (a hub
id is ``name`` or ``org/name``). dtypes are named as in `ModelConfig.dtype` ("float32",
"bfloat16", "float16").

Loading never runs code from what it reads: every transformers load here (`pretrained_config`,
`pretrained_tokenizer`, `pretrained_causal_lm`; mempo calls ``from_pretrained`` nowhere else)
refuses repository code (``trust_remote_code`` off, so transformers neither runs a model's own
modules nor asks whether to), and weights are read from safetensors files only: a directory with
only pickled weights (``pytorch_model.bin``) is refused by name unless ``model.allow_pickle_weights``
admits them, and even then torch reads them with its weights-only unpickler.
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
from mempo.utils.files import plain_text, refused_global
from mempo.utils.types import PathLike

__all__ = ["build_causal_lm", "load_pretrained", "load_model_dir", "check_model_fits", "pretrained_config",
           "pretrained_tokenizer", "pretrained_causal_lm", "check_weight_files"]

_PRETRAINED_FILES = {"model": ("config.json",),
                     "tokenizer": ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")}
_NO_REMOTE_CODE = {"trust_remote_code": False}  # the one place it is named: never a model's own code
_PICKLED_WEIGHTS = (".bin", ".pt", ".pth")


def pretrained_config(source: Any, **kwargs: Any):
    """``transformers.AutoConfig.from_pretrained`` without repository code."""
    return transformers.AutoConfig.from_pretrained(source, **kwargs, **_NO_REMOTE_CODE)


def pretrained_tokenizer(source: Any, **kwargs: Any):
    """``transformers.AutoTokenizer.from_pretrained`` without repository code."""
    return transformers.AutoTokenizer.from_pretrained(source, **kwargs, **_NO_REMOTE_CODE)


def pretrained_causal_lm(source: Any, *, allow_pickle_weights: bool = False, **kwargs: Any):
    """``transformers.AutoModelForCausalLM.from_pretrained`` without repository code, its weights
    from safetensors only (``use_safetensors=True``); `allow_pickle_weights`: safetensors when there
    are any, else pickled ``*.bin`` files read by torch's weights-only unpickler (transformers'
    ``weights_only=True``)."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        source, use_safetensors=None if allow_pickle_weights else True, **kwargs, **_NO_REMOTE_CODE)


def check_weight_files(source: str, field: str, allow_pickle_weights: bool = False) -> None:
    """A ConfigError naming `field` when local model directory `source` holds pickled weights
    (``*.bin``, ``*.pt``, ``*.pth``) and no safetensors file, unless `allow_pickle_weights`: a
    pickle can run code when it is read. A hub id or a missing path passes (`load_pretrained`
    refuses a missing one; the hub load itself asks for safetensors)."""
    path = Path(source).expanduser()
    if allow_pickle_weights or not path.is_dir():
        return
    names = sorted(p.name for p in path.iterdir())
    pickled = [name for name in names if name.endswith(_PICKLED_WEIGHTS)]
    if pickled and not any(name.endswith(".safetensors") for name in names):
        shown = ", ".join(pickled[:3]) + (f" and {len(pickled) - 3} more" if len(pickled) > 3 else "")
        raise ConfigError(field, f"{source} holds pickled weights only ({shown}); mempo reads safetensors, which hold "
                                 f"no code: save the model again with save_pretrained (safetensors), or set "
                                 f"model.allow_pickle_weights=true to read them with torch's weights-only unpickler")


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
        refused = refused_global(error)
        detail = (f"it names {refused}, which torch's weights-only loader refuses: weights are read as data, "
                  f"never run" if refused else plain_text(error))
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
            config = load_pretrained(pretrained_config, model_config.path, "model.path", "model")
            with torch.device("meta"):
                return transformers.AutoModelForCausalLM.from_config(
                    config, dtype=dtype, attn_implementation=model_config.attn_implementation)
        check_weight_files(model_config.path, "model.path", model_config.allow_pickle_weights)
        return load_pretrained(lambda source: pretrained_causal_lm(
            source, allow_pickle_weights=model_config.allow_pickle_weights, dtype=dtype,
            attn_implementation=model_config.attn_implementation), model_config.path, "model.path", "model")
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


def load_model_dir(path: PathLike, dtype: str = "float32", *, allow_pickle_weights: bool = False):
    """(model in eval mode, tokenizer) from a directory holding a saved HF causal LM and its
    tokenizer; a ConfigError naming ``--model`` when it holds none (`load_pretrained`), or only
    pickled weights and not `allow_pickle_weights` (``model.allow_pickle_weights``; `check_weight_files`)."""
    source = str(path)
    check_weight_files(source, "--model", allow_pickle_weights)
    model = load_pretrained(lambda s: pretrained_causal_lm(
        s, allow_pickle_weights=allow_pickle_weights, dtype=getattr(torch, dtype)), source, "--model", "model")
    tokenizer = load_pretrained(pretrained_tokenizer, source, "--model", "tokenizer")
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
