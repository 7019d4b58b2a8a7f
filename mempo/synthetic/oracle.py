"""An oracle agent that solves synthetic-world episodes by the MemPO protocol (`OracleAgent`), and
its trajectories (`run_oracle`, `OracleTrajectory`, jsonl round trip).

Conventions: the oracle is a policy on chat messages that understands the synthetic world's grammar
only (`mempo.synthetic.grammar`), never the world itself: facts come from retrieved text, and a
question outside the grammar is answered ``unknown``. Everything it knows travels in its own
``<mem>`` (`mempo.synthetic.oracle_memory`: one line per question, parsed back every round).
"""
from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from mempo.utils.jsonl import iter_jsonl_records, write_jsonl
from mempo.env.data import Episode, parse_episode_prompt
from mempo.env.retriever import Retriever
from mempo.env.tools import make_tools
from mempo.synthetic.grammar import (
    CHRONICLE_RELATIONS, RELATIONS, fact_pattern, mention, pointer_pattern, question_text,
)
from mempo.synthetic.oracle_memory import (UNKNOWN, HopState, ObjectiveState, check_teacher_options,
                                            parse_oracle_memory)
from mempo.protocol.memory import CONTEXT_POLICIES, DEFAULT_SYSTEM_PROMPT, AgentMemory, ShortTextPolicy
from mempo.protocol.grammar import parse_round
from mempo.protocol.reward import compute_score
from mempo.protocol.tags import TAG_SET, TagSet
from mempo.tools import Toolset

__all__ = [
    "DEFAULT_MAX_TURNS",
    "OracleAgent",
    "OracleRound",
    "OracleTrajectory",
    "run_oracle",
    "run_oracle_episodes",
    "write_trajectories_jsonl",
    "load_trajectories_jsonl",
]

DEFAULT_MAX_TURNS = 64


# ---------------------------------------------------------------------------------------------
# The agent
# ---------------------------------------------------------------------------------------------


def _found_hops(objectives: Sequence[ObjectiveState]) -> set[tuple[int, int]]:
    """(question number, hop index) of every hop whose fact is known (not ``unknown``)."""
    return {(o.number, i) for o in objectives for i, hop in enumerate(o.hops) if hop.value not in (None, UNKNOWN)}


def _query(hop: HopState) -> str:
    # the retry ladder: relation words, then the subject alone, then subject and label
    variants = (f"{hop.subject} {RELATIONS[hop.relation].query}", f"{hop.subject}", f"{hop.subject} {hop.label}")
    return variants[min(hop.tried, len(variants) - 1)]


