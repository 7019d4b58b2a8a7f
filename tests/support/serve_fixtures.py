"""Helpers for the agent-server tests (tests/serve, tests/apps, tests/test_no_gold.py, bench/bench_serve.py).

* `needle_backend(tok)`: a `ScriptedBackend` answering "Which document mentions zebulon<i>?" as an
  oracle-like agent does (`support.rollout_fixtures.needle_scripts`): one search (two for i = 7),
  then the answer "Needle i". It reads the needle off the request's own prompt (the question), so
  any caller (the agent service, `mempo eval`) gets the same rounds for the same question.
* `GatedBackend`: a backend wrapper whose ``generate`` waits until the test opens its gate
  (``entered`` is set once a call is waiting), to hold requests in flight.
* `FailingBackend`: a backend whose ``generate`` raises (the first `failures` calls).
* `question(i)`: the question of needle i.
"""
from __future__ import annotations

import re
import threading

from mempo.rollout.backends import ScriptedBackend
from mempo.utils.tokens import decode_ids, encode_text
from support.rollout_fixtures import needle_scripts

_NEEDLE = re.compile(r"mentions zebulon(\d+)\?")
TWO_SEARCHES = 7  # the needle whose episode searches twice


def question(needle: int) -> str:
    return f"Which document mentions zebulon{needle}? Give its title."


def needle_backend(tok) -> ScriptedBackend:
    def respond(request):
        found = _NEEDLE.search(decode_ids(tok, request.prompt_ids))
        if found is None:  # not a needle question: end the turn
            return list(request.stop_token_ids[:1])
        needle = int(found.group(1))
        rounds = needle_scripts(needle, extra_search=needle == TWO_SEARCHES)
        index = min(request.key.round_index, len(rounds) - 1)
        return encode_text(tok, rounds[index])

    return ScriptedBackend(respond, tok)


class GatedBackend:
    """Forwards to `inner` once ``gate`` is set; ``entered`` is set when a call waits at the gate."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, "gated"
        self.gate, self.entered = threading.Event(), threading.Event()

    def generate(self, requests, sampling):
        self.entered.set()
        self.gate.wait(60)
        return self.inner.generate(requests, sampling)

    def sync_weights(self, weights=None) -> None:
        """Nothing to load."""


class FailingBackend:
    """Raises RuntimeError in its first `failures` calls, then forwards to `inner`."""

    def __init__(self, inner, failures: int = 1) -> None:
        self.inner, self.failures, self.name = inner, failures, "failing"

    def generate(self, requests, sampling):
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("the GPU fell off the bus")
        return self.inner.generate(requests, sampling)

    def sync_weights(self, weights=None) -> None:
        """Nothing to load."""
