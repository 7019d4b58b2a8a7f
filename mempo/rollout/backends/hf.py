"""`HFBackend`: generation with a transformers causal LM (CPU or GPU), token ids in and out.

The returned ids are exactly the sampled ones (padding stripped); the model runs in eval mode
during ``generate`` (its mode restored), so a model shared with the trainer samples without dropout.
Each output carries the log-prob of every returned id, read off the generation scores as they are
computed (`_SampledLogProbs`: one ``[rows, V]`` log-softmax held at a time, never the whole score
history): the model's own ``log softmax(logits / T)``, before the backend's logits processors (the
protocol scaffold) and top-k / top-p, as the trainer computes log-probs.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import torch

from mempo.rollout.backends.base import (
    GenerationOutput, GenerationRequest, SamplingParams, named_tensors, register_backend,
)
from mempo.protocol.tags import TAG_SET
from mempo.rollout.backends.stopping import STOP_ACTION, STOP_EOS, STOP_LENGTH, ActionStopScanner, TokenBytes

__all__ = ["HFBackend", "load_weights_into"]

_STOP_CLASS = None


def _round_stop_class():
    """A transformers ``StoppingCriteria`` subclass, built on first use."""
    global _STOP_CLASS
    if _STOP_CLASS is not None:
        return _STOP_CLASS
    # reason: transformers is optional (the test/demo extras) and `import mempo.rollout.backends` stays without it
    from transformers import StoppingCriteria

    class RoundStop(StoppingCriteria):
        """Per-row stop: action closed, stop id, or the row's own max_new_tokens."""

        def __init__(self, requests: Sequence[GenerationRequest], token_bytes: TokenBytes, prompt_width: int,
                     extra_stops: Sequence[int] = ()):
            self.token_bytes = token_bytes
            self.prompt_width = prompt_width
            self.max_new = [r.max_new_tokens for r in requests]
            self.stops = [frozenset(r.stop_token_ids) | frozenset(extra_stops) for r in requests]
            self.scanners = []
            for request in requests:
                scanner = ActionStopScanner(request.tags or TAG_SET)
                prefix = request.prompt_ids[len(request.prompt_ids) - request.prefix_len:]
                scanner.feed(token_bytes.join(prefix))
                self.scanners.append(scanner)
            self.lengths: list[Optional[int]] = [None] * len(requests)
            self.reasons: list[str] = [STOP_LENGTH] * len(requests)

        def __call__(self, input_ids, scores, **kwargs):
            step = input_ids.shape[1] - self.prompt_width
            last = input_ids[:, -1].tolist()
            done = []
            for row, token in enumerate(last):
                if self.lengths[row] is None:
                    if self.scanners[row].feed(self.token_bytes[token]):
                        self.lengths[row], self.reasons[row] = step, STOP_ACTION
                    elif token in self.stops[row]:
                        self.lengths[row], self.reasons[row] = step, STOP_EOS
                    elif step >= self.max_new[row]:
                        self.lengths[row], self.reasons[row] = step, STOP_LENGTH
                done.append(self.lengths[row] is not None)
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    _STOP_CLASS = RoundStop
    return RoundStop


class _SampledLogProbs:
    """A transformers logits processor (first in the list) that records the log-prob of every id the
    rows sample: at each step it keeps ``log softmax(scores / T)`` of the step and, at the next step
    (or in `finish`), reads the id that was sampled from it. Returns the scores unchanged."""

    def __init__(self, temperature: float) -> None:
        self.temperature = float(temperature) if temperature > 0 else 1.0  # greedy: the raw distribution
        self.previous: Optional[torch.Tensor] = None
        self.values: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.values.append(self.previous.gather(1, input_ids[:, -1:])[:, 0])
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """[rows, new ids] float32 on the CPU: the log-prob of each sampled id, in order."""
        if self.previous is not None:
            self.values.append(self.previous.gather(1, sequences[:, -1:].to(self.previous.device))[:, 0])
            self.previous = None
        if not self.values:
            return torch.zeros((sequences.shape[0], 0))
        return torch.stack(self.values, dim=1).cpu()