class OracleAgent:
    """A rule-based policy on chat messages: `respond(messages)` returns one assistant round
    ``<mem>...</mem>\\n<think>...</think>\\n<action>...</action>``.

    It reads only (1) the sub-questions in the user prompt (`mempo.env.data.parse_episode_prompt`),
    (2) the ``<mem>`` of the *last* assistant message and (3) the tool result right after it; so
    under the memory context policy it works exactly as under the full policy, and older rounds are
    never consulted under either. Policy: work on the first unresolved question; search
    ``"<subject> <relation words>"`` (then ``"<subject>"``, then ``"<subject> <label>"`` after
    failed searches; give up after ``max_search_attempts``); after every tool result, scan it for
    the pending fact of *every* question; reuse a fact another question already found; open a
    chronicle page once when an article points to it (not found there: give up); answer when all
    questions are resolved, or at round ``max_turns`` with ``unknown`` for the open ones. Answers
    are joined with ``"; "``.

    Web pages under the memory policy: `AgentMemory` shows even the *last* tool result as its short
    text, and the default `ShortTextPolicy` cuts web pages to 100 characters, so a fact on a
    chronicle page is invisible unless the page short text keeps it (e.g.
    ``ShortTextPolicy(webpage_chars=None)``); the oracle then gives up on that question honestly.

    Args:
        max_turns: the turn budget it plans for (it answers at round ``max_turns`` at the latest).
        max_search_attempts: failed searches for one fact before answering ``unknown`` for it.
        think: ``"full"`` (default: the think block explains every observation and the next
            action in sentences) or ``"short"`` (one terse line naming the next step, e.g.
            ``"Q1: river of Krigrar. Search."``; shorter cold-start targets for small models, the
            memory and the actions are the same) or ``"minimal"`` (the question number and the
            action only: ``"Q1. Search."``).
        drop_fact_prob: a deliberately imperfect memory, for cold starts that the memory reward
            can improve on (default 0: a perfect memory). When a round finds facts and the
            episode is not answered in that round (so a later round needs them), each question
            with a newly found fact is, with this probability, closed in the ``<mem>`` without
            its facts: the line reads ``Q<n>: done`` (`LOST`). Later rounds read it back as
            resolved with its value lost: they neither search for it again nor know it, and the
            answer for it is ``unknown``. With ``lost_line="subject"`` the line names the
            question's subject first (``Q<n>: Tamor done``), with ``"value"`` it is the fact sentence
            with ``unknown`` for the value (`mempo.synthetic.oracle_memory.LOST_LINES`).
            The failure is caused by the memory alone and is fixed by keeping the fact in it.
            The draw is a pure function of (``drop_seed``, the episode's user prompt, the question
            number, the hop), so a run is reproducible whatever the order of episodes.
        drop_seed: the seed of those draws.
        lost_line: ``"bare"`` (default), ``"subject"`` or ``"value"``: how a lost question's line reads (above).
        memory_style: ``"labels"`` (default: ``<label> of <subject> = <value>`` per hop, e.g.
            ``Q1: birthplace of Tamor = Belis``) or ``"facts"``: each found hop is the very
            sentence the corpus states it with (``Q1: Tamor was born in the city of Belis.``), the
            pending hop a ``?`` after them (``? (tried n)`` after failed searches), and a
            question not started has no line. Writing it is copying from the search result, the
            skill a small model learns first (an induction copy), instead of rephrasing it.
            ``"listed"``: the facts style with a line for every question from step 1 on (``Q3: ?``
            until it is started), so the number of lines is set once, by the question list, and
            later rounds copy the previous ``<mem>`` line by line; the agent answers when no line
            is pending.
        query_style: ``"words"`` (default: ``"<subject> <relation words>"``) or ``"question"``:
            the first search of hop 1 is the question's own text (a copy of a prompt line), that
            of a later hop the hop's one-hop question asked of its subject (hop 2 of "In which
            year was the mayor of Belis born?" after finding Kodan: "In which year was Kodan
            born?"); retries search as ``"words"`` does.
        answer_template: the answer round's text after ``</mem>``, with ``{answer}`` exactly once
            (None: ``"\n<think>\n<note>\n</think>\n<answer> <answers> </answer>"``). Pass
            `mempo.algo.contexts.DEFAULT_ANSWER_TEMPLATE` to make the final round exactly the
            continuation that teacher scoring puts after a ``<mem>`` (the memory reward), so a
            cold-started model's P(answer | mem) is measured on text it was trained to write.
    """

    THINK_STYLES = ("full", "short", "minimal")
    MEMORY_STYLES = ("labels", "facts", "listed")
    QUERY_STYLES = ("words", "question")

    def __init__(self, max_turns: int = DEFAULT_MAX_TURNS, max_search_attempts: int = 3, *, think: str = "full",
                 drop_fact_prob: float = 0.0, drop_seed: int = 0, answer_template: Optional[str] = None,
                 memory_style: str = "labels", query_style: str = "words", lost_line: str = "bare"):
        if max_turns < 1 or max_search_attempts < 1:
            raise ValueError("max_turns and max_search_attempts must be >= 1")
        check_teacher_options(think, self.THINK_STYLES, lost_line, drop_fact_prob, answer_template)
        if memory_style not in self.MEMORY_STYLES:
            raise ValueError(f"memory_style must be one of {self.MEMORY_STYLES}, got {memory_style!r}")
        if query_style not in self.QUERY_STYLES:
            raise ValueError(f"query_style must be one of {self.QUERY_STYLES}, got {query_style!r}")
        self.max_turns = max_turns
        self.max_search_attempts = max_search_attempts
        self.think = think
        self.drop_fact_prob = float(drop_fact_prob)
        self.drop_seed = int(drop_seed)
        self.answer_template = answer_template
        self.memory_style = memory_style
        self.query_style = query_style
        self.lost_line = lost_line

    def respond(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The next assistant round for a prompt of chat messages (system, user question, ...)."""
        question_message = next(m for m in messages if m["role"] == "user")
        questions = parse_episode_prompt(question_message["content"])
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        notes: list[str] = []
        known_before: set[tuple[int, int]] = set()
        if last is None:
            step = 1
            objectives = [ObjectiveState.plan(n, q) for n, q in enumerate(questions, 1)]
            notes.append("There is 1 question; I resolve it one fact at a time." if len(questions) == 1 else
                         f"There are {len(questions)} questions; I resolve them one fact at a time.")
        else:
            previous = parse_round(messages[last]["content"])
            previous_step, objectives = parse_oracle_memory(previous.mem or "", questions)
            known_before = _found_hops(objectives)
            step = previous_step + 1
            tool_text = None
            if last + 1 < len(messages) and messages[last + 1]["role"] == "user":
                tool_text = messages[last + 1]["content"]
            if tool_text is not None and previous.action in ("search", "access"):
                notes.extend(self._observe(objectives, previous.action, tool_text))
        notes.extend(self._share_known_facts(objectives))
        focus = next((o for o in objectives if not o.done), None)
        if self.drop_fact_prob > 0 and focus is not None and step < self.max_turns:
            # A later round needs what this round found: the imperfect memory may lose it.
            for number, hop in sorted(_found_hops(objectives) - known_before):
                objective = objectives[number - 1]
                if not objective.failed and self._drops(question_message["content"], number, hop):
                    objective.lost = True
            focus = next((o for o in objectives if not o.done), None)
        if focus is None or step >= self.max_turns:
            action, argument = "answer", "; ".join(o.answer for o in objectives)
            if focus is None:
                notes.append("Every question is resolved, so I give all answers in order.")
            else:
                notes.append("The turn budget is used up, so I answer with what I have and "
                             "'unknown' for the open questions.")
        else:
            hop = focus.next_hop()
            if hop.pointer is not None:
                action, argument = "access", f"{hop.pointer[0]} {hop.pointer[1]}"
                notes.append(f"Q{focus.number} needs the {hop.label} of {hop.subject}, which is written on "
                             f"page {hop.pointer[1]} of {hop.pointer[0]}, so I open that page.")
            else:
                action, argument = "search", self._query(focus, hop)
                notes.append(f"Q{focus.number} needs the {hop.label} of {hop.subject}, so I search for it.")
        lines = [o.memory_text(o is focus, self.memory_style, self.lost_line) for o in objectives]
        mem_lines = [f"Step {step}."] + [line for line in lines if line is not None]
        mem = "<mem>\n" + "\n".join(mem_lines) + "\n</mem>"
        if action == "answer" and self.answer_template is not None:
            return mem + self.answer_template.replace("{answer}", argument)
        if self.think != "full":
            notes = [self._short_think(focus, action, minimal=self.think == "minimal")]
        return mem + "\n<think>\n" + " ".join(notes) + f"\n</think>\n<{action}> {argument} </{action}>"

    def _query(self, objective: ObjectiveState, hop: HopState) -> str:
        if self.query_style == "question" and not hop.tried:
            index = objective.hops.index(hop)
            if index == 0:
                return objective.question
            # this hop's own one-hop question, asked of the value just found (the question that is
            # left would carry the outer relations' words, which match articles of other entities)
            kind = RELATIONS[objective.hops[index - 1].relation].object_kind
            return question_text(mention(kind, hop.subject), [hop.relation])
        return _query(hop)

    def _drops(self, prompt: str, number: int, hop: int) -> bool:
        """Whether the memory loses question ``number`` after its hop ``hop`` was found (seeded draw)."""
        draw = random.Random(f"mempo-oracle/drop/{self.drop_seed}/{number}/{hop}/{prompt}").random()
        return draw < self.drop_fact_prob

    @staticmethod
    def _short_think(focus: Optional["ObjectiveState"], action: str, minimal: bool = False) -> str:
        if action == "answer":
            return "All resolved. Answer." if focus is None else "Out of turns. Answer."
        hop = focus.next_hop()
        verb = "Open page." if action == "access" else "Search."
        if minimal:
            return f"Q{focus.number}. {verb}"
        return f"Q{focus.number}: {hop.label} of {hop.subject}. {verb}"

    def _observe(self, objectives: list[ObjectiveState], action: str, tool_text: str) -> list[str]:
        """Update the states with a tool result; returns sentences for the think block."""
        notes = []
        focus = next((o for o in objectives if not o.done), None)
        focus_hop = focus.next_hop() if focus is not None else None
        for objective in objectives:
            hop = objective.next_hop()
            if hop is None:
                continue
            relation = RELATIONS[hop.relation]
            match = fact_pattern(relation, hop.subject).search(tool_text)
            if match:
                objective.set_value(hop, match.group("o").strip())
                notes.append(f"The {'page' if action == 'access' else 'search result'} says that the "
                             f"{hop.label} of {hop.subject} is {hop.value} (Q{objective.number}).")
                continue
            if hop is not focus_hop:
                continue
            if action == "access" or hop.pointer is not None:
                objective.set_value(hop, UNKNOWN)
                notes.append(f"The page does not show the {hop.label} of {hop.subject}; "
                             f"I give up on Q{objective.number}.")
                continue
            pointer = (pointer_pattern(relation, hop.subject).search(tool_text)
                       if hop.relation in CHRONICLE_RELATIONS else None)
            if pointer:
                hop.pointer = (pointer.group("doc_id"), int(pointer.group("page")))
                notes.append(f"The search result says the {hop.label} of {hop.subject} is recorded in "
                             f"{hop.pointer[0]}, page {hop.pointer[1]}.")
                continue
            hop.tried += 1
            if hop.tried >= self.max_search_attempts:
                objective.set_value(hop, UNKNOWN)
                notes.append(f"After {hop.tried} searches I still cannot find the {hop.label} of "
                             f"{hop.subject}; I give up on Q{objective.number}.")
            else:
                notes.append(f"The search result does not state the {hop.label} of {hop.subject}; "
                             "I try another query.")
        return notes

    @staticmethod
    def _share_known_facts(objectives: list[ObjectiveState]) -> list[str]:
        """Fill pending hops with facts another question already found."""
        notes = []
        changed = True
        while changed:
            changed = False
            known = {(hop.relation, hop.subject): hop.value for o in objectives for hop in o.hops
                     if hop.value not in (None, UNKNOWN)}
            for objective in objectives:
                hop = objective.next_hop()
                if hop is not None and (hop.relation, hop.subject) in known:
                    objective.set_value(hop, known[(hop.relation, hop.subject)])
                    notes.append(f"I already know that the {hop.label} of {hop.subject} is {hop.value} "
                                 f"(Q{objective.number}).")
                    changed = True
        return notes


# ---------------------------------------------------------------------------------------------
# Trajectories
# ---------------------------------------------------------------------------------------------


@dataclass
class OracleRound:
    """One round: the prompt ``messages`` it was generated from, the assistant text, the tool result."""

    index: int
    messages: list[dict[str, str]]
    assistant: str
    action: Optional[str]
    argument: Optional[str]
    tool_text: Optional[str] = None
    tool_kind: Optional[str] = None
    tool_ok: Optional[bool] = None
    tool_metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class OracleTrajectory:
    """An oracle episode under one context policy: per round the exact ``messages`` it was generated
    from, the assistant text and the tool result (`OracleRound`); the final answer and
    `mempo.protocol.reward.compute_score` of the response text."""

    episode_id: str
    policy: str
    system_prompt: str
    prompt: str
    golds: list[list[str]]
    rounds: list[OracleRound]
    final_answer: Optional[str]
    score: dict[str, Any]
    finished: bool
    max_turns: int

    @property
    def response_text(self) -> str:
        """The rounds and their ``<information>`` blocks, separated by blank lines (no prompt)."""
        return _response_text(self.rounds)

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the response text included, for readers that do not rebuild it)."""
        obj = asdict(self)
        obj["score"] = {**self.score, "failed_rules": list(self.score.get("failed_rules", ()))}
        obj["response_text"] = self.response_text
        return obj

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "OracleTrajectory":
        """Inverse of `to_json` (the stored response text is checked against the rounds)."""
        rounds = [OracleRound(**r) for r in obj["rounds"]]
        trajectory = cls(episode_id=obj["episode_id"], policy=obj["policy"], system_prompt=obj["system_prompt"],
                         prompt=obj["prompt"], golds=[list(g) for g in obj["golds"]], rounds=rounds,
                         final_answer=obj["final_answer"], score=dict(obj["score"]), finished=obj["finished"],
                         max_turns=obj["max_turns"])
        if "response_text" in obj and obj["response_text"] != trajectory.response_text:
            raise ValueError(f"trajectory {trajectory.episode_id!r}: response_text does not match its rounds")
        return trajectory


def _response_text(rounds: Sequence[OracleRound]) -> str:
    parts = []
    for round_ in rounds:
        parts.append(round_.assistant)
        if round_.tool_text is not None:
            parts.append("\n\n" + round_.tool_text + "\n\n")
    return "".join(parts)


ToolMap = Mapping[str, Any]  # name -> mempo.tools.Tool (a Toolset's .tools)


def _as_tools(tools: Any) -> ToolMap:
    if isinstance(tools, Retriever):
        return make_tools(tools)
    return getattr(tools, "tools", tools)  # a Toolset: its tools by name


def run_oracle(episode: Episode, tools: Union[ToolMap, Any], *, policy: str = "memory",
               max_turns: int = DEFAULT_MAX_TURNS, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
               short_text_policy: Optional[ShortTextPolicy] = None, agent: Optional[Any] = None,
               score_mode: str = "mean", tags: TagSet = TAG_SET) -> OracleTrajectory:
    """Run the oracle on one episode under ``policy`` (``"memory"`` or ``"full"``) against real
    tools (`SearchTool` / `AccessTool` over any retriever, in-process or HTTP, or a task's own); returns
    an `OracleTrajectory`.

    Args:
        episode: the episode (its ``prompt`` is the user message, its ``golds`` the answers).
        tools: ``{"search": SearchTool, "access": AccessTool}`` (e.g. `mempo.env.tools.make_tools`, or a
            `mempo.tools.Toolset` such as `mempo.env.build.build_tools` gives) or a `Retriever` to build them
            from; each call goes through `mempo.tools.Toolset.call` under `tags` (as the agent loop's do; a
            Toolset keeps its own timeout and length bound, other tools get the defaults).
        policy: the context policy the prompts are built with (`AgentMemory.messages`).
        max_turns: the turn limit (the trajectory ends unanswered after it).
        system_prompt: the system message (the json format's: ``Toolset.system_prompt`` of the run's, as the
            agent loop writes it).
        short_text_policy: how tool results are shortened under the memory policy (default:
            `AgentMemory`'s, re-wrapping a cut result in the tool-result tag of `tags`).
        agent: the policy, anything with ``respond(messages) -> str`` (default ``OracleAgent(max_turns=max_turns)``;
            the ledger's: `mempo.synthetic.ledger_oracle.LedgerOracle`).
        score_mode: passed to `mempo.protocol.reward.compute_score`.
        tags: the protocol's tag set (`mempo.protocol.tags`): `TAG_SET` for the search world's teacher,
            ``JSON_TAG_SET`` for a teacher writing JSON tool calls.
    """
    if policy not in CONTEXT_POLICIES:
        raise ValueError(f"policy must be one of {CONTEXT_POLICIES}, got {policy!r}")
    toolset = tools if isinstance(tools, Toolset) else Toolset(_as_tools(tools))
    agent = agent or OracleAgent(max_turns=max_turns)
    if short_text_policy is None and tags.tool_result != ShortTextPolicy().result_tag:
        short_text_policy = ShortTextPolicy(result_tag=tags.tool_result)
    memory = AgentMemory(episode.prompt, system_prompt=system_prompt, short_text_policy=short_text_policy)
    rounds: list[OracleRound] = []
    final_answer, finished = None, False
    for index in range(max_turns):
        messages = [dict(m) for m in memory.messages(policy)]
        text = agent.respond(messages)
        memory.add_llm_gen(text)
        parsed = parse_round(text, tags)
        round_ = OracleRound(index, messages, text, parsed.action, parsed.argument)
        rounds.append(round_)
        if parsed.action == "answer":
            final_answer, finished = parsed.argument, True
            break
        if parsed.action is None or (tags.call_tag is None and parsed.action not in toolset):
            break
        result = toolset.call(parsed.action, parsed.argument or "", tags)
        round_.tool_text, round_.tool_kind, round_.tool_ok = result.text, result.kind, result.ok
        round_.tool_metadata = dict(result.metadata)
        if result.kind == "webpage":
            memory.add_webpage(result.text)
        else:
            memory.add_search_results(result.text)
    score = compute_score(_response_text(rounds), episode.golds, mode=score_mode, tags=tags)
    return OracleTrajectory(episode_id=episode.id, policy=policy, system_prompt=system_prompt, prompt=episode.prompt,
                            golds=[list(g) for g in episode.golds], rounds=rounds, final_answer=final_answer,
                            score=score, finished=finished, max_turns=max_turns)


def run_oracle_episodes(episodes: Iterable[Episode], tools: Union[ToolMap, Any],
                        **kwargs: Any) -> list[OracleTrajectory]:
    """`run_oracle` on every episode (same keyword arguments)."""
    tools = _as_tools(tools)
    return [run_oracle(episode, tools, **kwargs) for episode in episodes]


def write_trajectories_jsonl(path: Union[str, "os.PathLike[str]"], trajectories: Iterable[OracleTrajectory]) -> int:
    """Write trajectories as jsonl (one `OracleTrajectory.to_json` per line); returns the count."""
    return write_jsonl(path, (t.to_json() for t in trajectories))


def load_trajectories_jsonl(path: Union[str, "os.PathLike[str]"]) -> list[OracleTrajectory]:
    """Read trajectories written by `write_trajectories_jsonl`; errors name the file and line."""
    return list(iter_jsonl_records(path, lambda obj, _: OracleTrajectory.from_json(obj),
                                   rejects=(KeyError, TypeError)))
