"""The agent's record list and the two context policies that turn it into chat messages.

An `AgentMemory` is an append-only list of `Record` s: record 0 is the question (``"prompt"``),
then the assistant turns (``"llm_gen"``) and the tool results (``"search_results"`` from
``<search>``, ``"webpage"`` from ``<access>``) in the order they happened. Every record has a
``short_text`` (tool results: what `ShortTextPolicy` makes of them). Messages are
``{"role", "content"}`` dicts (`AgentMemory.messages`). Departures from the reference are on
purpose (ALGORITHM.md section 2) and noted where they are made.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = [
    "RECORD_TYPES",
    "TOOL_RECORD_TYPES",
    "CONTEXT_POLICIES",
    "DEFAULT_SYSTEM_PROMPT",
    "MEM_PREFIX",
    "DEFAULT_CUT_NOTICE",
    "Record",
    "ShortTextPolicy",
    "AgentMemory",
]

RECORD_TYPES = ("prompt", "llm_gen", "search_results", "webpage")
TOOL_RECORD_TYPES = ("search_results", "webpage")
CONTEXT_POLICIES = ("memory", "full")
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
MEM_PREFIX = "<mem>"
DEFAULT_CUT_NOTICE = "\n[... shortened: the first {shown} of {total} characters are shown]\n"



@dataclass(frozen=True)
class Record:
    """One entry of the memory: ``type`` in :data:`RECORD_TYPES`, the full ``text`` and the
    ``short_text`` shown by the memory policy."""

    type: str
    text: str
    short_text: str

    def __post_init__(self) -> None:
        if self.type not in RECORD_TYPES:
            raise ValueError(f"record type must be one of {RECORD_TYPES}, got {self.type!r}")


@dataclass(frozen=True)
class ShortTextPolicy:
    """What a tool result's ``short_text`` is, per record type.

    ``search_results_chars`` / ``webpage_chars``: keep the first that many characters of the
    content (``None``: the whole text, no cut). Defaults follow the reference: search results
    whole, web pages 100 characters. When the text is wrapped in ``<information>...</information>``
    (white space around it allowed) the cut applies to the content inside, which is then wrapped
    again. A text no longer than the limit is kept whole. ``cut_notice`` is appended to the kept
    content when something was cut; its ``{shown}`` and ``{total}`` fields are the kept and total
    content lengths in characters; ``None`` appends nothing (the reference's silent cut; the
    visible cut and the re-wrapping, as ASearcher does for web pages, are departures on purpose:
    a short text never leaves an ``<information>`` block open).
    ``result_tag``: the protocol's tool-result tag whose block a cut text is re-wrapped in
    (``information``; ``tool_response`` in the json format: the rollout sets it).
    ``newest_tool_result``: under the memory policy, the newest tool result is shown as its
    short text (``"short"``, the reference as ALGORITHM.md §2 and the seed notes describe it) or
    whole (``"full"``, as ASearcher's public agent shows a fresh result once; with "short" a page
    read by ``<access>`` is cut to ``webpage_chars`` before the agent ever sees it whole).
    """

    search_results_chars: Optional[int] = None
    webpage_chars: Optional[int] = 100
    cut_notice: Optional[str] = DEFAULT_CUT_NOTICE
    newest_tool_result: str = "short"
    result_tag: str = "information"

    def __post_init__(self) -> None:
        for name in ("search_results_chars", "webpage_chars"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value}")
        if self.newest_tool_result not in ("short", "full"):
            raise ValueError(f"newest_tool_result must be 'short' or 'full', got {self.newest_tool_result!r}")

    def limit(self, record_type: str) -> Optional[int]:
        """The character limit for a record type (``None``: no cut; never cut non-tool records)."""
        if record_type == "search_results":
            return self.search_results_chars
        if record_type == "webpage":
            return self.webpage_chars
        return None

    def short_text(self, record_type: str, text: str) -> str:
        """The short text of a record of ``record_type`` whose full text is ``text``."""
        limit = self.limit(record_type)
        if limit is None:
            return text
        stripped = text.strip()
        opening, closing = f"<{self.result_tag}>", f"</{self.result_tag}>"
        wrapped = stripped.startswith(opening) and stripped.endswith(closing) and len(
            stripped) >= len(opening) + len(closing)
        content = stripped[len(opening):len(stripped) - len(closing)] if wrapped else text
        if len(content) <= limit:
            return text
        kept = content[:limit]
        if self.cut_notice is not None:
            kept += self.cut_notice.format(shown=limit, total=len(content))
        return opening + kept + closing if wrapped else kept


class AgentMemory:
    """The records of one agent episode and the prompts built from them (`messages`).

    Args:
        question: the user question (record 0; always shown).
        system_prompt: the system message (the reference's default ``"You are a helpful
            assistant."``).
        short_text_policy: how tool results are shortened (default :class:`ShortTextPolicy`).
    """

    def __init__(self, question: str, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 short_text_policy: Optional[ShortTextPolicy] = None) -> None:
        self.system_prompt = system_prompt
        if short_text_policy is None:
            short_text_policy = ShortTextPolicy()
        self.short_text_policy = short_text_policy
        self._records: list[Record] = [Record("prompt", question, question)]

    @property
    def question(self) -> str:
        """The question (the text of record 0)."""
        return self._records[0].text

    @property
    def records(self) -> tuple[Record, ...]:
        """All records, oldest first (record 0 is the question)."""
        return tuple(self._records)

    @property
    def num_rounds(self) -> int:
        """The number of assistant turns recorded so far."""
        return sum(record.type == "llm_gen" for record in self._records)

    def add_llm_gen(self, text: str, forced_prefix: Optional[str] = MEM_PREFIX) -> Record:
        """Record an assistant turn; returns the stored record.

        ``forced_prefix`` is the text the generator was made to start with (the reference forces
        ``"<mem>"`` as the start of every turn). The stored text holds it exactly once: when
        ``text`` (after any leading white space) already starts with it — the generator returned
        the whole turn — it is stored as is; otherwise ``text`` is the continuation after the
        prefix and ``forced_prefix + text`` is stored. ``forced_prefix=None`` or ``""``: stored as
        is. (The reference prepends ``"<mem>"`` to texts that already start with it: no nested
        ``<mem>`` here, on purpose.)
        """
        if forced_prefix and not text.lstrip().startswith(forced_prefix):
            text = forced_prefix + text
        return self._append(Record("llm_gen", text, text))

    def add_search_results(self, text: str, short_text: Optional[str] = None) -> Record:
        """Record the result of a ``<search>``; ``short_text`` overrides the policy."""
        return self._add_tool_result("search_results", text, short_text)

    def add_webpage(self, text: str, short_text: Optional[str] = None) -> Record:
        """Record the result of an ``<access>`` (one page); ``short_text`` overrides the policy."""
        return self._add_tool_result("webpage", text, short_text)

    def _add_tool_result(self, record_type: str, text: str, short_text: Optional[str]) -> Record:
        if short_text is None:
            short_text = self.short_text_policy.short_text(record_type, text)
        return self._append(Record(record_type, text, short_text))

    def _append(self, record: Record) -> Record:
        self._records.append(record)
        return record

    def _memory_window_start(self) -> int:
        """Index of the first record kept by the memory policy (the reference's backward scan):
        from the newest record backwards, skip assistant turns and count tool results; stop at the
        second tool result, or at the question; the records after the stop are kept. So: fresh
        memory -> nothing; last record a tool result -> the last assistant turn + that result; last
        record an assistant turn with no tool result after it -> the previous assistant turn, the
        last tool result and the last assistant turn; two tool results in a row -> the newest one."""
        tool_results = 0
        index = len(self._records) - 1
        while index >= 0:
            record_type = self._records[index].type
            if record_type == "prompt":
                break
            if record_type in TOOL_RECORD_TYPES:
                tool_results += 1
                if tool_results == 2:
                    break
            index -= 1
        return index + 1

    def messages(self, policy: str = "memory") -> list[dict[str, str]]:
        """The chat messages of the next prompt under ``policy`` (``"memory"`` or ``"full"``).

        Roles: the system prompt ``"system"``, the question and every tool result ``"user"`` (as in
        the reference), assistant turns ``"assistant"``; the caller adds the generation prefix
        (``<mem>``) when it generates. ``"full"`` (training rollouts in the reference): system,
        question, then every record in order, tool results whole. ``"memory"`` (the reference's
        ``AgentMemory.prepare_prompt``, used for evaluation): system and question (never dropped),
        then the records from `_memory_window_start`, tool results as their ``short_text``.
        """
        if policy not in CONTEXT_POLICIES:
            raise ValueError(f"policy must be one of {CONTEXT_POLICIES}, got {policy!r}")
        messages = [{"role": "system", "content": self.system_prompt},
                    {"role": "user", "content": self.question}]
        if policy == "full":
            kept = self._records[1:]
        else:
            kept = self._records[max(1, self._memory_window_start()):]
        newest_tool = max((i for i, r in enumerate(self._records) if r.type in TOOL_RECORD_TYPES), default=None)
        show_newest_whole = self.short_text_policy.newest_tool_result == "full"
        for record in kept:
            if record.type == "llm_gen":
                messages.append({"role": "assistant", "content": record.text})
            elif policy == "full" or (show_newest_whole and newest_tool is not None
                                      and record is self._records[newest_tool]):
                messages.append({"role": "user", "content": record.text})
            else:
                messages.append({"role": "user", "content": record.short_text})
        return messages

    def __repr__(self) -> str:
        return (f"AgentMemory(num_records={len(self._records)}, num_rounds={self.num_rounds}, "
                f"question={self.question[:40]!r})")
