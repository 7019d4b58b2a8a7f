"""The agent loop: G samples of every question, rounds of generation and tool calls, as token ids.

Token-in/token-out: the forced prefix and the backend's kept ids are appended to ``response_ids``
unchanged (nothing is decoded and re-encoded); tool segments have mask 0. ``response_ids`` never
exceeds ``rollout.max_response_tokens`` (generated + tool ids, like verl's response length) and a
backend context never exceeds the engine's ``max_context_tokens``. The golds ride along in the
records and never reach a generation request; the outcome is scored after the loop
(`mempo.algo.outcome`).

The protocol's tags follow ``rollout.action_format`` and the tools (`protocol_tags`): ``tags``, one tag
per tool answered in ``<information>``; ``json``, Hermes / Qwen ``<tool_call>`` JSON calls answered in
``<tool_response>``, with the tools' schemas in the system prompt (`Toolset.system_prompt`). Tool calls
go through `mempo.tools.Toolset.call`: whatever a tool does, the agent reads one bounded observation.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

from mempo.config import RolloutConfig
from mempo.env.tools import make_tools
from mempo.ops.spans import TokenTable, find_spans
from mempo.protocol.grammar import extract_solution, find_blocks
from mempo.protocol.memory import AgentMemory, ShortTextPolicy
from mempo.protocol.tags import TagSet, tag_set_for
from mempo.records.rounds import round_mem_span
from mempo.records.trajectory import Round, Trajectory
from mempo.rollout.backends.base import GenerationBackend, GenerationRequest, RequestKey, SamplingParams
from mempo.rollout.backends.stopping import STOP_LENGTH, TokenBytes, cut_round
from mempo.rollout.chat import ChatFormat, default_stop_token_ids
from mempo.seeds import generation_seed
from mempo.tools import Tool, ToolResult, Toolset, as_toolset

__all__ = ["RolloutConfig", "RolloutTask", "RolloutStats", "RolloutEngine", "EpisodeRun", "rollout", "as_task",
           "protocol_tags", "rollout_system_prompt"]


def protocol_tags(config: RolloutConfig, tools: Union[Toolset, Mapping[str, Tool], Sequence[Tool]]) -> TagSet:
    """The tag set of a run: ``rollout.action_format`` over the tools' names (`tag_set_for`); what the
    loop, the stopping rule, the scanner and the outcome's format check read."""
    return tag_set_for(config.action_format, as_toolset(tools).names)


def rollout_system_prompt(config: RolloutConfig, tools: Union[Toolset, Mapping[str, Tool], Sequence[Tool]]) -> str:
    """The system message of a run's episodes: ``rollout.system_prompt``, followed in the json format by the
    tools' schemas block (`Toolset.system_prompt`) unless ``rollout.tool_schemas`` is false."""
    if config.action_format == "json" and config.tool_schemas:
        return as_toolset(tools).system_prompt(config.system_prompt)
    return config.system_prompt


@dataclass(frozen=True)
class RolloutTask:
    """One question to sample: ``id``, the user ``prompt``, its ``golds`` (``None``: not scored by EM / F1)
    and the ``example`` the outcome reward reads (None: ``{"id", "prompt", "golds"}``). Only the prompt
    reaches a generation request."""

    id: str
    prompt: str
    golds: Any = None
    example: Optional[Mapping[str, Any]] = None


