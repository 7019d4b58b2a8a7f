"""`OracleBackend`: the rule-based oracle agent (`mempo.synthetic.oracle.OracleAgent`) behind the
generation-backend interface.

It plays the oracle as a policy: the upper bound of a policy on the synthetic world, and the
reference for the tests (it cannot answer QA-file questions: it reads the synthetic world's question
forms). Each request's prompt (ChatML: the built-in template or an equal tokenizer template) is
decoded back into chat messages; the oracle answers the round; the forced prefix the prompt already
ends with is dropped and the rest is returned as ids (up to the request's ``max_new_tokens``).
Sampling parameters are ignored: the oracle is deterministic.
"""
from __future__ import annotations

import re
from typing import Any, Optional, Sequence

from mempo.protocol.memory import MEM_PREFIX
from mempo.rollout.backends.base import GenerationOutput, GenerationRequest, SamplingParams
from mempo.synthetic.oracle import OracleAgent
from mempo.utils.tokens import decode_ids, encode_text

__all__ = ["OracleBackend"]

_CHATML_MESSAGE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>\n?", re.S)


class OracleBackend:
    """The oracle as a generation backend: each prompt decoded back into chat messages, the oracle's
    round returned as ids without the forced prefix (up to ``max_new_tokens``); deterministic.

    Args:
        tokenizer: the tokenizer the prompts are decoded and the answers encoded with.
        max_turns: the oracle's turn limit (when no `agent` is given).
        agent: the agent answering each round (default ``OracleAgent(max_turns=max_turns)``); any
            object with ``respond(messages) -> str``.
        forced_prefix: the prefix every request's prompt ends with (dropped from the answer).
    """

    name = "oracle"

    def __init__(self, tokenizer: Any, *, max_turns: int = 64, agent: Optional[Any] = None,
                 forced_prefix: str = MEM_PREFIX):
        self.tokenizer = tokenizer
        self.agent = agent or OracleAgent(max_turns=max_turns)
        self.forced_prefix = forced_prefix

    def messages(self, prompt_ids: Sequence[int]) -> list[dict[str, str]]:
        """The chat messages of a ChatML prompt."""
        text = decode_ids(self.tokenizer, prompt_ids)
        return [{"role": role, "content": content} for role, content in _CHATML_MESSAGE.findall(text)]

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        outputs = []
        for request in requests:
            context = request.prompt_ids[:len(request.prompt_ids) - request.prefix_len]
            text = self.agent.respond(self.messages(context))
            if self.forced_prefix and text.startswith(self.forced_prefix):
                text = text[len(self.forced_prefix):]
            ids = encode_text(self.tokenizer, text)[:request.max_new_tokens]
            outputs.append(GenerationOutput(ids, "action"))
        return outputs

    def sync_weights(self, weights: Any = None) -> None:
        """Nothing to copy (the oracle has no weights)."""

    def close(self) -> None:
        """Nothing to release."""
