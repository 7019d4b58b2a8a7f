"""SGLang generation: the offline engine in-process (`SGLangBackend`) or a server over HTTP
(`SGLangServerBackend`), token ids in and out (GPU machines).

Conventions: token-in/token-out (requests are ``input_ids``, results ``output_ids``; text never
crosses: the engine runs with ``skip_tokenizer_init=True``, a server with ``--skip-tokenizer-init``).
Every status SGLang returns is checked (`check_status`). sglang is imported when an engine is
started, never at ``import mempo.rollout``; the server backend needs no sglang package (stdlib HTTP).
Follows SGLang 0.5.x source (``sgl-project/sglang``, ``python/sglang/srt/``):
``entrypoints/engine.py``, ``managers/scheduler_components/weight_updater.py``,
``entrypoints/http_server.py``; what each says is noted where it is used.
"""
from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import torch.distributed as dist

from mempo.rollout.backends.base import (
    GenerationOutput, GenerationRequest, SamplingParams, named_tensors, register_backend,
)
from mempo.rollout.backends.stopping import STOP_LENGTH, TokenBytes, action_closing_token_ids

__all__ = ["SGLangBackend", "SGLangServerBackend", "SGLangError", "check_status", "sampling_params",
           "outputs_from_results", "weight_buckets", "iter_weight_buckets", "DEFAULT_BUCKET_BYTES", "HTTP_TIMEOUT_S"]

#: Largest bucket of one ``update_weights_from_tensor`` call (bytes).
DEFAULT_BUCKET_BYTES = 512 * 2 ** 20
#: Seconds an HTTP call to an SGLang server may take (a whole generation batch is one call).
HTTP_TIMEOUT_S = 3600.0

Weights = Union[Mapping[str, Any], Iterable[tuple[str, Any]]]


class SGLangError(RuntimeError):
    """SGLang refused or failed a request; the message carries SGLang's own."""


def check_status(result: Any, what: str) -> str:
    """The message of a successful SGLang status; raise `SGLangError` on a failure.

    Accepts ``(success, message)`` (the engine's methods, ``Tuple[bool, str]`` in SGLang's
    ``tokenizer_communicator_mixin.py``), a mapping with ``success`` (HTTP
    replies) or an object with ``success`` / ``message`` attributes (SGLang's output records).
    Anything else is an unexpected reply and raises too."""
    if isinstance(result, (tuple, list)) and len(result) >= 1 and isinstance(result[0], bool):
        ok, message = result[0], (str(result[1]) if len(result) > 1 else "")
    elif isinstance(result, Mapping) and isinstance(result.get("success"), bool):
        ok, message = result["success"], str(result.get("message", ""))
    elif isinstance(getattr(result, "success", None), bool):
        ok, message = result.success, str(getattr(result, "message", ""))
    else:
        raise SGLangError(f"SGLang {what}: unexpected reply {result!r} (expected (success, message))")
    if not ok:
        raise SGLangError(f"SGLang {what} failed: {message}")
    return message


def sampling_params(request: GenerationRequest, sampling: SamplingParams, position: int, *,
                    action_stop_ids: Sequence[int] = (), seed_requests: bool = False) -> dict[str, Any]:
    """SGLang's ``sampling_params`` for one request: ``temperature``, ``top_p``, ``top_k`` (-1 = off),
    ``max_new_tokens``, ``skip_special_tokens=False``, ``no_stop_trim=True``; ``seed`` is sent as
    ``sampling_seed = seed + position`` only with ``seed_requests=True``. Without a tokenizer SGLang
    cannot stop on strings, so ``stop_token_ids`` = the request's stop ids plus every id whose bytes
    hold a whole closing action marker (`action_closing_token_ids`; a marker split over several
    tokens is not seen: the engine generates on and the loop's `cut_round` cuts the output)."""
    params: dict[str, Any] = {
        "max_new_tokens": int(request.max_new_tokens),
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k) if sampling.top_k > 0 else -1,
        "stop_token_ids": sorted(set(request.stop_token_ids) | set(action_stop_ids)),
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if seed_requests and sampling.seed is not None:
        params["sampling_seed"] = int(sampling.seed) + position
    return params


