"""A Hugging Face model directory from a sharded checkpoint (`mempo.train.checkpoint`, format 3),
streamed: the safetensors files are written one at a time, each from only its own tensors read out
of the DCP shards (`mempo.train.sharded.read_tensors`), so no process holds the whole model; any
world size wrote the checkpoint. ``mempo export`` and the final ``<out>/model`` of ``mempo train``
use it.

Output (``save_pretrained``'s layout): ``config.json``, ``model.safetensors`` or
``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json`` (``{"metadata":
{"total_size"}, "weight_map"}``), the tokenizer's files when one is given, ``mempo_provenance.json``;
written atomically (`mempo.utils.atomic.atomic_directory`, which never replaces what mempo did not
write). A tied output head is not written
(transformers ties it again on load).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Optional

from safetensors.torch import save_file

from mempo.config import MempoConfig
from mempo.model.adapter import DTYPES
from mempo.model.export import PROVENANCE_FILE, safetensors_names, write_safetensors_index
from mempo.model.loading import build_causal_lm
from mempo.train.checkpoint import MODEL_DIR, latest_checkpoint, verify_checkpoint
from mempo.train.sharded import CheckpointError, read_tensors, tensor_specs
from mempo.utils.atomic import atomic_directory, check_directory_target
from mempo.utils.buckets import plan_buckets
from mempo.utils.types import PathLike

__all__ = ["DEFAULT_SHARD_BYTES", "export_checkpoint"]

DEFAULT_SHARD_BYTES = 5 * 10 ** 9  # transformers' default max_shard_size ("5GB")


def export_checkpoint(checkpoint: PathLike, directory: PathLike, cfg: MempoConfig, tokenizer: Any = None, *,
                      dtype: Optional[str] = None, max_shard_bytes: int = DEFAULT_SHARD_BYTES,
                      provenance: Optional[Mapping[str, Any]] = None, phase: Optional[str] = None,
                      field: str = "") -> Path:
    """Write checkpoint `checkpoint`'s model (a ``step_N`` directory, or a root: its newest complete
    one; verified against its manifest, a damaged one refused naming the file) as a Hugging Face
    directory `directory`, one safetensors file at a time. cfg: the run's config (its ``model``
    section gives the architecture; builtin-tiny's vocabulary is read from the checkpoint). dtype:
    the written dtype (None: as saved, e.g. the fp32 masters; "bfloat16" halves the files). Peak
    memory: one file's tensors (`max_shard_bytes`) plus the largest tensor. This process only; not
    collective. CheckpointError for a checkpoint that is damaged, of the older full-state format, or
    not of this architecture; `directory` must be one `atomic_directory` may replace
    (`mempo.utils.atomic.OutputPathError` naming `field`, checked before the checkpoint is read)."""
    path = Path(checkpoint)
    check_directory_target(directory, field)
    if not path.name.startswith("step_"):  # a root: its newest complete checkpoint (no collective here)
        newest = latest_checkpoint(path) if path.is_dir() else None
        if newest is None:
            raise CheckpointError(f"{path}: no checkpoint in it (expected step_N directories or a checkpoint root)")
        path = newest
    verify_checkpoint(path)  # this process only: rank 0 exports while the others wait
    model_dir = path / MODEL_DIR
    if not (model_dir / ".metadata").is_file():
        raise CheckpointError(f"{model_dir}: no sharded model state (a checkpoint of format 3 is needed; "
                              f"older checkpoints: load them and save again)")
    specs = tensor_specs(model_dir)
    embed = specs.get("model.embed_tokens.weight")
    vocab = embed.shape[0] if embed is not None else None
    skeleton = build_causal_lm(cfg.model, vocab, on_meta=True)  # the architecture, no weights
    expected = skeleton.state_dict()
    tied = bool(getattr(skeleton.config, "tie_word_embeddings", False))
    keys = [k for k in expected if not (tied and k == "lm_head.weight")]
    missing = [k for k in keys if k not in specs]
    if missing:
        raise CheckpointError(f"{model_dir}: does not hold this model's {', '.join(missing[:8])}")
    for key in keys:
        if tuple(specs[key].shape) != tuple(expected[key].shape):
            hint = (" (model.path is builtin-tiny: give the config of the model the run started from, "
                    "model.path set to its directory)" if cfg.model.path == "builtin-tiny" else "")
            raise CheckpointError(f"{model_dir}: {key} has shape {specs[key].shape}, the model's "
                                  f"{tuple(expected[key].shape)}{hint}")
    out_dtype = DTYPES[dtype] if dtype else None
    size_of = {k: math.prod(specs[k].shape) * (out_dtype or specs[k].dtype).itemsize for k in keys}
    files = plan_buckets(size_of, max_shard_bytes)
    names = safetensors_names(len(files))
    with atomic_directory(Path(directory), phase=phase, field=field) as staging:
        weight_map = {}
        for name, group in zip(names, files):
            tensors = read_tensors(model_dir, group, dtype=out_dtype)
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(staging / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in group})
            del tensors
        if len(files) > 1:
            write_safetensors_index(staging, sum(size_of.values()), weight_map)
        config = skeleton.config
        config.dtype = out_dtype or specs[keys[0]].dtype  # what from_pretrained(dtype="auto") loads as
        config.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if provenance is not None:
            (staging / PROVENANCE_FILE).write_text(
                json.dumps(dict(provenance, checkpoint=str(path)), indent=2, sort_keys=True, default=str) + "\n",
                encoding="utf-8")
    return Path(directory)
