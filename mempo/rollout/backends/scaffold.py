"""The answer-blind protocol scaffold (`ProtocolScaffold`): a transformers logits processor that shapes
each round of a random (or barely trained) model into a well-formed protocol turn (HF backend).

Conventions: an explicit opt-in (``rollout.protocol_scaffold: true``, default off) for tests and tiny
demos; real models follow the protocol themselves. It is never told the episodes or their gold
answers: its only input is each request's prompt ids, and `context_candidates` (a pure function of
the round's prompt text) is its whole view of a round. Every token, forced or free, is a real
generated token, scored by the actor like any other.
"""
from __future__ import annotations

import re
from typing import Any, Optional, Sequence

import torch

from mempo.protocol.tags import TAG_SET, TagSet
from mempo.rollout.backends.stopping import TokenBytes
from mempo.utils.tokens import decode_ids

__all__ = ["context_candidates", "ProtocolScaffold"]

_RESULT_BLOCKS: dict[str, "re.Pattern[str]"] = {}
_WORD = re.compile(r"[\w'-]+")
_WORD_GAP = re.compile(r"\s+")


def context_candidates(text: str, *, max_words: int = 4, limit: int = 32,
                       result_tag: str = "information") -> list[str]:
    """The answer strings `ProtocolScaffold` lets the model choose from, given a round's prompt text.

    Only text inside ``<information>...</information>`` blocks (``result_tag``: the protocol's
    tool-result tag) counts (the tool results the agent read in this trajectory's context), in
    order. In each block, the words (maximal runs of letters, digits, ``'`` and ``-``) are grouped
    into maximal runs of consecutive words that start with an upper-case letter or a digit and are
    separated by white space only (any other character ends a run); runs of at most `max_words`
    words are candidates ("Cousko Stozofal", "1798", "Doc 1"). Duplicates are dropped (first
    appearance kept); at most `limit` are returned.
    A pure function of `text`: nothing else (no episode, no gold answer) goes in.
    """
    found: list[str] = []
    seen: set[str] = set()
    pattern = _RESULT_BLOCKS.get(result_tag)
    if pattern is None:
        pattern = _RESULT_BLOCKS[result_tag] = re.compile(f"<{re.escape(result_tag)}>(.*?)</{re.escape(result_tag)}>",
                                                          re.S)
    for block in pattern.findall(text):
        run: list[str] = []
        last_end = None
        for match in list(_WORD.finditer(block)) + [None]:
            word = match.group(0) if match is not None else ""
            joined = (match is not None and last_end is not None
                      and _WORD_GAP.fullmatch(block[last_end:match.start()]) is not None)
            capital = bool(word) and (word[0].isupper() or word[0].isdigit())
            if run and not (capital and joined):
                if len(run) <= max_words:
                    candidate = " ".join(run)
                    if candidate not in seen:
                        seen.add(candidate)
                        found.append(candidate)
                        if len(found) >= limit:
                            return found
                run = []
            if capital:
                run.append(word)
            last_end = match.end() if match is not None else None
    return found