def outputs_from_results(requests: Sequence[GenerationRequest], results: Any) -> list[GenerationOutput]:
    """`GenerationOutput` s from SGLang's per-request result dicts (``output_ids``; a reply without
    them is an error naming ``--skip-tokenizer-init``); a matched stop id the engine trimmed from
    ``output_ids`` is put back. engine.py: ``generate(input_ids=[[...]], sampling_params=[{...}],
    return_logprob=True)`` under ``skip_tokenizer_init=True`` returns one dict per request with
    ``output_ids`` and ``meta_info`` (``finish_reason``: ``{"type": "stop" | "length" | "abort",
    "matched": id}``; ``output_token_logprobs``: one ``(logprob, id, text or None)`` per output id,
    the sampling distribution's log-prob after temperature scaling unless the server sets
    ``SGLANG_RETURN_ORIGINAL_LOGPROB``). The log-probs become ``logprobs`` (None when the reply has
    none, or none for a stop id put back); ids that do not match theirs are an error."""
    if isinstance(results, Mapping):
        results = [results]
    results = list(results)
    if len(results) != len(requests):
        raise SGLangError(f"SGLang returned {len(results)} results for {len(requests)} requests")
    outputs = []
    for request, result in zip(requests, results):
        if not isinstance(result, Mapping) or "output_ids" not in result:
            keys = sorted(result) if isinstance(result, Mapping) else type(result).__name__
            raise SGLangError(f"SGLang returned no 'output_ids' (got {keys}): run the engine/server with "
                              "skip_tokenizer_init (server: --skip-tokenizer-init), token ids in and out")
        ids = [int(t) for t in result["output_ids"]]
        meta = result.get("meta_info") or {}
        entries = meta.get("output_token_logprobs")
        logprobs = None
        if entries is not None:
            if [int(entry[1]) for entry in entries] != ids:
                raise SGLangError(f"SGLang's output_token_logprobs are for other ids than its output_ids "
                                  f"({len(entries)} entries for {len(ids)} ids)")
            logprobs = [float(entry[0]) for entry in entries]
        finish = meta.get("finish_reason") or {}
        kind = finish.get("type") if isinstance(finish, Mapping) else str(finish)
        matched = finish.get("matched") if isinstance(finish, Mapping) else None
        if isinstance(matched, int) and (not ids or ids[-1] != matched) and len(ids) < request.max_new_tokens:
            ids.append(matched)
            logprobs = None  # the engine scored no trimmed stop id
        # SGLang's own reason ("stop", "length", "abort"); the loop's cut decides what the round is
        outputs.append(GenerationOutput(ids, str(kind or STOP_LENGTH), {"meta_info": meta}, logprobs=logprobs))
    return outputs


