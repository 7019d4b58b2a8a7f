"""The generation-backend interface: token ids in, new token ids out.

Conventions
-----------
* A backend receives a batch of :class:`GenerationRequest` s (every trajectory waiting for its next
  round) and returns one :class:`GenerationOutput` per request, in order. Prompts are token ids
  (the round's full context, ending with the forced ``<mem>`` prefix); outputs are the ids the model
  generated after the prompt, *as generated*: the agent loop never decodes and re-encodes them.
* A backend should stop a sequence after the token that closes an action block
  (:mod:`mempo.rollout.backends.stopping`), at a stop token, or after ``max_new_tokens``; it may
  also over-generate (a backend that can only stop on token ids): the loop cuts every output with
  :func:`~mempo.rollout.backends.stopping.cut_round`, which is authoritative.
* Sampling: ``temperature == 0`` is greedy; ``top_k <= 0`` and ``top_p >= 1`` disable those
  filters; ``seed`` makes one call reproducible (same requests, same seed, same outputs on the same
  machine and backend).
* Log-probs: a backend that can (``returns_logprobs = True``) gives each output's ``logprobs``, the
  log-prob of every returned id under the policy that sampled it at the sampling temperature
  (``log softmax(logits / T)``, as the trainer computes it; top-k / top-p not applied; the raw
  distribution when greedy), so the trainer can correct for a rollout policy that differs from the
  trained one (``actor.rollout_is``). The forced prefix is prompt input: it has none.
* ``sync_weights(weights)`` loads trainer weights (``{name: tensor}`` or ``[(name, tensor)]``, the
  names of the model's ``state_dict``) without a checkpoint; ``None`` means "the backend shares the
  trainer's model object" (nothing to do).
* Backends are registered by name (``make_backend("hf", model=..., tokenizer=...)``); heavy
  libraries (transformers, sglang) are imported only when a backend is built.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Optional, Protocol, Sequence, Union, runtime_checkable

from mempo.utils.registry import Registry

__all__ = ["SamplingParams", "RequestKey", "GenerationRequest", "GenerationOutput", "GenerationBackend",
           "BACKENDS", "register_backend", "make_backend", "available_backends", "named_tensors"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling for one generation call: ``temperature == 0`` is greedy; ``top_k <= 0`` and
    ``top_p >= 1`` disable those filters; ``seed`` makes the call reproducible (same requests, same
    seed, same outputs on the same machine and backend)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class RequestKey(NamedTuple):
    """Which trajectory and round a request generates: group uid, sample index, 0-based round."""

    uid: str
    sample_index: int
    round_index: int


@dataclass
class GenerationRequest:
    """One sequence to continue.

    prompt_ids: the context ids, ending with the round's forced prefix (``prefix_len`` ids).
    max_new_tokens: at most this many new ids (>= 1).
    prefix_len: how many trailing prompt ids belong to the round being generated (the forced
        ``<mem>``); stop detection starts scanning there.
    stop_token_ids: ids that end the round when generated (EOS, ``<|im_end|>``).
    key: the trajectory and round (scripted backends and request ids use it).
    tags: the protocol's `mempo.protocol.tags.TagSet` whose actions close the round (None: the tags
        format's ``TAG_SET``); a backend that stops on markers reads it.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    prefix_len: int = 0
    stop_token_ids: tuple[int, ...] = ()
    key: Optional[RequestKey] = None
    tags: Any = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.prefix_len <= len(self.prompt_ids):
            raise ValueError("prefix_len must be between 0 and len(prompt_ids)")


@dataclass
class GenerationOutput:
    """The ids generated for one request, why generation stopped (``"action"``, ``"eos"``,
    ``"length"``, or a backend's own reason string), and ``logprobs``: one per id, the sampling
    policy's log-prob of it (module docstring; None: the backend gives none)."""

    token_ids: list[int]
    finish_reason: str = "length"
    metadata: dict[str, Any] = field(default_factory=dict)
    logprobs: Optional[list[float]] = None

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"{len(self.logprobs)} log-probs for {len(self.token_ids)} generated ids")


@runtime_checkable
class GenerationBackend(Protocol):
    """What the agent loop needs from a generator (``returns_logprobs``: whether its outputs carry
    ``logprobs``; a backend without the attribute gives none)."""

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        """One output per request, in order: the ids generated after each prompt, as generated,
        stopped after a closed action block, a stop id or ``max_new_tokens`` (over-generation is
        allowed: the loop's `cut_round` is authoritative)."""
        ...

    def sync_weights(self, weights: Union[None, Mapping[str, Any], Iterable[tuple[str, Any]]] = None) -> None:
        """Load trainer weights (``None``: the model object is shared, nothing to do)."""
        ...


BACKENDS = Registry("generation backend")


def register_backend(name: str):
    """Decorator registering a backend class (or factory) under ``name``."""
    return BACKENDS.register(name)


def make_backend(name: str, *args: Any, **kwargs: Any) -> GenerationBackend:
    """Build the backend registered under ``name`` ("hf", "sglang", "scripted")."""
    return BACKENDS.get(name)(*args, **kwargs)


def available_backends() -> list[str]:
    return BACKENDS.names()


def named_tensors(weights: Union[Mapping[str, Any], Iterable[tuple[str, Any]]]) -> list[tuple[str, Any]]:
    """``[(name, tensor)]`` from a state dict or an iterable of pairs."""
    if isinstance(weights, Mapping):
        return list(weights.items())
    return [(str(name), tensor) for name, tensor in weights]