class ProtocolScaffold:
    """A logits processor shaping each round into a well-formed protocol turn, answer-blind.

    Without it, a random model's every rollout would end after one malformed round. Each round is

        <mem>[free x mem_tokens]</mem>\\n<think>\\n[free x think_tokens]\\n</think>\\n
          rounds < turns-1:  <search>[free x query_tokens]</search>
          last round:        <answer>{answer}</answer>

    Tags are forced; "free" tokens are sampled from the model, with tokens whose bytes contain ``<``
    or ``>`` and the special tokens banned, and a mem's first token holding a non-space byte (so
    every ``<mem>`` is well formed and non-blank). The answer is one to ``max_parts`` of the round's
    `context_candidates` joined by ``"; "``: at each answer position only the next tokens of the
    candidates still consistent with what was generated (or the separator / the closing tag where a
    candidate is complete) are allowed, so which string the model answers is its own (learnable)
    probability. With no candidate in the context the answer is ``query_tokens`` free tokens.

    With another tool call (`action`: its forced opening and closing text, e.g. ``<tool_call>{"name":
    "lookup", "arguments": {"key": "`` and ``"}}</tool_call>`` in the json format; `for_tools` builds them)
    the ``<search>`` / ``</search>`` above are those, the candidates are read from ``result_tag`` blocks,
    and with ``json_arguments`` the free query tokens hold no ``"``, ``\\`` or control character (the call
    stays valid JSON).

    Args:
        tokenizer: the policy's tokenizer.
        turns: rounds per trajectory (tool calls in rounds 1..turns-1, the answer in round `turns`).
        mem_tokens / think_tokens / query_tokens: free tokens of each segment.
        max_parts: most candidates one answer may join with "; " (multi-objective episodes).
        max_words / max_candidates: `context_candidates` settings.
    `begin(requests)` is called by `HFBackend` before each ``generate`` chunk (rows in request
    order); it reads only each request's round index and prompt ids. The per-chunk state
    (``rows``) is replaced at every call, so it never holds another request's candidates.
    """

    def __init__(self, tokenizer: Any, turns: int = 3, *, mem_tokens: int = 8, think_tokens: int = 4,
                 query_tokens: int = 3, max_parts: int = 4, max_words: int = 4, max_candidates: int = 32,
                 action: tuple[str, str] = ("<search>", "</search>"), result_tag: str = "information",
                 json_arguments: bool = False):
        if turns < 1:
            raise ValueError("turns must be >= 1")
        if max_parts < 1:
            raise ValueError("max_parts must be >= 1")
        self.tokenizer = tokenizer
        self.turns = turns
        pieces = TokenBytes.of(tokenizer).pieces
        vocab = max(len(tokenizer), len(pieces))
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        banned = [i for i in range(vocab) if i >= len(pieces) or i in special or not pieces[i]
                  or b"<" in pieces[i] or b">" in pieces[i]]
        self.banned = torch.tensor(sorted(set(banned)), dtype=torch.long)
        blank = [i for i in range(len(pieces)) if pieces[i] and not pieces[i].strip()]
        self.banned_first = torch.tensor(sorted(set(banned) | set(blank)), dtype=torch.long)
        # inside a JSON string: no quote, no backslash, no control character
        quoting = [i for i in range(len(pieces)) if b'"' in pieces[i] or b"\\" in pieces[i]
                   or any(byte < 0x20 for byte in pieces[i])] if json_arguments else []
        self.banned_query = torch.tensor(sorted(set(banned) | set(blank) | set(quoting)), dtype=torch.long)
        self.action, self.result_tag, self.json_arguments = action, result_tag, json_arguments
        self.sizes = (mem_tokens, think_tokens, query_tokens)
        self.max_parts = max_parts
        self.max_words = max_words
        self.max_candidates = max_candidates
        self.rows: list[Optional[list]] = []
        self.width: Optional[int] = None
        self._fixed_plans: dict[int, list] = {}

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @classmethod
    def for_tools(cls, tokenizer: Any, turns: int, tools: Any, tags: TagSet = TAG_SET) -> "ProtocolScaffold":
        """The scaffold of a run whose first tool (``tools``: a `mempo.tools.Toolset` or `Tool` s) is the
        one it calls, in the run's format (`tags`): ``<name>`` free ``</name>``, or a JSON call with the
        free tokens as the value of the tool's first (required) argument."""
        first = next(iter(tools.tools.values() if hasattr(tools, "tools") else tools), None)
        if first is None:
            raise ValueError("the protocol scaffold calls a tool in every round but the last, and there is none")
        if tags.call_tag is None:
            return cls(tokenizer, turns, action=(f"<{first.name}>", f"</{first.name}>"), result_tag=tags.tool_result)
        schema = first.parameters
        argument = next(iter(list(schema.get("required", [])) + list(schema.get("properties", {}))), None)
        call = f'<{tags.call_tag}>{{"name": "{first.name}", "arguments": {{'
        action = (call + f'"{argument}": "', '"}}' + f"</{tags.call_tag}>") if argument is not None \
            else (call + "}}", f"</{tags.call_tag}>")
        return cls(tokenizer, turns, action=action, result_tag=tags.tool_result, json_arguments=True,
                   query_tokens=3 if argument is not None else 0)

    def candidates(self, prompt_ids: Sequence[int]) -> list[str]:
        """`context_candidates` of the prompt's text (decoded with special tokens kept)."""
        return context_candidates(decode_ids(self.tokenizer, prompt_ids), max_words=self.max_words,
                                  limit=self.max_candidates, result_tag=self.result_tag)

    def plan(self, round_index: int, prompt_ids: Sequence[int] = ()) -> list:
        """The segment plan of one round: ("free", n, first_banned), ("force", ids) and, in the
        last round, ("answer", [candidate ids], separator ids, closing ids, max_parts)."""
        last = min(round_index, self.turns - 1) == self.turns - 1
        if not last and round_index in self._fixed_plans:
            return self._fixed_plans[round_index]
        mem, think, query = self.sizes
        segments: list = [("free", mem, True), ("force", self._encode("</mem>\n<think>\n")), ("free", think, False)]
        if not last:
            opening, closing = self.action
            segments += [("force", self._encode("\n</think>\n" + opening))]
            segments += [("free", query, "query" if self.json_arguments else True)] if query else []
            segments += [("force", self._encode(closing))] if closing else []
            self._fixed_plans[round_index] = segments
            return segments
        segments.append(("force", self._encode("\n</think>\n<answer>")))
        options = [ids for ids in (self._encode(c) for c in self.candidates(prompt_ids)) if ids]
        if options:
            segments.append(("answer", options, self._encode("; "), self._encode("</answer>"), self.max_parts))
        else:
            segments += [("free", query, True), ("force", self._encode("</answer>"))]
        return segments

    def begin(self, requests: Sequence[Any]) -> None:
        """The plans of one ``generate`` chunk's rows, from each request's round and prompt ids."""
        self.rows, self.width = [], None
        for request in requests:
            key = request.key
            if key is None:
                self.rows.append(None)
                continue
            context = request.prompt_ids[:len(request.prompt_ids) - request.prefix_len]
            self.rows.append(self.plan(key.round_index, context))

    @staticmethod
    def _answer_allowed(segment: tuple, generated: list[int]) -> Optional[list[int]]:
        """Allowed next ids of an answer segment after `generated` (its ids so far); None once the
        closing tag is complete. States: ("c", candidate, k, part), ("s", k, part), ("e", k)."""
        _, options, sep, close, max_parts = segment

        def closure(states):
            out, todo = set(), list(states)
            while todo:
                state = todo.pop()
                if state in out:
                    continue
                out.add(state)
                if state[0] == "c" and state[2] == len(options[state[1]]):
                    if state[3] < max_parts:
                        todo.append(("s", 0, state[3]))
                    todo.append(("e", 0))
                elif state[0] == "s" and state[1] == len(sep):
                    todo.extend(("c", i, 0, state[2] + 1) for i in range(len(options)))
            return out

        def expected(state):
            if state[0] == "c":
                ids = options[state[1]]
                return ids[state[2]] if state[2] < len(ids) else None
            ids = sep if state[0] == "s" else close
            return ids[state[1]] if state[1] < len(ids) else None

        states = closure(("c", i, 0, 1) for i in range(len(options)))
        for token in generated:
            advanced = []
            for state in states:
                if expected(state) == token:
                    advanced.append(state[:-2] + (state[-2] + 1, state[-1]) if state[0] != "e"
                                    else ("e", state[1] + 1))
            states = closure(advanced)
            if any(s[0] == "e" and s[1] == len(close) for s in states) or not states:
                return None
        return sorted({t for t in (expected(s) for s in states) if t is not None})

    @classmethod
    def _constraint(cls, plan: list, generated: list[int]):
        """("free", first_banned) | ("allow", [ids]) | None (plan done) for the next token."""
        pos, n = 0, len(generated)
        for segment in plan:
            kind = segment[0]
            if kind == "free":
                if n - pos < segment[1]:
                    return ("free", "query" if segment[2] == "query" else (segment[2] and n == pos))
                pos += segment[1]
            elif kind == "force":
                k = n - pos
                if k < len(segment[1]):
                    return ("allow", [segment[1][k]])
                pos += len(segment[1])
            else:  # answer: the last segment
                allowed = cls._answer_allowed(segment, generated[pos:])
                return ("allow", allowed) if allowed else None
        return None

    def __call__(self, input_ids, scores):
        """Mask ``scores`` [rows, V] (float) in place to each row's constraint on its next token
        (banned ids -inf, or only the allowed ids kept); ``input_ids`` [rows, T] int64."""
        if self.width is None:
            self.width = input_ids.shape[1]
        new = input_ids[:, self.width:].tolist()
        for row, plan in enumerate(self.rows):
            if plan is None or row >= scores.shape[0]:
                continue
            constraint = self._constraint(plan, new[row])
            if constraint is None:
                continue
            if constraint[0] == "free":
                banned = self.banned_query if constraint[1] == "query" else \
                    self.banned_first if constraint[1] else self.banned
                scores[row, banned] = float("-inf")
            else:
                keep = scores[row, constraint[1]].clone()
                if not bool(torch.isfinite(keep).any()):
                    keep = torch.zeros_like(keep)
                scores[row] = float("-inf")
                scores[row, constraint[1]] = keep
        return scores
