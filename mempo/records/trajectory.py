"""The `Trajectory` record: one sampled agent episode as token ids, masks and round offsets.

* ``prompt_ids`` [P]: the chat-formatted system + question prompt, ending with the generation prompt,
  without the forced ``<mem>``. ``response_ids`` [L]: everything after it as generated (rounds and
  tool segments); ``response_mask`` [L]: 1 on the model's ids (and the forced prefix unless configured
  otherwise), 0 on tool segments. *Response* offsets index ``response_ids``; *sequence* offsets index
  ``prompt_ids + response_ids``.
* Offsets, not copies: round r is response ``[start, end)``, its tool segment ``[end, tool_end)``
  with the tool text's ids at ``information = (a, b)``; round r+1 starts at ``tool_end``.
* Made by the rollout without an outcome; the rewards stage (`mempo.algo.outcome`) makes the scored
  copy (``outcome`` filled) with `dataclasses.replace`. Serialised as plain JSON (`to_dict`, jsonl).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, NamedTuple, Optional, Sequence, Union

from mempo.protocol.memory import CONTEXT_POLICIES
from mempo.protocol.reward import memory_keeps, memory_kept_share, objectives_from_golds, retrieved_objectives
from mempo.records.rounds import is_scored
from mempo.utils.jsonl import iter_jsonl_records, write_jsonl
from mempo.utils.tokens import decode_ids
from mempo.utils.types import PathLike

__all__ = ["FINISH_REASONS", "Round", "Trajectory", "ended_in_loop", "RoundInput", "round_training_inputs",
           "write_trajectories_jsonl", "read_trajectories_jsonl", "iter_trajectories_jsonl"]

#: why a trajectory ended; "malformed": a round ended without an action (outcome 0 by the format check)
FINISH_REASONS = ("answer", "turn_limit", "token_budget", "malformed")


def ended_in_loop(finish_reason: str, round_contents: Sequence[Any]) -> bool:
    """Whether an episode ended without an answer on a round that repeats the round before it.
    round_contents: each round's content, in order (a `Trajectory`'s round ids, an evaluation record's
    round texts). In the memory context a round's prompt is the question and the round before with its
    tool result, so under greedy decoding a round repeated after the same result repeats to the turn
    limit: the agent is stuck, not slow."""
    return finish_reason != "answer" and len(round_contents) >= 2 and round_contents[-1] == round_contents[-2]


def _pair(value: Any) -> Optional[tuple[int, int]]:
    if value is None:
        return None
    a, b = value
    return int(a), int(b)


@dataclass
class Round:
    """One assistant round of a trajectory; offsets are response offsets unless said otherwise.

    start / end: the round's own ids ``response_ids[start:end]`` (forced prefix + generated);
    tool_end: end of its tool segment (``end`` without one); full_end (sequence offset) =
    ``len(prompt_ids) + start``: full_ctx[r] = ``sequence_ids[:full_end]``; prefix_len: forced-prefix
    ids; mem_span: the scored ``<mem>`` span (`mempo.records.rounds.round_mem_span`) or None;
    action / action_argument: the tag that closed the round ("search", "access", "answer"; None for a
    malformed round) and its stripped content; stop_reason: "action", "eos" or "length";
    prompt_ids: memory policy only, the exact ids the round was generated from (without the forced
    prefix), None for the full policy; information: the tool text's ids (a, b) in the tool segment;
    tool_ok: whether the tool call succeeded.
    """

    index: int
    start: int
    end: int
    tool_end: int
    full_end: int
    prefix_len: int = 0
    mem_span: Optional[tuple[int, int]] = None
    action: Optional[str] = None
    action_argument: Optional[str] = None
    stop_reason: str = "action"
    prompt_ids: Optional[list[int]] = None
    information: Optional[tuple[int, int]] = None
    tool_ok: Optional[bool] = None

    @property
    def num_tokens(self) -> int:
        """Ids of the round itself (forced prefix + generated), without the tool segment."""
        return self.end - self.start

    @property
    def scored(self) -> bool:
        """Whether the round gets a memory reward: round 2 on (index >= 1) with a ``mem_span``
        (`mempo.records.rounds.is_scored`)."""
        return is_scored(self.index, self.mem_span)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "start": self.start, "end": self.end, "tool_end": self.tool_end,
            "full_end": self.full_end, "prefix_len": self.prefix_len,
            "mem_span": list(self.mem_span) if self.mem_span is not None else None,
            "action": self.action, "action_argument": self.action_argument, "stop_reason": self.stop_reason,
            "prompt_ids": list(self.prompt_ids) if self.prompt_ids is not None else None,
            "information": list(self.information) if self.information is not None else None,
            "tool_ok": self.tool_ok,
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> "Round":
        prompt_ids = obj.get("prompt_ids")
        return cls(
            index=int(obj["index"]), start=int(obj["start"]), end=int(obj["end"]), tool_end=int(obj["tool_end"]),
            full_end=int(obj["full_end"]), prefix_len=int(obj.get("prefix_len", 0)),
            mem_span=_pair(obj.get("mem_span")), action=obj.get("action"),
            action_argument=obj.get("action_argument"), stop_reason=obj.get("stop_reason", "action"),
            prompt_ids=[int(t) for t in prompt_ids] if prompt_ids is not None else None,
            information=_pair(obj.get("information")), tool_ok=obj.get("tool_ok"),
        )


@dataclass
class Trajectory:
    """One sampled trajectory.

    uid: the group (question) label shared by the G samples; sample_index: 0..G-1; policy: one of
    `mempo.protocol.memory.CONTEXT_POLICIES`; finish_reason: one of `FINISH_REASONS`; golds: the gold
    aliases as given to ``compute_score`` (never part of a generation request); final_answer: the
    extracted ``<answer>`` text or None; protocol_text: the text the outcome is scored on, as the
    rollout built it (round texts and tool texts as given, in order, no chat glue; a tool segment cut
    by the token budget is whole here); outcome: ``compute_score``'s dict, empty until the rewards
    stage (after a JSON round trip its tuples are lists); episode_id: the source episode's id; example:
    the source example as the outcome reward reads it (question(s), golds, other fields; None when the
    rollout was given none), like the golds never part of a generation request.
    rollout_logprobs [L]: the sampling policy's log-prob of every generated id as the backend gave it
    (`sampled_positions`; 0.0 on forced-prefix and tool ids, which were not sampled), None when the
    backend gave none.
    """

    uid: str
    sample_index: int
    policy: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    rounds: list[Round]
    finish_reason: str
    golds: Any = None
    final_answer: Optional[str] = None
    protocol_text: Optional[str] = None
    outcome: dict[str, Any] = field(default_factory=dict)
    episode_id: Optional[str] = None
    example: Optional[dict[str, Any]] = None
    rollout_logprobs: Optional[list[float]] = None

    # -- views -------------------------------------------------------------------------------------
    @property
    def sequence_ids(self) -> list[int]:
        """``prompt_ids + response_ids`` (a new list) [P + L]."""
        return self.prompt_ids + self.response_ids

    @property
    def score(self) -> float:
        """The outcome score (0.0 before the rewards stage)."""
        return float(self.outcome.get("score", 0.0))

    @property
    def num_generated_tokens(self) -> int:
        """Response ids with mask 1."""
        return sum(self.response_mask)

    def sampled_positions(self) -> list[bool]:
        """[L]: True on the ids the backend sampled (each round's ids after its forced prefix), False on
        forced-prefix and tool ids."""
        sampled = [False] * len(self.response_ids)
        for r in self.rounds:
            sampled[r.start + r.prefix_len:r.end] = [True] * (r.end - r.start - r.prefix_len)
        return sampled

    def scored_rounds(self) -> list[Round]:
        """The rounds that get a memory reward, in order (``Round.scored``)."""
        return [r for r in self.rounds if r.scored]

    def round_context_ids(self, round_: Union[int, Round]) -> list[int]:
        """The exact ids round r was generated from, without its forced prefix [C]."""
        r = self.rounds[round_] if isinstance(round_, int) else round_
        if r.prompt_ids is not None:
            return list(r.prompt_ids)
        return self.prompt_ids + self.response_ids[:r.start]

    def response_text(self, tokenizer: Any) -> str:
        """The protocol text (rounds and ``<information>`` blocks, no chat glue) decoded from the ids.

        Equal to ``protocol_text`` up to the tokenizer's normalisation of tool text (e.g. NFC) and a
        tool segment cut by the token budget."""
        parts = []
        for r in self.rounds:
            parts.append(decode_ids(tokenizer, self.response_ids[r.start:r.end]))
            if r.information is not None:
                parts.append(decode_ids(tokenizer, self.response_ids[r.information[0]:r.information[1]]))
        return "".join(parts)

    def read_before_scored(self, tokenizer: Any) -> list[str]:
        """Per scored round (`Round.scored`, in order): the ``<information>`` texts of the rounds
        before it, decoded and joined with spaces (what the agent had read when writing its ``<mem>``)."""
        read, seen = [], []
        for r in self.rounds:
            if r.scored:
                read.append(" ".join(seen))
            if r.information is not None:
                seen.append(decode_ids(tokenizer, self.response_ids[r.information[0]:r.information[1]]))
        return read

    def memory_keeps(self, tokenizer: Any) -> list[Optional[bool]]:
        """Per scored round (`Round.scored`, in order): whether its ``<mem>`` keeps every gold already
        retrieved (`mempo.protocol.reward.memory_keeps` of the ``<mem>`` text and the
        ``<information>`` texts of the rounds before it, `read_before_scored`; None when no gold was
        retrieved yet). Empty without golds."""
        if self.golds is None:
            return []
        return [memory_keeps(decode_ids(tokenizer, self.response_ids[r.mem_span[0]:r.mem_span[1]]), seen, self.golds)
                for r, seen in zip(self.scored_rounds(), self.read_before_scored(tokenizer))]

    def memory_kept_shares(self, tokenizer: Any) -> list[Optional[float]]:
        """Per scored round (`Round.scored`, in order): the share of the golds already retrieved that
        its ``<mem>`` keeps (`mempo.protocol.reward.memory_kept_share`, the graded `memory_keeps`: 1.0
        where that is True; None where no gold was retrieved yet). Empty without golds."""
        if self.golds is None:
            return []
        return [memory_kept_share(decode_ids(tokenizer, self.response_ids[r.mem_span[0]:r.mem_span[1]]), seen,
                                  self.golds)
                for r, seen in zip(self.scored_rounds(), self.read_before_scored(tokenizer))]

    def looped(self) -> bool:
        """Whether the episode ended without an answer on a round whose ids repeat the round before it
        (`ended_in_loop`)."""
        return ended_in_loop(self.finish_reason, [self.response_ids[r.start:r.end] for r in self.rounds[-2:]])

    def answered_pending(self, tokenizer: Any) -> Optional[bool]:
        """Whether the episode was answered with a question still pending: it ends with an answer
        (``final_answer`` not None) and some objective's gold appeared in none of its ``<information>``
        texts (`mempo.protocol.reward.retrieved_objectives`; the answer round searches nothing, so
        they all came before it). None without golds or without an answer."""
        if self.golds is None or self.final_answer is None:
            return None
        seen = " ".join(decode_ids(tokenizer, self.response_ids[r.information[0]:r.information[1]])
                        for r in self.rounds if r.information is not None)
        return len(retrieved_objectives(seen, self.golds)) < len(objectives_from_golds(self.golds))

    def retrieved_objectives(self, tokenizer: Any) -> list[list[int]]:
        """Per scored round (`Round.scored`, in order): the objectives (indices into
        `mempo.protocol.reward.objectives_from_golds`) whose gold appeared in an ``<information>`` of
        the rounds before it (`mempo.protocol.reward.retrieved_objectives` of `read_before_scored`;
        the same "retrieved" as `memory_keeps`). Empty without golds."""
        if self.golds is None:
            return []
        return [retrieved_objectives(seen, self.golds) for seen in self.read_before_scored(tokenizer)]

    # -- checks ------------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError when the record breaks its rules: rounds tile the response in order
        (``start`` of each = ``tool_end`` of the one before), ``full_end = len(prompt_ids) + start``,
        spans inside their round / tool segment, ``prompt_ids`` per round for the memory policy only,
        enums in range."""
        if self.policy not in CONTEXT_POLICIES:
            raise ValueError(f"policy must be one of {CONTEXT_POLICIES}, got {self.policy!r}")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if len(self.response_mask) != len(self.response_ids):
            raise ValueError("response_mask and response_ids differ in length")
        if self.rollout_logprobs is not None and len(self.rollout_logprobs) != len(self.response_ids):
            raise ValueError("rollout_logprobs and response_ids differ in length")
        position = 0
        prompt_len = len(self.prompt_ids)
        for i, r in enumerate(self.rounds):
            if r.index != i:
                raise ValueError(f"round {i} has index {r.index}")
            if not position == r.start <= r.end <= r.tool_end <= len(self.response_ids):
                raise ValueError(f"round {i} offsets ({r.start}, {r.end}, {r.tool_end}) do not follow {position}")
            if r.full_end != prompt_len + r.start:
                raise ValueError(f"round {i}: full_end {r.full_end} != len(prompt_ids) + start")
            if r.mem_span is not None and not r.start <= r.mem_span[0] < r.mem_span[1] <= r.end:
                raise ValueError(f"round {i}: mem_span {r.mem_span} outside the round")
            if r.information is not None and not r.end <= r.information[0] <= r.information[1] <= r.tool_end:
                raise ValueError(f"round {i}: information {r.information} outside the tool segment")
            if (r.prompt_ids is None) != (self.policy == "full"):
                raise ValueError(f"round {i}: prompt_ids must be given for the memory policy only")
            position = r.tool_end
        if position != len(self.response_ids):
            raise ValueError(f"the rounds cover {position} of {len(self.response_ids)} response ids")

    # -- serialisation -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON dict (lists, ints, floats, strings, None)."""
        return {
            "uid": self.uid, "sample_index": self.sample_index, "policy": self.policy,
            "episode_id": self.episode_id, "prompt_ids": list(self.prompt_ids),
            "response_ids": list(self.response_ids), "response_mask": list(self.response_mask),
            "rounds": [r.to_dict() for r in self.rounds], "finish_reason": self.finish_reason,
            "golds": self.golds, "final_answer": self.final_answer, "protocol_text": self.protocol_text,
            "outcome": json.loads(json.dumps(self.outcome)),
            **({"example": json.loads(json.dumps(self.example, default=str))} if self.example is not None else {}),
            "rollout_logprobs": None if self.rollout_logprobs is None else [float(v) for v in self.rollout_logprobs],
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> "Trajectory":
        """Inverse of :meth:`to_dict` (validated)."""
        trajectory = cls(
            uid=str(obj["uid"]), sample_index=int(obj["sample_index"]), policy=obj["policy"],
            prompt_ids=[int(t) for t in obj["prompt_ids"]], response_ids=[int(t) for t in obj["response_ids"]],
            response_mask=[int(t) for t in obj["response_mask"]],
            rounds=[Round.from_dict(r) for r in obj["rounds"]], finish_reason=obj["finish_reason"],
            golds=obj.get("golds"), final_answer=obj.get("final_answer"), protocol_text=obj.get("protocol_text"),
            outcome=dict(obj.get("outcome") or {}), episode_id=obj.get("episode_id"), example=obj.get("example"),
            rollout_logprobs=(None if obj.get("rollout_logprobs") is None
                              else [float(v) for v in obj["rollout_logprobs"]]),
        )
        trajectory.validate()
        return trajectory


class RoundInput(NamedTuple):
    """One round as a training sequence: ``input_ids`` [C + n], ``loss_mask`` [C + n] (0 on the
    context, the response mask on the round's own ids), ``context_len`` C."""

    round_index: int
    input_ids: list[int]
    loss_mask: list[int]
    context_len: int


def round_training_inputs(trajectory: Trajectory) -> list[RoundInput]:
    """Per-round training sequences: the exact context the round was generated from + its ids.

    Memory policy: context = ``Round.prompt_ids`` (the rebuilt per-round prompt). Full policy:
    context = ``prompt_ids + response_ids[:start]`` (one forward of the whole sequence gives the
    same log-probs for every round at once; this per-round form is for checks and for trainers that
    want one row per round). The round's own ids are ``response_ids[start:end]`` (forced prefix +
    generated; the tool segment after it is not part of the round). ``loss_mask`` is 0 on the context
    and ``response_mask[start:end]`` on the round.
    """
    inputs = []
    for r in trajectory.rounds:
        context = trajectory.round_context_ids(r)
        own = trajectory.response_ids[r.start:r.end]
        inputs.append(RoundInput(r.index, context + own, [0] * len(context) + trajectory.response_mask[r.start:r.end],
                                 len(context)))
    return inputs


def write_trajectories_jsonl(path: PathLike, trajectories: Iterable[Trajectory]) -> int:
    """Write one JSON object per line (``Trajectory.to_dict``), atomically; returns the count."""
    return write_jsonl(path, (trajectory.to_dict() for trajectory in trajectories))


def iter_trajectories_jsonl(path: PathLike) -> Iterator[Trajectory]:
    """Stream trajectories from a jsonl file (blank lines skipped; errors name the line)."""
    return iter_jsonl_records(path, lambda obj, _: Trajectory.from_dict(obj), rejects=(KeyError, TypeError))


def read_trajectories_jsonl(path: PathLike) -> list[Trajectory]:
    """All trajectories of a jsonl file."""
    return list(iter_trajectories_jsonl(path))
