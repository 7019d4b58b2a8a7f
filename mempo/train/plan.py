"""`mempo plan`: will a training config fit the GPUs, before they are rented? Per GPU and per stage
of a step, the bytes the run's layout needs (FSDP2 over every GPU of every node, mempo's actor,
teacher scoring and generation), whether the largest stage fits, and which knob to turn if not.

The model's parameters are counted exactly, tensor by tensor, on the meta device (no weights read):
from ``model.path``'s config.json when it is a local directory or in the Hugging Face cache, else
from `KNOWN_ARCHITECTURES` (the published config.json fields of the presets' models). Each FSDP2
shard is ``ceil(dim0 / N)`` rows of its tensor (FSDP2 pads dim 0 to a multiple of N).

Stages (bytes per GPU):

* model state: sharded parameters, gradients and AdamW's two moments, all in the parameter dtype
  (``model.dtype``; fp32 masters: 16 bytes per parameter over N), plus the frozen reference's
  shards when ``actor.kl_coef > 0``. `validate` compares this with the tensors torch holds on
  each rank (tests/train/test_plan.py, within 20 %).
* training: model state + the root's parameters gathered in the compute dtype (``actor.param_dtype``)
  + two decoder layers in flight (prefetch) + one layer's fp32 reduce-scatter buffer + the
  activations of one micro-batch of ``actor.micro_batch_tokens`` tokens (per token and layer
  ``c * (8 h + 4.5 i)`` bytes without checkpointing, fitted to a measured 225,912 B at Qwen2.5-7B
  in bf16; ``c * h`` kept per layer plus one layer recomputed with it) + the chunked log-prob
  head (``3 * 4 * V`` bytes per row of ``actor.logprob_chunk_tokens``).
* teacher scoring, on the shards (`mempo.train.actor.Actor.sharded_inference`): model state + the
  root's parameters gathered + one decoder layer gathered (each layer gathers in its forward and
  frees after) + one scoring forward of ``scoring.token_budget`` tokens (its KV cache and hidden
  states).
* HF generation (``rollout.backend: hf``): model state + the whole model gathered in the compute
  dtype (`mempo.train.actor.Actor.unsharded`, for the rollout only) + the same forward's bytes as a
  stand-in for generation's KV cache (an estimate, not measured).
* generation engine (``rollout.backend: sglang``): model state + ``rollout.sglang_mem_fraction``
  of the GPU (the engine's weights and KV cache; released while the trainer's stages run).
* weight sync (SGLang): model state + the engine's weights + one bucket
  (``StepContext.sync_bucket_bytes``) + the largest tensor being gathered.
* host memory per rank (not GPU): with ``trainer.async_save`` the checkpoint's snapshot of the
  rank's parameter and AdamW moment shards (`mempo.train.checkpoint.start_checkpoint`), held until
  the background writer has written them.
* every stage adds `RUNTIME_OVERHEAD_BYTES` (CUDA context, NCCL buffers, fragmentation: an
  estimate, not measured here).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import transformers

from mempo.config import ConfigError, MempoConfig
from mempo.model.adapter import DTYPES
from mempo.model.loading import build_causal_lm, pretrained_config

__all__ = ["KNOWN_ARCHITECTURES", "RUNTIME_OVERHEAD_BYTES", "SYNC_BUCKET_BYTES", "ModelShape", "Stage", "Plan",
           "model_shape", "model_state_bytes", "plan_memory", "format_plan", "parse_bytes", "MAX_BYTES"]

GIB = 1 << 30
RUNTIME_OVERHEAD_BYTES = 4 * GIB
SYNC_BUCKET_BYTES = 256 << 20  # mempo.train.step.StepContext.sync_bucket_bytes
#: Published config.json fields of the presets' models (huggingface.co/Qwen/<name>/blob/main/config.json).
KNOWN_ARCHITECTURES = {
    "Qwen/Qwen2.5-3B-Instruct": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                     num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                                     tie_word_embeddings=True, max_position_embeddings=32768),
    "Qwen/Qwen2.5-7B-Instruct": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                     num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                     tie_word_embeddings=False, max_position_embeddings=32768),
}


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs of a model: each parameter's shape (tied ones once), the decoder
    layer count, hidden, intermediate and KV widths, vocabulary, and which parameters sit outside
    the decoder layers (FSDP2's root unit)."""

    shapes: dict[str, tuple[int, ...]]
    layers: int
    hidden: int
    intermediate: int
    kv_width: int
    vocab: int
    root_params: tuple[str, ...]

    @property
    def parameters(self) -> int:
        return sum(math.prod(s) for s in self.shapes.values())


