"""`SGLangBackend`: SGLang's offline engine (``sglang.Engine``) with token ids in and out (GPU).

Conventions
-----------
* The engine runs with ``skip_tokenizer_init=True``: requests are ``input_ids`` and results are
  read from ``output["output_ids"]``; text never crosses the boundary (token-in/token-out). sglang is
  imported when the backend is built, never at ``import mempo.rollout``.
* Without a tokenizer SGLang cannot stop on strings, so a round stops on token ids: the request's
  stop ids plus every id whose bytes hold a whole closing action marker
  (:func:`~mempo.rollout.backends.stopping.action_closing_token_ids`; exact when the markers are
  single tokens). A marker split over several tokens is not seen by the engine: it generates on
  (at most ``max_new_tokens``) and the agent loop cuts the output after the token that closed the
  action (:func:`~mempo.rollout.backends.stopping.cut_round`). If the engine trimmed a matched stop
  id from ``output_ids`` it is put back (``meta_info.finish_reason.matched``).
* Sampling maps to SGLang's sampling parameters: ``temperature``, ``top_p``, ``top_k`` (-1 = off),
  ``max_new_tokens``, ``stop_token_ids``; ``seed`` is sent as ``sampling_seed`` only with
  ``seed_requests=True`` (SGLang versions with deterministic sampling; each request gets
  ``seed + position``).
* ``sync_weights(weights)`` calls ``Engine.update_weights_from_tensor(named_tensors, flush_cache=True)``
  (the radix cache is flushed: cached prefixes were computed with the old weights). ``None`` is a
  no-op.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from mempo.rollout.backends.base import (
    GenerationOutput, GenerationRequest, SamplingParams, named_tensors, register_backend,
)
from mempo.rollout.backends.stopping import STOP_LENGTH, TokenBytes, action_closing_token_ids

__all__ = ["SGLangBackend"]


@register_backend("sglang")
class SGLangBackend:
    """SGLang offline engine behind the backend interface (module conventions).

    Args:
        model_path: the model directory or hub id for ``sglang.Engine`` (ignored when ``engine`` is
            given).
        tokenizer: the tokenizer (or ``token_table``): its token bytes give the action-closing ids.
        engine: an existing ``sglang.Engine`` started with ``skip_tokenizer_init=True``.
        engine_kwargs: extra ``sglang.Engine`` arguments (``mem_fraction_static``, ``dtype``, ...).
        seed_requests: send ``sampling_seed`` per request.
    """

    name = "sglang"

    def __init__(self, model_path: Optional[str] = None, tokenizer: Any = None, *, token_table: Any = None,
                 engine: Any = None, engine_kwargs: Optional[dict[str, Any]] = None,
                 seed_requests: bool = False) -> None:
        if tokenizer is None and token_table is None:
            raise ValueError("SGLangBackend needs the tokenizer (or its token_table) to stop rounds")
        self.token_bytes = TokenBytes.of(token_table if token_table is not None else tokenizer)
        self.action_stop_ids = tuple(action_closing_token_ids(self.token_bytes))
        self.seed_requests = seed_requests
        self._owns_engine = engine is None
        if engine is None:
            if model_path is None:
                raise ValueError("give model_path (or an existing engine)")
            try:
                import sglang
            except ImportError as err:
                raise ImportError("SGLangBackend needs the 'sglang' package (a GPU install: "
                                  "pip install 'sglang[all]'); it is not installed") from err
            kwargs = dict(engine_kwargs or {})
            if kwargs.get("skip_tokenizer_init") is False:
                raise ValueError("SGLangBackend runs the engine with skip_tokenizer_init=True (token ids in/out)")
            kwargs["skip_tokenizer_init"] = True
            engine = sglang.Engine(model_path=model_path, **kwargs)
        self.engine = engine

    def _sampling_params(self, request: GenerationRequest, sampling: SamplingParams, position: int) -> dict:
        params: dict[str, Any] = {
            "max_new_tokens": int(request.max_new_tokens),
            "temperature": float(sampling.temperature),
            "top_p": float(sampling.top_p),
            "top_k": int(sampling.top_k) if sampling.top_k > 0 else -1,
            "stop_token_ids": sorted(set(request.stop_token_ids) | set(self.action_stop_ids)),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if self.seed_requests and sampling.seed is not None:
            params["sampling_seed"] = int(sampling.seed) + position
        return params

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        """One ``Engine.generate`` call for the whole batch (SGLang schedules it continuously)."""
        if not requests:
            return []
        results = self.engine.generate(
            input_ids=[list(r.prompt_ids) for r in requests],
            sampling_params=[self._sampling_params(r, sampling, i) for i, r in enumerate(requests)],
        )
        if isinstance(results, dict):
            results = [results]
        outputs = []
        for request, result in zip(requests, results):
            ids = [int(t) for t in result["output_ids"]]
            finish = (result.get("meta_info") or {}).get("finish_reason") or {}
            kind = finish.get("type") if isinstance(finish, dict) else str(finish)
            matched = finish.get("matched") if isinstance(finish, dict) else None
            if isinstance(matched, int) and (not ids or ids[-1] != matched) and len(ids) < request.max_new_tokens:
                ids.append(matched)
            # SGLang's own reason ("stop", "length", "abort"); the loop's cut decides what the round is
            outputs.append(GenerationOutput(ids, str(kind or STOP_LENGTH), {"meta_info": result.get("meta_info")}))
        return outputs

    def sync_weights(self, weights: Union[None, Mapping[str, Any], Iterable[tuple[str, Any]]] = None) -> None:
        """``Engine.update_weights_from_tensor`` with the trainer's tensors (module conventions)."""
        if weights is None:
            return
        result = self.engine.update_weights_from_tensor(named_tensors=named_tensors(weights), flush_cache=True)
        if isinstance(result, tuple) and result and result[0] is False:
            raise RuntimeError(f"SGLang rejected the weight update: {result[1] if len(result) > 1 else result}")

    def close(self) -> None:
        """Shut the engine down (only one this backend started)."""
        if self._owns_engine and self.engine is not None:
            self.engine.shutdown()
            self.engine = None