@register_backend("hf")
class HFBackend:
    """transformers generation behind the backend interface.

    Args:
        model: a causal LM (``model.generate``); put it on its device before.
        tokenizer: the tokenizer (or pass ``token_table``): its token bytes drive stop detection and
            its pad/EOS ids the padding.
        token_table: a :class:`mempo.ops.spans.TokenTable` or :class:`TokenBytes` (instead of the
            tokenizer).
        pad_token_id: padding id (default: the tokenizer's pad id, else its EOS id, else 0).
        max_batch_size: rows per ``generate`` call (``None``: all requests at once).
        logits_processors: extra transformers ``LogitsProcessor`` s applied at every step. One with a
            ``begin(requests)`` method is given each chunk's requests first (rows in batch order),
            e.g. `mempo.rollout.backends.scaffold.ProtocolScaffold`; the requests carry prompt ids
            and round keys only (never a gold).
    """

    name = "hf"
    returns_logprobs = True

    def __init__(self, model: Any, tokenizer: Any = None, *, token_table: Any = None,
                 pad_token_id: Optional[int] = None, max_batch_size: Optional[int] = None,
                 logits_processors: Sequence[Any] = ()) -> None:
        if tokenizer is None and token_table is None:
            raise ValueError("HFBackend needs the tokenizer (or its token_table) to detect the end of a round")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1 or None")
        self.model = model
        self.tokenizer = tokenizer
        self.token_bytes = TokenBytes.of(token_table if token_table is not None else tokenizer)
        if pad_token_id is None and tokenizer is not None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
            if pad_token_id is None:
                pad_token_id = getattr(tokenizer, "eos_token_id", None)
        self.pad_token_id = int(pad_token_id) if pad_token_id is not None else 0
        self.max_batch_size = max_batch_size
        self.logits_processors = list(logits_processors)

    @property
    def device(self):
        return next(self.model.parameters()).device

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        """New ids per request, in order; one ``model.generate`` per chunk.

        Requests are sorted by prompt length and cut into chunks of ``max_batch_size`` rows, left
        padded with an attention mask. A row stops after the token that closes an action block
        (`ActionStopScanner` on each new token's bytes), at the request's stop ids (and the model's
        ``generation_config`` EOS ids, which transformers applies anyway; the loop treats an id that
        is not one of its stop ids as an ordinary last token) or at its ``max_new_tokens``.
        Sampling: temperature 0 is greedy, else multinomial with temperature / top-p / top-k (0
        disables top-k); ``seed`` seeds torch inside ``torch.random.fork_rng`` (the caller's RNG
        state is untouched), so a call is reproducible on one machine.
        """
        if not requests:
            return []
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        size = self.max_batch_size or len(order)
        outputs: list[Optional[GenerationOutput]] = [None] * len(requests)
        device = self.device
        devices = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        was_training = bool(getattr(self.model, "training", False))
        self.model.eval()  # no dropout while sampling, even when the trainer shares the model
        try:
            with torch.random.fork_rng(devices=devices):
                if sampling.seed is not None:
                    torch.manual_seed(int(sampling.seed))
                for begin in range(0, len(order), size):
                    chunk = order[begin:begin + size]
                    for index, output in zip(chunk, self._generate_chunk([requests[i] for i in chunk], sampling)):
                        outputs[index] = output
        finally:
            self.model.train(was_training)
        return outputs  # type: ignore[return-value]

    def _generate_chunk(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        # reason: as in `_round_stop_class`
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        device = self.device
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, request in enumerate(requests):
            n = len(request.prompt_ids)
            input_ids[row, width - n:] = torch.tensor(request.prompt_ids, dtype=torch.long)
            attention_mask[row, width - n:] = 1
        # transformers also stops rows at the model's own generation_config EOS ids: stop there too
        model_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        model_eos = [model_eos] if isinstance(model_eos, int) else [int(t) for t in (model_eos or [])]
        stop_ids = sorted({t for r in requests for t in r.stop_token_ids} | set(model_eos))
        options: dict[str, Any] = dict(
            max_new_tokens=max(r.max_new_tokens for r in requests),
            pad_token_id=self.pad_token_id,
            eos_token_id=stop_ids or None,
            do_sample=not sampling.greedy,
        )
        if not sampling.greedy:
            options.update(temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                           top_k=int(sampling.top_k) if sampling.top_k > 0 else 0)
        config = GenerationConfig(**options)
        criteria = _round_stop_class()(requests, self.token_bytes, width, model_eos)
        recorder = _SampledLogProbs(sampling.temperature)
        for processor in self.logits_processors:
            begin = getattr(processor, "begin", None)
            if callable(begin):
                begin(requests)
        with torch.inference_mode():
            sequences = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=config,
                stopping_criteria=StoppingCriteriaList([criteria]),
                logits_processor=LogitsProcessorList([recorder, *self.logits_processors]),
                # FSDP2-managed modules turn synced_gpus on (one all-reduce per token, a hang when ranks
                # generate a different number of times); the trainer generates on gathered weights
                synced_gpus=False,
            )
        if not isinstance(sequences, torch.Tensor):  # a ModelOutput when a config asks for a dict
            sequences = sequences.sequences
        new = sequences[:, width:].tolist()
        logprobs = recorder.finish(sequences).tolist()
        outputs = []
        for row, request in enumerate(requests):
            length = criteria.lengths[row]
            if length is None:  # generation ended for another reason (e.g. the model's max length)
                length = min(len(new[row]), request.max_new_tokens)
            outputs.append(GenerationOutput(new[row][:length], criteria.reasons[row], logprobs=logprobs[row][:length]))
        return outputs

    def sync_weights(self, weights: Union[None, Mapping[str, Any], Iterable[tuple[str, Any]]] = None) -> None:
        """Copy trainer weights (names of ``model.state_dict()``) into the model in place
        (`load_weights_into`); tensors that already are the model's storage are skipped; ``None``
        is a no-op (the trainer shares the model object)."""
        if weights is not None:
            load_weights_into(self.model, weights)

    def close(self) -> None:
        """Nothing to release (the model belongs to the caller)."""


def load_weights_into(model: Any, weights: Union[Mapping[str, Any], Iterable[tuple[str, Any]]]) -> None:
    """Copy ``{name: tensor}`` (or ``[(name, tensor)]``, names of ``model.state_dict()``) into
    `model`'s own tensors in place, converting device and dtype; a tensor that already is the
    model's storage is skipped. KeyError for an unknown name, ValueError for a shape mismatch."""
    own = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, tensor in named_tensors(weights):
            target = own.get(name)
            if target is None:
                raise KeyError(f"sync_weights: the model has no tensor named {name!r}")
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(f"sync_weights: {name} has shape {tuple(tensor.shape)}, the model's is "
                                 f"{tuple(target.shape)}")
            if target.data_ptr() == tensor.data_ptr() and target.device == tensor.device:
                continue  # the trainer's tensor is this model's own storage
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