def model_shape(cfg: MempoConfig, vocab_size: int = 1024) -> ModelShape:
    """The parameter shapes of ``cfg.model``, built on the meta device. builtin-tiny: its size fields
    (vocabulary: ``model.vocab_size`` or `vocab_size`, the trainer's tokenizer size); otherwise the
    config.json of ``model.path`` (a directory, or the HF cache), else `KNOWN_ARCHITECTURES`;
    ConfigError naming ``model.path`` when none has it."""
    if cfg.model.path == "builtin-tiny" or _readable(cfg.model.path):
        model = build_causal_lm(cfg.model, cfg.model.vocab_size or vocab_size, on_meta=True)
    elif cfg.model.path in KNOWN_ARCHITECTURES:
        config = transformers.Qwen2Config(**KNOWN_ARCHITECTURES[cfg.model.path])
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=DTYPES[cfg.model.dtype])
    else:
        raise ConfigError("model.path", f"cannot read the config.json of {cfg.model.path!r} (not a local "
                                        f"directory, not in the Hugging Face cache); download it first")
    config = model.config
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}  # tied parameters once
    root = tuple(name for name in shapes if ".layers." not in name)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return ModelShape(shapes, config.num_hidden_layers, config.hidden_size, config.intermediate_size,
                      config.num_key_value_heads * head_dim, config.vocab_size, root)


def _readable(path: str) -> bool:
    try:
        pretrained_config(path, local_files_only=True)
    except Exception:  # anything transformers raises means: not available here
        return False
    return True


def _shard_elements(shape: tuple[int, ...], world: int) -> int:
    if not shape:
        return 1
    return math.ceil(shape[0] / world) * math.prod(shape[1:])


def model_state_bytes(shape: ModelShape, world: int, param_bytes: int, *, reference: bool = False) -> int:
    """Bytes of one rank's sharded parameters, gradients and AdamW moments (all in the parameter
    dtype), plus the frozen reference's parameter shards when `reference`."""
    shard = sum(_shard_elements(s, world) for s in shape.shapes.values()) * param_bytes
    return 4 * shard + (shard if reference else 0)


@dataclass
class Stage:
    """One stage's bytes per GPU and what they are made of ({part: bytes})."""

    name: str
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


@dataclass
class Plan:
    """`plan_memory`'s answer: the setting, the model, each stage, the GPU memory, and advice."""

    world: int
    parameters: int
    gpu_bytes: int
    stages: list[Stage]
    advice: list[str] = field(default_factory=list)
    host: dict[str, int] = field(default_factory=dict)  # {what: bytes} per rank in host memory

    @property
    def peak(self) -> Stage:
        return max(self.stages, key=lambda stage: stage.total)

    @property
    def fits(self) -> bool:
        return self.peak.total <= self.gpu_bytes


def plan_memory(cfg: MempoConfig, nproc_per_node: int, gpu_bytes: int, nnodes: int = 1,
                shape: Optional[ModelShape] = None) -> Plan:
    """The per-GPU memory of each stage of a step of `cfg` on ``nnodes * nproc_per_node`` GPUs of
    `gpu_bytes` each (the module docstring says what each stage counts)."""
    for flag, count in (("--nproc-per-node", nproc_per_node), ("--nnodes", nnodes)):
        if count < 1:
            raise ConfigError(flag, f"must be >= 1, got {count}")
    world = nproc_per_node * nnodes
    shape = shape or model_shape(cfg)
    a = cfg.actor
    master = DTYPES[cfg.model.dtype].itemsize
    compute = DTYPES[a.param_dtype or cfg.model.dtype].itemsize
    state = model_state_bytes(shape, world, master, reference=a.kl_coef > 0)
    sizes = {name: math.prod(s) for name, s in shape.shapes.items()}
    root_params = sum(sizes[n] for n in shape.root_params)
    layer_params = (shape.parameters - root_params) / max(shape.layers, 1)
    tokens = a.micro_batch_tokens or 32768
    per_token_layer = compute * (8 * shape.hidden + 4.5 * shape.intermediate)
    if a.gradient_checkpointing:
        activations = tokens * (compute * shape.hidden * shape.layers + per_token_layer)
    else:
        activations = tokens * per_token_layer * shape.layers
    training = Stage("training (one micro-batch)", {
        "model state": state,
        "root parameters gathered": root_params * compute,
        "layers in flight": int(2 * layer_params * compute),
        "reduce-scatter buffer": int(layer_params * 4),
        "activations" + (" (checkpointed)" if a.gradient_checkpointing else ""): int(activations),
        "log-prob head chunk": 3 * 4 * shape.vocab * a.logprob_chunk_tokens,
        "runtime overhead": RUNTIME_OVERHEAD_BYTES})
    budget = cfg.scoring.token_budget
    forward = budget * shape.layers * 2 * shape.kv_width * compute + budget * shape.hidden * compute * 4
    scoring = Stage("teacher scoring (on the shards)", {
        "model state": state, "root parameters gathered": root_params * compute,
        "one layer gathered": int(layer_params * compute), "scoring forward": forward,
        "runtime overhead": RUNTIME_OVERHEAD_BYTES})
    stages = [training, scoring]
    if cfg.rollout.backend == "hf":
        stages.append(Stage("HF generation (whole model gathered)", {
            "model state": state, "whole model gathered": shape.parameters * compute,
            "forward (KV cache estimate)": forward, "runtime overhead": RUNTIME_OVERHEAD_BYTES}))
    if cfg.rollout.backend == "sglang":  # the engine's weights are its own copy, in rollout.dtype
        engine_weights = shape.parameters * DTYPES[cfg.rollout.dtype or a.param_dtype or cfg.model.dtype].itemsize
        stages.append(Stage("generation engine (SGLang)", {
            "model state": state, "engine share": int(cfg.rollout.sglang_mem_fraction * gpu_bytes),
            "runtime overhead": RUNTIME_OVERHEAD_BYTES}))
        stages.append(Stage("weight sync", {
            "model state": state, "engine weights": engine_weights, "bucket": SYNC_BUCKET_BYTES,
            "largest tensor": max(sizes.values()) * compute, "runtime overhead": RUNTIME_OVERHEAD_BYTES}))
    plan = Plan(world, shape.parameters, gpu_bytes, stages)
    if cfg.trainer.async_save:  # parameters and two moments; the gradients are not saved
        snapshot = 3 * model_state_bytes(shape, world, master) // 4
        plan.host["async save snapshot (parameter and optimiser shards)"] = snapshot
    plan.advice = _advice(cfg, plan, training, scoring)
    return plan


