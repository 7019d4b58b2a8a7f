"""`ScriptedBackend`: a backend that replays given token sequences (tests, demos, benchmarks of the loop).

A *responder* maps a `GenerationRequest` to the ids the "model" generates after the prompt
(``request.key`` names the trajectory and round); `round_script` builds one from per-trajectory
round texts or id lists.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

from mempo.rollout.backends.base import (
    GenerationOutput, GenerationRequest, RequestKey, SamplingParams, register_backend,
)
from mempo.protocol.tags import TAG_SET
from mempo.rollout.backends.stopping import TokenBytes, cut_round
from mempo.utils.tokens import encode_text

__all__ = ["ScriptedBackend", "round_script"]

Responder = Callable[[GenerationRequest], Sequence[int]]


@register_backend("scripted")
class ScriptedBackend:
    """Replays a responder's ids with a real backend's per-round stops: the ids up to and including
    the token that closes an action block, a stop id, or ``max_new_tokens`` ids; with
    ``overgenerate=True`` the whole scripted sequence cut only at ``max_new_tokens`` (as an engine
    that cannot stop on markers; the loop must cut it). Records every call: ``calls`` (the requests
    of each ``generate``) and ``raw_outputs[key]`` (the ids returned per request key).

    Args:
        responder: request -> generated ids.
        tokenizer: the tokenizer (or ``token_table``), for stopping after the action.
        overgenerate: return whole scripted sequences (cut only at ``max_new_tokens``).
    """

    name = "scripted"

    def __init__(self, responder: Responder, tokenizer: Any = None, *, token_table: Any = None,
                 overgenerate: bool = False) -> None:
        if tokenizer is None and token_table is None:
            raise ValueError("ScriptedBackend needs the tokenizer (or its token_table)")
        self.responder = responder
        self.token_bytes = TokenBytes.of(token_table if token_table is not None else tokenizer)
        self.overgenerate = overgenerate
        self.calls: list[list[GenerationRequest]] = []
        self.raw_outputs: dict[Optional[RequestKey], list[int]] = {}
        self.synced: list[Any] = []

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        self.calls.append(list(requests))
        outputs = []
        for request in requests:
            scripted = [int(t) for t in self.responder(request)]
            if self.overgenerate:
                ids, reason = scripted[:request.max_new_tokens], "length"
            else:
                prefix = request.prompt_ids[len(request.prompt_ids) - request.prefix_len:]
                cut = cut_round(scripted, self.token_bytes, prefix_ids=prefix, stop_token_ids=request.stop_token_ids,
                                max_new_tokens=request.max_new_tokens, tags=request.tags or TAG_SET)
                ids, reason = cut.token_ids, cut.reason
            self.raw_outputs[request.key] = list(ids)
            outputs.append(GenerationOutput(ids, reason))
        return outputs

    def sync_weights(self, weights: Any = None) -> None:
        """Records what it was given (there are no weights)."""
        self.synced.append(weights)

    def close(self) -> None:
        """Nothing to release."""


def round_script(tokenizer: Any, scripts: Mapping[Any, Sequence[Union[str, Sequence[int]]]], *,
                 fallback: Optional[Callable[[GenerationRequest], Sequence[int]]] = None) -> Responder:
    """A responder replaying per-trajectory round texts or ids.

    ``scripts`` maps ``(uid, sample_index)`` (looked up first) or ``uid`` to the rounds' continuations
    after the forced prefix (``"</mem><think>...</think><search>q</search>"`` for a round 1 with an
    empty memory); round i replays entry i (a string is encoded with the tokenizer; a list of ids is
    used as is, so a test can hand non-canonical tokenisations). Past the last entry, or with no
    script: ``fallback`` (default: one stop id if the request has one, else nothing).
    """
    cache: dict[tuple[Any, int], list[int]] = {}

    def ids_of(entry: Union[str, Sequence[int]], key: tuple[Any, int]) -> list[int]:
        if key not in cache:
            cache[key] = encode_text(tokenizer, entry) if isinstance(entry, str) else [int(t) for t in entry]
        return cache[key]

    def respond(request: GenerationRequest) -> Sequence[int]:
        key = request.key
        rounds: Optional[Sequence[Any]] = None
        if key is not None:
            rounds = scripts.get((key.uid, key.sample_index))
            if rounds is None:
                rounds = scripts.get(key.uid)
        if rounds is not None and key.round_index < len(rounds):
            lookup = (key.uid, key.sample_index) if (key.uid, key.sample_index) in scripts else key.uid
            return ids_of(rounds[key.round_index], (lookup, key.round_index))
        if fallback is not None:
            return fallback(request)
        return list(request.stop_token_ids[:1])

    return respond