def iter_weight_buckets(weights: Weights, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[list[tuple[str, Any]]]:
    """``[(name, tensor)]`` cut into consecutive buckets of at most `bucket_bytes` (a larger tensor
    is a bucket of its own); names in the given order. Lazy: a streamed `weights` iterable is read
    one bucket ahead only."""
    current: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in named_tensors(weights):
        nbytes = int(tensor.numel()) * int(tensor.element_size())
        if current and size + nbytes > bucket_bytes:
            yield current
            current, size = [], 0
        current.append((name, tensor))
        size += nbytes
    if current:
        yield current


def weight_buckets(weights: Weights, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[list[tuple[str, Any]]]:
    """Every bucket of `iter_weight_buckets`, as a list."""
    return list(iter_weight_buckets(weights, bucket_bytes))


@register_backend("sglang")
class SGLangBackend:
    """SGLang's offline engine in this process (``skip_tokenizer_init=True``).

    Args:
        model_path: the model directory or hub id for ``sglang.Engine`` (ignored when ``engine`` is
            given).
        tokenizer: the tokenizer (or ``token_table``): its token bytes give the action-closing ids.
        engine: an existing engine object (``sglang.Engine`` started with
            ``skip_tokenizer_init=True``, or an object with the same methods).
        engine_kwargs: extra ``sglang.Engine`` arguments (``mem_fraction_static``, ``dtype``, ...).
        seed_requests: send ``sampling_seed`` per request.
        release_memory: free the engine's GPU memory in `release_memory` (needs an engine started
            with ``enable_memory_saver=True``).
        bucket_bytes: largest ``update_weights_from_tensor`` bucket.
    """

    name = "sglang"
    returns_logprobs = True

    def __init__(self, model_path: Optional[str] = None, tokenizer: Any = None, *, token_table: Any = None,
                 engine: Any = None, engine_kwargs: Optional[dict[str, Any]] = None,
                 seed_requests: bool = False, release_memory: bool = False,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        if tokenizer is None and token_table is None:
            raise ValueError("SGLangBackend needs the tokenizer (or its token_table) to stop rounds")
        if bucket_bytes < 1:
            raise ValueError("bucket_bytes must be >= 1")
        self.token_bytes = TokenBytes.of(token_table if token_table is not None else tokenizer)
        self.action_stop_ids = tuple(action_closing_token_ids(self.token_bytes))
        self.seed_requests = seed_requests
        self.release_memory_enabled = release_memory
        self.bucket_bytes = bucket_bytes
        self.released: set[str] = set()  # memory tags released and not yet resumed
        self.weights_stale = False  # weights released since the last load: generating would be wrong
        self._owns_engine = engine is None
        if engine is None:
            if model_path is None:
                raise ValueError("give model_path (or an existing engine)")
            try:
                import sglang  # reason: heavy optional dependency (GPU installs only, an environment of its own)
            except ImportError as err:
                raise ImportError("SGLangBackend needs the 'sglang' package, in an environment of its own on a GPU "
                                  "machine (pip install '.[sglang]', docs/TRAINING.md \"GPU\"); it is not "
                                  "installed") from err
            kwargs = dict(engine_kwargs or {})
            if kwargs.get("skip_tokenizer_init") is False:
                raise ValueError("SGLangBackend runs the engine with skip_tokenizer_init=True (token ids in/out)")
            kwargs["skip_tokenizer_init"] = True
            engine = sglang.Engine(model_path=model_path, **kwargs)
        self.engine = engine

    def _sampling_params(self, request: GenerationRequest, sampling: SamplingParams, position: int) -> dict:
        return sampling_params(request, sampling, position, action_stop_ids=self.action_stop_ids,
                               seed_requests=self.seed_requests)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        """One ``Engine.generate`` call for the whole batch (SGLang schedules it continuously), with
        ``return_logprob`` (the sampled ids' log-probs)."""
        if not requests:
            return []
        if self.weights_stale:
            raise SGLangError("the engine's weights were released and not loaded again: call sync_weights "
                              "with the trainer's weights before generating")
        if self.released:
            self._resume(sorted(self.released))
        results = self.engine.generate(
            input_ids=[list(r.prompt_ids) for r in requests],
            sampling_params=[self._sampling_params(r, sampling, i) for i, r in enumerate(requests)],
            return_logprob=True,  # the sampled ids' log-probs, for rollout correction (actor.rollout_is)
        )
        return outputs_from_results(requests, results)

    def release_memory(self) -> None:
        """Free the engine's KV cache and weights while the trainer uses the GPU (the trainer calls it
        after each rollout; only with ``release_memory=True`` and an engine that offers
        ``release_memory_occupation``). Generating before the weights are loaded again raises
        `SGLangError` (they would be garbage). engine.py: ``release_memory_occupation(tags)`` /
        ``resume_memory_occupation(tags)`` free and re-allocate the GPU memory (``tags``:
        ``"weights"``, ``"kv_cache"``; needs ``enable_memory_saver=True``); weight_updater.py: it
        asserts the engine is idle, and released weights are not kept (resume re-allocates them)."""
        release = getattr(self.engine, "release_memory_occupation", None)
        if not self.release_memory_enabled or not callable(release):
            return
        tags = [t for t in ("kv_cache", "weights") if t not in self.released]
        if not tags:
            return
        release(tags=tags)
        self.released.update(tags)
        if "weights" in tags:
            self.weights_stale = True

    def _resume(self, tags: Sequence[str]) -> None:
        tags = [t for t in tags if t in self.released]
        if tags:
            self.engine.resume_memory_occupation(tags=list(tags))
            self.released.difference_update(tags)

    def sync_weights(self, weights: Optional[Weights] = None) -> None:
        """Load the trainer's weights through the engine's update session: released weights are
        resumed first; then ``begin_weight_update()``, ``update_weights_from_tensor`` in buckets of at
        most ``bucket_bytes`` (the radix cache flushed with the last: cached prefixes used the old
        weights), ``end_weight_update()`` (also after a failed bucket, so no session stays open; the
        first failure is raised); then the KV cache is resumed. An engine without the session API
        gets the buckets alone; ``None`` is a no-op. weight_updater.py: ``update_weights_from_tensor``
        outside a session answers ``success=False`` ("must run between begin_weight_update() and
        end_weight_update()"); ``begin_weight_update`` refuses a second open session, ``end`` one
        that is not open; ``update_weights_from_disk`` is not session-gated. Each call returns
        ``(success, message)``."""
        if weights is None:
            return
        buckets = iter_weight_buckets(weights, self.bucket_bytes)  # streamed: two buckets held at most
        self._resume(["weights"])
        begin = getattr(self.engine, "begin_weight_update", None)
        session = callable(begin)
        if session:
            check_status(begin(), "begin_weight_update")
        failure: Optional[BaseException] = None
        try:
            bucket, index = next(buckets, None), 0
            while bucket is not None:
                following = next(buckets, None)  # one ahead: the last bucket flushes the cache
                check_status(self.engine.update_weights_from_tensor(named_tensors=bucket,
                                                                    flush_cache=following is None),
                             f"update_weights_from_tensor (bucket {index + 1})")
                bucket, index = following, index + 1
        except BaseException as error:  # close the session, then raise the first failure
            failure = error
        if session:
            try:
                check_status(self.engine.end_weight_update(), "end_weight_update")
            except SGLangError:
                if failure is None:
                    raise
        if failure is not None:
            raise failure
        self.weights_stale = False
        self._resume(["kv_cache"])

    def close(self) -> None:
        """Shut the engine down (only one this backend started)."""
        if self._owns_engine and self.engine is not None:
            self.engine.shutdown()
            self.engine = None


class SGLangServerBackend:
    """An SGLang server over HTTP (started with ``--skip-tokenizer-init``); its memory is its own
    business (no release).

    Args:
        url: the server's base URL (``http://127.0.0.1:30000``).
        tokenizer: the tokenizer (or ``token_table``): its token bytes give the action-closing ids.
        save_weights: ``(weights, directory) -> None`` writing an HF checkpoint the server can load
            (needed for `sync_weights`).
        weights_dir: where the weight versions are written (needed for `sync_weights`).
        model_dir: when given, the server is told to load this checkpoint at once
            (``/update_weights_from_disk``), so it serves exactly the model being trained/evaluated.
        seed_requests: send ``sampling_seed`` per request.
        timeout: seconds per HTTP call.
    The constructor checks that a server answers ``GET /get_model_info`` (`SGLangError` otherwise).
    http_server.py: ``POST /generate`` takes a ``GenerateReqInput`` as JSON (``input_ids``,
    ``sampling_params``); ``POST /update_weights_from_disk`` ``{"model_path": dir}`` answers
    ``{"success", "message", "num_paused_requests"}`` (HTTP 400 on failure).
    """

    name = "sglang-server"
    returns_logprobs = True

    def __init__(self, url: str, tokenizer: Any = None, *, token_table: Any = None,
                 save_weights: Optional[Callable[[Weights, Path], None]] = None,
                 weights_dir: Union[str, Path, None] = None, model_dir: Union[str, Path, None] = None,
                 seed_requests: bool = False, timeout: float = HTTP_TIMEOUT_S) -> None:
        if tokenizer is None and token_table is None:
            raise ValueError("SGLangServerBackend needs the tokenizer (or its token_table) to stop rounds")
        self.url = url.rstrip("/")
        self.token_bytes = TokenBytes.of(token_table if token_table is not None else tokenizer)
        self.action_stop_ids = tuple(action_closing_token_ids(self.token_bytes))
        self.save_weights = save_weights
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self.seed_requests = seed_requests
        self.timeout = float(timeout)
        self.version = 0
        self._loaded: Optional[Path] = None
        self.model_info = self._call("GET", "/get_model_info", None, timeout=min(self.timeout, 30.0))
        if model_dir is not None:
            self.load_from_disk(model_dir)

    # -- HTTP --------------------------------------------------------------------------------------
    def _call(self, method: str, path: str, payload: Any, *, timeout: Optional[float] = None) -> Any:
        data = json.dumps(payload).encode("utf-8") if payload is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as error:
            body = error.read()
            try:
                reply = json.loads(body)
            except ValueError:
                reply = None
            if isinstance(reply, Mapping) and "success" in reply:
                return reply  # a status reply with success False: check_status raises with its message
            detail = reply.get("error", reply) if isinstance(reply, Mapping) else body[:500].decode("utf-8", "replace")
            raise SGLangError(f"SGLang server {self.url}{path}: HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as error:
            raise SGLangError(f"no SGLang server answers at {self.url} ({method} {path}: {error})") from None
        try:
            return json.loads(body)
        except ValueError:
            raise SGLangError(f"SGLang server {self.url}{path}: not JSON: {body[:200]!r}") from None

    # -- backend interface ---------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        """One ``POST /generate`` for the whole batch (``return_logprob``: the sampled ids' log-probs)."""
        if not requests:
            return []
        payload = {
            "input_ids": [[int(t) for t in r.prompt_ids] for r in requests],
            "sampling_params": [sampling_params(r, sampling, i, action_stop_ids=self.action_stop_ids,
                                                seed_requests=self.seed_requests) for i, r in enumerate(requests)],
            "return_logprob": True,
        }
        return outputs_from_results(requests, self._call("POST", "/generate", payload))

    def load_from_disk(self, model_dir: Union[str, Path]) -> str:
        """``POST /update_weights_from_disk`` with `model_dir` (checked); returns SGLang's message."""
        reply = self._call("POST", "/update_weights_from_disk", {"model_path": str(Path(model_dir).resolve())})
        return check_status(reply, f"update_weights_from_disk({model_dir})")

    def sync_weights(self, weights: Optional[Weights] = None) -> None:
        """Write the weights as an HF checkpoint into a fresh ``<weights_dir>/v<n>`` and ``POST
        /update_weights_from_disk``; the previous version's directory is removed once the server has
        loaded the new one. Under torch.distributed only rank 0 writes and posts, then every rank
        waits at a barrier (no rank generates with old weights). The directory must be readable by
        the server (same machine or shared file system)."""
        if weights is None:
            return
        distributed = dist.is_available() and dist.is_initialized()
        if not distributed or dist.get_rank() == 0:
            if self.save_weights is None or self.weights_dir is None:
                raise ValueError("SGLangServerBackend.sync_weights needs save_weights and weights_dir")
            self.version += 1
            target = self.weights_dir / f"v{self.version:06d}"
            if target.exists():
                shutil.rmtree(target)
            self.save_weights(weights, target)
            self.load_from_disk(target)
            previous, self._loaded = self._loaded, target
            if previous is not None and previous != target:
                shutil.rmtree(previous, ignore_errors=True)
        if distributed:
            dist.barrier()

    def close(self) -> None:
        """Nothing to shut down (the server is not ours)."""