def _advice(cfg: MempoConfig, plan: Plan, training: Stage, scoring: Stage) -> list[str]:
    if plan.fits:
        return []
    tips = []
    peak = plan.peak
    if peak is training:
        if not cfg.actor.gradient_checkpointing:
            tips.append("set actor.gradient_checkpointing=true (activations of one layer per token kept)")
        tips.append(f"lower actor.micro_batch_tokens (now {cfg.actor.micro_batch_tokens})")
    if peak is scoring:
        tips.append(f"lower scoring.token_budget (now {cfg.scoring.token_budget})")
    if peak.name.startswith("HF generation"):
        tips.append("set rollout.backend=sglang (the engine holds the generation weights; the trainer gathers none)")
    if cfg.actor.param_dtype is None and cfg.model.dtype == "float32":
        tips.append("set actor.param_dtype=bfloat16 (bf16 compute, fp32 masters)")
    if cfg.rollout.backend == "sglang" and peak.name.startswith("generation"):
        tips.append(f"lower rollout.sglang_mem_fraction (now {cfg.rollout.sglang_mem_fraction})")
    tips.append(f"use more GPUs (model state falls as 1/N; now {plan.world})")
    return tips


#: The largest size `parse_bytes` accepts: 2^63 bytes, the limit of the int64 sizes torch and files use.
MAX_BYTES = 1 << 63
_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text: str, field_name: str = "--gpu-memory") -> int:
    """``80GiB``, ``80GB``, ``81920MiB``, ``85899345920`` -> bytes, at least 1 and below `MAX_BYTES`;
    ConfigError naming the option otherwise (``1e400GiB`` included)."""
    value = text.strip().lower().replace(" ", "")
    number = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = value[len(number):]
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if unit not in _UNITS or not amount > 0:
        raise ConfigError(field_name, f"{text!r} is not a memory size (e.g. 80GiB, 80GB, 81920MiB)")
    size = amount * _UNITS[unit]
    if not size < MAX_BYTES:  # inf included
        raise ConfigError(field_name, f"{text!r} is larger than any memory (the limit is 2^63 bytes, 8 EiB)")
    return int(size)


def format_plan(plan: Plan) -> str:
    """The plan as a text table, GiB per GPU."""
    lines = [f"{plan.parameters / 1e6:,.1f} M parameters on {plan.world} GPU(s) of {plan.gpu_bytes / GIB:.1f} GiB",
             f"{'stage / part':<44}{'GiB per GPU':>12}"]
    for stage in plan.stages:
        lines.append(f"{stage.name:<44}{stage.total / GIB:>12.2f}")
        lines += [f"  {part:<42}{value / GIB:>12.2f}" for part, value in stage.parts.items()]
    lines += [f"host memory per rank: {part}: {value / GIB:.2f} GiB" for part, value in plan.host.items()]
    verdict = "fits" if plan.fits else "does NOT fit"
    lines.append(f"peak: {plan.peak.name}, {plan.peak.total / GIB:.2f} GiB of {plan.gpu_bytes / GIB:.1f} GiB: "
                 f"{verdict}")
    lines += [f"  to fit: {tip}" for tip in plan.advice]
    return "\n".join(lines)