def as_task(item: Any, position: int = 0) -> RolloutTask:
    """A :class:`RolloutTask` from an ``Episode`` (``id``, ``prompt``, ``golds``; example: its ``to_json()``
    with ``golds``), a mapping (``prompt`` or ``question``; ``golds`` or ``golden_answers``; optional
    ``id``; example: the mapping), a ``(prompt, golds)`` pair or a prompt string. Missing ids become the
    position."""
    if isinstance(item, RolloutTask):
        return item
    if isinstance(item, str):
        return RolloutTask(str(position), item, None, {"id": str(position), "prompt": item, "golds": None})
    if hasattr(item, "prompt") and hasattr(item, "golds"):
        task_id = str(getattr(item, "id", position))
        example = item.to_json() if hasattr(item, "to_json") else {}
        example = {**example, "id": task_id, "prompt": str(item.prompt), "golds": item.golds}
        return RolloutTask(task_id, str(item.prompt), item.golds, example)
    if isinstance(item, Mapping):
        prompt = item.get("prompt", item.get("question"))
        if not isinstance(prompt, str):
            raise ValueError(f"task {position}: a mapping needs a 'prompt' or 'question' string")
        golds = item.get("golds", item.get("golden_answers"))
        task_id = str(item.get("id", position))
        return RolloutTask(task_id, prompt, golds, {**item, "id": task_id, "prompt": prompt, "golds": golds})
    if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str):
        return RolloutTask(str(position), item[0], item[1], {"id": str(position), "prompt": item[0], "golds": item[1]})
    raise TypeError(f"task {position}: cannot make a rollout task from {type(item).__name__}")


@dataclass
class RolloutStats:
    """Counters of the last :meth:`RolloutEngine.run` (wall times in seconds).

    steps / batch_sizes: generation calls and their batch sizes; generated_tokens: ids kept from the
    backend (forced prefixes not included); forced_tokens: forced-prefix ids; tool_calls /
    tool_errors: tool results appended (``ok=False`` ones); finish_reasons: trajectories per reason.
    """

    trajectories: int = 0
    steps: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    generated_tokens: int = 0
    forced_tokens: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    generation_seconds: float = 0.0
    tool_seconds: float = 0.0
    wall_seconds: float = 0.0
    finish_reasons: Counter = field(default_factory=Counter)


class EpisodeRun:
    """One trajectory being sampled: its task, ids so far, rounds and memory. Made by
    `RolloutEngine.start_run`; ``max_turns`` / ``max_new_tokens`` are its own round limits (the
    engine's config unless the caller gave others, e.g. a served request's)."""

    def __init__(self, task: RolloutTask, uid: str, sample_index: int, memory: AgentMemory,
                 prompt_ids: list[int], *, max_turns: int, max_new_tokens: int) -> None:
        self.task, self.uid, self.sample_index, self.memory = task, uid, sample_index, memory
        self.prompt_ids = prompt_ids
        self.max_turns, self.max_new_tokens = int(max_turns), int(max_new_tokens)
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        # the sampling policy's log-prob of every generated id (0.0 on forced and tool ids); None once a
        # round came without them
        self.response_logprobs: Optional[list[float]] = []
        self.rounds: list[Round] = []
        self.round_texts: list[str] = []
        self.finish_reason: Optional[str] = None
        self.round_prompt: Optional[list[int]] = None
        self.round_limit = 0
        self.round_limited = False

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


def _closed_block_content(text: str, tag: str, tags: TagSet) -> Optional[str]:
    for block in reversed(find_blocks(text, tags)):
        if block.tag == tag and block.closed:
            return block.content.strip()
    return None


class RolloutEngine:
    """Runs the agent loop: per step, one backend batch of every trajectory waiting for generation,
    then that step's tool calls concurrently.

    Args:
        backend: a generation backend (:mod:`mempo.rollout.backends`).
        tokenizer: the policy's tokenizer (transformers or ``tokenizers``).
        tools: the agent's tools: a `mempo.tools.Toolset`, or `mempo.tools.Tool` s (a sequence or a
            ``{name: tool}`` mapping; default: the built-in ``make_tools(retriever)``), called through
            `Toolset.call`.
        retriever: used when ``tools`` is not given.
        config: the settings, `mempo.config.RolloutConfig` (the ``rollout`` section; default: its
            defaults). The loop reads ``context_policy``, ``group_size``, ``max_turns``,
            ``max_new_tokens_per_round``, ``max_response_tokens``, the sampling fields, ``seed``,
            ``system_prompt``, ``forced_prefix``, ``train_forced_prefix``, ``stop_token_ids``,
            ``tool_workers``, ``chat_template`` and ``action_format`` (`protocol_tags`); the backend
            fields are the backend factory's.
        seed: this engine's seed (None: ``config.seed``); the k-th generation step of its c-th
            `run` samples with `mempo.seeds.generation_seed(seed, c, k)` (training passes the
            step's seed, `mempo.seeds.training_rollout_seed`).
        max_context_tokens: the most ids a backend context may hold (prompt + new ids; None:
            unlimited), e.g. the model's ``max_position_embeddings``.
        short_text_policy: library hook for `AgentMemory` (None: its default, which every command
            uses).
    """

    def __init__(self, backend: GenerationBackend, tokenizer: Any,
                 tools: Union[Toolset, Mapping[str, Tool], Sequence[Tool], None] = None,
                 *, retriever: Any = None, config: Optional[RolloutConfig] = None, seed: Optional[int] = None,
                 max_context_tokens: Optional[int] = None,
                 short_text_policy: Optional[ShortTextPolicy] = None) -> None:
        self.config = config if config is not None else RolloutConfig()
        if max_context_tokens is not None and max_context_tokens < 1:
            raise ValueError(f"max_context_tokens must be >= 1 or None, got {max_context_tokens}")
        if tools is None:
            if retriever is None:
                raise ValueError("give the tools, or a retriever to build them from")
            tools = make_tools(retriever)
        self.toolset = as_toolset(tools)
        self.tags = protocol_tags(self.config, self.toolset)
        self.system_prompt = rollout_system_prompt(self.config, self.toolset)
        self.seed = self.config.seed if seed is None else int(seed)
        self.max_context_tokens = max_context_tokens
        # the memory context re-wraps a cut tool result in the protocol's own tool-result tag
        self.short_text_policy = dataclasses.replace(short_text_policy or ShortTextPolicy(),
                                                     result_tag=self.tags.tool_result)
        self.backend = backend
        self.tokenizer = tokenizer
        self.tools = self.toolset.tools
        self.chat = ChatFormat(tokenizer, forced_prefix=self.config.forced_prefix, template=self.config.chat_template)
        self.token_bytes = TokenBytes.of(tokenizer)
        stops = self.config.stop_token_ids
        self.stop_token_ids = tuple(int(t) for t in (stops if stops is not None else default_stop_token_ids(tokenizer)))
        self.stats = RolloutStats()
        self._calls = 0

    # -- public ------------------------------------------------------------------------------------
    def run(self, tasks: Sequence[Any], *, group_size: Optional[int] = None) -> list[Trajectory]:
        """Sample ``group_size`` (default ``config.group_size``) trajectories of every task.

        Per trajectory: ``generating -> (tool calling -> generating)* -> done``. One step sends every
        trajectory waiting for generation to the backend as one batch (all active trajectories of
        all questions); then that step's tool calls run concurrently (``tool_workers`` threads); the
        next step starts when they are all answered, so with a seeded backend the same inputs give
        the same trajectories.

        ``tasks``: episodes, mappings, ``(prompt, golds)`` pairs (:func:`as_task`). Returns
        ``len(tasks) * G`` trajectories without outcome: tasks in input order, the G samples of each
        in sample order; ``uid`` is the task id (``"<id>#<k>"`` for its k-th repeat in this call).
        """
        cfg = self.config
        group = cfg.group_size if group_size is None else int(group_size)
        if group < 1:
            raise ValueError(f"group_size must be >= 1, got {group}")
        call = self._calls
        self._calls += 1
        stats = self.stats = RolloutStats()
        began = time.perf_counter()
        runs = self._start_runs([as_task(t, i) for i, t in enumerate(tasks)], group)
        step = 0
        with ThreadPoolExecutor(max_workers=cfg.tool_workers, thread_name_prefix="mempo-tool") as pool:
            while True:
                requests, waiting = [], []
                for run in runs:
                    if not run.done:
                        request = self.next_request(run)
                        if request is not None:
                            requests.append(request)
                            waiting.append(run)
                if not requests:
                    break
                sampling = SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k, seed=self._step_seed(call, step))
                t0 = time.perf_counter()
                outputs = self.backend.generate(requests, sampling)
                stats.generation_seconds += time.perf_counter() - t0
                if len(outputs) != len(requests):
                    raise RuntimeError(f"the backend returned {len(outputs)} outputs for {len(requests)} requests")
                stats.steps += 1
                stats.batch_sizes.append(len(requests))
                calls = []
                for run, output in zip(waiting, outputs):
                    tool_call = self.accept_generation(run, output.token_ids, output.logprobs)
                    if tool_call is not None:
                        calls.append((run, tool_call))
                if calls:
                    t0 = time.perf_counter()
                    futures = [pool.submit(self.call_tool, action, argument) for _, (action, argument) in calls]
                    for (run, _), future in zip(calls, futures):
                        self.accept_tool(run, future.result())
                    stats.tool_seconds += time.perf_counter() - t0
                step += 1
        trajectories = self.finish(runs)
        stats.trajectories = len(trajectories)
        stats.wall_seconds = time.perf_counter() - began
        return trajectories

    # -- steps -------------------------------------------------------------------------------------
    def _start_runs(self, tasks: list[RolloutTask], group: int) -> list[EpisodeRun]:
        runs, seen = [], Counter()
        for task in tasks:
            seen[task.id] += 1
            uid = task.id if seen[task.id] == 1 else f"{task.id}#{seen[task.id] - 1}"
            prompt_ids = None
            for sample in range(group):
                run = self.start_run(task, uid=uid, sample_index=sample, prompt_ids=prompt_ids)
                prompt_ids = run.prompt_ids
                runs.append(run)
        return runs

    def start_run(self, task: Any, *, uid: Optional[str] = None, sample_index: int = 0,
                  max_turns: Optional[int] = None, max_new_tokens: Optional[int] = None,
                  prompt_ids: Optional[Sequence[int]] = None) -> EpisodeRun:
        """A new trajectory of `task` (anything `as_task` takes), not yet generated.

        The step API (what `run` does for a batch; a caller driving its own batches, such as
        `mempo.serve.agent.AgentService`, calls the same steps): `next_request` (None: the run has
        ended), the backend's ids to `accept_generation` (a tool call to make, or None: ended or
        waiting for nothing), `call_tool` (any thread) then `accept_tool`, and at the end `finish`.
        max_turns / max_new_tokens: this run's round limits (default: the config's ``max_turns`` and
        ``max_new_tokens_per_round``); uid: default the task id; prompt_ids: the prompt's ids when
        already encoded (the G samples of one task share them)."""
        cfg = self.config
        task = as_task(task)
        memory = AgentMemory(task.prompt, system_prompt=self.system_prompt, short_text_policy=self.short_text_policy)
        if prompt_ids is None:
            prompt_ids = self.chat.prompt_ids(memory.messages("full"))
        turns = cfg.max_turns if max_turns is None else int(max_turns)
        new_tokens = cfg.max_new_tokens_per_round if max_new_tokens is None else int(max_new_tokens)
        if turns < 1 or new_tokens < 1:
            raise ValueError(f"max_turns and max_new_tokens must be >= 1, got {turns} and {new_tokens}")
        return EpisodeRun(task, task.id if uid is None else uid, sample_index, memory, list(prompt_ids),
                          max_turns=turns, max_new_tokens=new_tokens)

    def _step_seed(self, call: int, step: int) -> int:
        """Generation step k of the c-th `run` samples with `generation_seed` (engine seed, c, k)."""
        return generation_seed(self.seed, call, step)

    def next_request(self, run: EpisodeRun) -> Optional[GenerationRequest]:
        """The round's context (full policy: ``prompt_ids + response_ids``; memory policy: the chat
        rendering of ``AgentMemory.messages("memory")``, kept as ``Round.prompt_ids``) + the forced
        prefix ids. Its limit is ``min(run.max_new_tokens, room left)`` under both budgets; no
        room for one more id after the prefix ends the trajectory with ``"token_budget"``."""
        cfg = self.config
        prefix = self.chat.prefix_ids
        if cfg.context_policy == "full":
            context = run.prompt_ids + run.response_ids
            run.round_prompt = None
        else:
            context = self.chat.prompt_ids(run.memory.messages("memory"))
            run.round_prompt = context
        limit, limited = run.max_new_tokens, False
        if cfg.max_response_tokens is not None:
            room = cfg.max_response_tokens - len(run.response_ids) - len(prefix)
            if room < limit:
                limit, limited = room, True
        if self.max_context_tokens is not None:
            room = self.max_context_tokens - len(context) - len(prefix)
            if room < limit:
                limit, limited = room, True
        if limit < 1:
            self._finish_run(run, "token_budget")
            return None
        run.round_limit, run.round_limited = limit, limited
        key = RequestKey(run.uid, run.sample_index, len(run.rounds))
        return GenerationRequest(context + prefix, limit, len(prefix), self.stop_token_ids, key, self.tags)

    def accept_generation(self, run: EpisodeRun, token_ids: Sequence[int],
                          logprobs: Optional[Sequence[float]] = None) -> Optional[tuple[str, str]]:
        """Append the round (forced prefix, mask 1 when ``train_forced_prefix``, + the ids `cut_round`
        keeps, with their `logprobs` as the backend gave them: the kept ids are the first ids it
        generated) and its decoded text to the memory (``add_llm_gen`` stores the leading ``<mem>`` as is).
        Returns the (action, argument) tool call to make, or None when the trajectory ends:
        ``<answer>``: "answer"; a search/access in round ``run.max_turns``: "turn_limit" (nothing would
        read the result); a round cut by the budget's room: "token_budget"; no closed action
        (stop id or token limit): "malformed" (the outcome's format check gives it 0)."""
        cfg = self.config
        prefix = self.chat.prefix_ids
        cut = cut_round(token_ids, self.token_bytes, prefix_ids=prefix, stop_token_ids=self.stop_token_ids,
                        max_new_tokens=run.round_limit, tags=self.tags)
        start = len(run.response_ids)
        run.response_ids.extend(prefix)
        run.response_ids.extend(cut.token_ids)
        run.response_mask.extend([1 if cfg.train_forced_prefix else 0] * len(prefix))
        run.response_mask.extend([1] * len(cut.token_ids))
        if run.response_logprobs is not None:
            kept = len(cut.token_ids)
            if logprobs is None or list(token_ids[:kept]) != list(cut.token_ids):
                run.response_logprobs = None  # this round's ids have no log-prob from the sampler
            else:
                run.response_logprobs.extend([0.0] * len(prefix) + [float(v) for v in logprobs[:kept]])
        end = len(run.response_ids)
        self.stats.generated_tokens += len(cut.token_ids)
        self.stats.forced_tokens += len(prefix)
        text = self.chat.decode(run.response_ids[start:end])
        run.memory.add_llm_gen(text, forced_prefix=cfg.forced_prefix or None)
        run.round_texts.append(text)
        argument = _closed_block_content(text, cut.action, self.tags) if cut.action is not None else None
        run.rounds.append(Round(
            index=len(run.rounds), start=start, end=end, tool_end=end, full_end=len(run.prompt_ids) + start,
            prefix_len=len(prefix), action=cut.action, action_argument=argument, stop_reason=cut.reason,
            prompt_ids=list(run.round_prompt) if run.round_prompt is not None else None,
        ))
        if cut.action == "answer":
            self._finish_run(run, "answer")
        elif cut.action is not None:
            if len(run.rounds) >= run.max_turns:
                self._finish_run(run, "turn_limit")
            else:
                return cut.action, argument or ""
        elif cut.reason == STOP_LENGTH and run.round_limited:
            self._finish_run(run, "token_budget")
        else:
            self._finish_run(run, "malformed")
        return None

    def call_tool(self, action: str, argument: str) -> ToolResult:
        """The `ToolResult` of the round's action (`mempo.tools.Toolset.call` under the run's tags): a
        malformed call, an unknown tool, a tool that raises, hangs past its timeout or returns no text
        gives an ``Error: ...`` result with ``ok=False``; it never ends the rollout."""
        return self.toolset.call(action, argument, self.tags)

    def accept_tool(self, run: EpisodeRun, result: Any) -> None:
        """Append the tool segment (`ChatFormat.tool_segment`, mask 0) and record the result in the
        memory (``add_webpage`` for kind "webpage", else ``add_search_results``); a segment cut to
        fit ``max_response_tokens`` is kept up to the budget and ends the trajectory ("token_budget")."""
        cfg = self.config
        segment = self.chat.tool_segment(result.text)
        ids = segment.ids
        truncated = False
        if cfg.max_response_tokens is not None:
            room = cfg.max_response_tokens - len(run.response_ids)
            if len(ids) > room:
                ids, truncated = ids[:max(room, 0)], True
        base = len(run.response_ids)
        run.response_ids.extend(ids)
        run.response_mask.extend([0] * len(ids))
        if run.response_logprobs is not None:
            run.response_logprobs.extend([0.0] * len(ids))
        last = run.rounds[-1]
        last.tool_end = len(run.response_ids)
        last.information = (base + min(segment.information_start, len(ids)),
                            base + min(segment.information_end, len(ids)))
        last.tool_ok = bool(result.ok)
        self.stats.tool_calls += 1
        self.stats.tool_errors += not result.ok
        if result.kind == "webpage":
            run.memory.add_webpage(result.text)
        else:
            run.memory.add_search_results(result.text)
        if truncated:
            self._finish_run(run, "token_budget")

    def _finish_run(self, run: EpisodeRun, reason: str) -> None:
        run.finish_reason = reason
        self.stats.finish_reasons[reason] += 1

    # -- after the loop ----------------------------------------------------------------------------
    def _span_table(self, runs: list[EpisodeRun]):
        table = self.token_bytes.table
        top = max((max(run.response_ids) for run in runs if run.response_ids), default=-1)
        if top >= table.vocab_size:  # a model vocabulary padded beyond the tokenizer's: no bytes
            pieces = list(self.token_bytes.pieces) + [b""] * (top + 1 - table.vocab_size)
            table = TokenTable.from_token_bytes(pieces)
        return table

    def finish(self, runs: list[EpisodeRun]) -> list[Trajectory]:
        """The trajectories: one `find_spans` call over all responses gives each round's ``mem_span``
        (`round_mem_span`); each carries its ``protocol_text`` (the memory's round and tool texts, in
        order, no chat glue), ``final_answer`` (its ``<answer>``) and ``rollout_logprobs`` (the
        backend's, None when a round had none); no outcome yet."""
        cfg = self.config
        batch = find_spans([run.response_ids for run in runs], self._span_table(runs), tags=self.tags) if runs else None
        trajectories = []
        for i, run in enumerate(runs):
            mem_spans = [s for s in batch.spans_of(i) if s.tag == "mem"]
            for round_, text in zip(run.rounds, run.round_texts):
                round_.mem_span = round_mem_span(round_.start, round_.end, text, mem_spans, self.tags)
            protocol_text = "".join(record.text for record in run.memory.records[1:])  # records[0]: the prompt
            trajectory = Trajectory(
                uid=run.uid, sample_index=run.sample_index, policy=cfg.context_policy, prompt_ids=run.prompt_ids,
                response_ids=run.response_ids, response_mask=run.response_mask, rounds=run.rounds,
                finish_reason=run.finish_reason or "malformed", golds=run.task.golds,
                example=dict(run.task.example) if run.task.example is not None else None,
                final_answer=extract_solution(protocol_text, self.tags), protocol_text=protocol_text,
                episode_id=run.task.id,
                rollout_logprobs=run.response_logprobs,
            )
            trajectories.append(trajectory)
        return trajectories


def rollout(backend: GenerationBackend, tokenizer: Any, tasks: Sequence[Any], *,
            tools: Union[Toolset, Mapping[str, Tool], Sequence[Tool], None] = None, retriever: Any = None,
            config: Optional[RolloutConfig] = None, **engine_options: Any) -> list[Trajectory]:
    """One-shot :class:`RolloutEngine` run (see it for the arguments; ``engine_options``: its
    ``seed``, ``max_context_tokens``, ``short_text_policy``)."""
    return RolloutEngine(backend, tokenizer, tools, retriever=retriever, config=config, **engine_options).run(tasks)
