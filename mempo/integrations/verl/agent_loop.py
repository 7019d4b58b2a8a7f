"""MemPO's agent loop inside verl: ``mempo_agent`` (training) and ``mempo_agent_eval`` (validation).

verl builds one loop per trajectory (``hydra.utils.instantiate`` of the ``agents.yaml`` entry, or of
the ``@register`` name, with the worker's ``trainer_config``, ``server_manager``, ``tokenizer``, ...)
and awaits ``run(sampling_params, **dataset_fields)``. ``run`` drives mempo's own agent loop
(`mempo.rollout.loop.RolloutEngine`: forced ``<mem>``, the tool calls, the tool results with loss mask
0, the memory context, token budgets, the C++ scanner's ``<mem>`` spans) on a worker thread, with a
generation backend that sends every round to verl's ``server_manager.generate`` (token ids in, token
ids out) on the worker's event loop. The tools (`mempo.integrations.verl.tools`) are the entry's
``env.tools`` (the built-in ``search`` / ``access``, mempo `Tool` s by import path) and verl's own
(``multi_turn.tool_config_path`` `BaseTool` s, ``function_tool_path`` functions), called in the entry's
``rollout.action_format``: ``tags`` (``<search>q</search>`` answered in ``<information>``) or ``json``
(Hermes / Qwen ``<tool_call>`` JSON, answered in ``<tool_response>``, the schemas in the system prompt).
Then:

* the outcome goes through verl's reward path: ``reward_score`` is left unset, so verl's reward loop
  scores the trajectory (a ``reward.custom_reward_function``, a reward model, or by default
  mempo's EM, `mempo.integrations.verl.reward`, on the protocol text the loop puts in
  ``extra_fields["mempo_protocol_text"]`` of its last output);
* ``mempo_agent`` teacher-scores the scored rounds through the same servers
  (`mempo.integrations.verl.server_scoring`); the results go to ``extra_fields`` (`fields.EXTRA_KEYS`,
  the same keys on every output, train or validation).

Start-up: a loop refuses to run (ConfigError naming ``trainer.v1.trainer_mode=mempo_sync``) unless the
trainer that consumes its rows is mempo's (`mempo.integrations.verl.run_config.consumer_problem`):
under verl's plain or asynchronous trainers the memory reward would be computed and dropped.

Lengths: the response (rounds + tool segments) never exceeds ``rollout.response_length`` (mempo's
``max_response_tokens``); a prompt longer than ``rollout.prompt_length`` is refused (verl would cut
it silently). Context policy "memory" under the V1 trainer returns one output per round (prompt =
that round's memory context, response = the round and its tool segment); the legacy trainer takes one
row per trajectory, so it refuses "memory" for training. The golds reach only the outcome and the
scoring requests, never a generation request.
"""
from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import (AgentLoopBase, AgentLoopMetrics, AgentLoopOutput,
                                                     _agent_loop_registry, register)

from mempo.config import ConfigError, EnvConfig, MempoConfig, RolloutConfig, ScoringConfig
from mempo.config.coerce import build_section
from mempo.env.build import build_retriever
from mempo.integrations.verl.fields import FORCED_SPANS_KEY, empty_extra_fields, memory_extra_fields
from mempo.integrations.verl.reward import (ACTION_FORMAT_KEY, PROMPT_KEY, PROTOCOL_TEXT_KEY, SCORE_MODE_KEY,
                                            TOOLS_KEY, gold_answers)
from mempo.integrations.verl.run_config import consumer_problem, forced_exclusion_problem, outcome_reward_problem
from mempo.integrations.verl.server_scoring import ServerScorer, forced_prefix_logprobs
from mempo.integrations.verl.tools import loop_toolset
from mempo.integrations.verl.version import check_verl_version
from mempo.protocol.memory import AgentMemory
from mempo.records.trajectory import Trajectory
from mempo.rollout.backends.base import GenerationOutput, GenerationRequest, SamplingParams
from mempo.rollout.backends.stopping import TokenBytes, action_closing_token_ids
from mempo.rollout.loop import RolloutEngine, RolloutStats, RolloutTask
from mempo.tools import Toolset

__all__ = ["ROLLOUT_KEYS", "ENV_KEYS", "SCORING_KEYS", "LoopSettings", "MemPOAgentLoop", "MemPOEvalAgentLoop",
           "loop_settings", "response_logprobs"]

#: the agent-loop YAML's accepted keys per section (everything else is verl's: sampling, lengths, n)
ROLLOUT_KEYS = ("max_turns", "max_new_tokens_per_round", "context_policy", "chat_template", "system_prompt",
                "forced_prefix", "train_forced_prefix", "stop_token_ids", "tool_workers", "score_mode",
                "action_format")
ENV_KEYS = ("tools", "tool_timeout", "tool_result_chars", "retriever", "retriever_url", "corpus_path", "topk",
            "doc_chars", "page_chars")
SCORING_KEYS = ("threshold", "comparator", "reward", "log_clip")
RETRIEVER_URL_ENV = "MEMPO_RETRIEVER_URL"
#: ``forced_logprobs``: the engine's prompt log-probs of the forced ids (exact at sampling temperature 1:
#: one prompt-logprob request per trajectory under context "full", per round under "memory"), or none
#: (they are left out of rollout correction: no extra request)
FORCED_LOGPROBS = ("engine", "exclude")


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """The validated YAML options of one agent-loop entry.

    rollout: mempo's rollout section (only `ROLLOUT_KEYS` come from the YAML; the lengths and the
    sampling are verl's). env: the retriever and tool limits. scoring: the memory-reward definition
    (None: no teacher scoring). max_concurrent_scoring: scoring requests in flight per trajectory.
    max_concurrent_trajectories: worker threads running mempo's loop in one verl worker process.
    forced_logprobs: where the trained forced ``<mem>`` ids' rollout log-probs come from (training
    loop only): "engine" (default; prompt-logprob requests, `FORCED_LOGPROBS`) or "exclude" (none:
    ``mempo_sync`` leaves them out of rollout correction).
    """

    rollout: RolloutConfig
    env: EnvConfig
    scoring: Optional[ScoringConfig]
    max_concurrent_scoring: int
    max_concurrent_trajectories: int
    forced_logprobs: str = "engine"


def _plain(value: Any) -> Any:
    """A hydra/OmegaConf node as plain Python containers."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _section(cls: type, data: Any, accepted: Sequence[str], path: str, **fixed: Any) -> Any:
    data = dict(_plain(data) or {})
    for key in data:
        if key not in accepted:
            raise ConfigError(f"{path}.{key}", f"is not an option of the verl agent loop; accepted: "
                                               f"{', '.join(accepted)}")
    return build_section(cls, {**data, **fixed}, path)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, f"must be an integer >= 1, got {value!r}")
    return value


@functools.lru_cache(maxsize=64)
def _settings_cached(key: str, entry: str, score_memory: bool, response_length: int) -> LoopSettings:
    options = json.loads(key)
    rollout = _section(RolloutConfig, options.get("rollout"), ROLLOUT_KEYS, f"{entry}.rollout", group_size=1,
                       max_response_tokens=response_length)
    env_data = _plain(options.get("env"))
    if env_data is None:
        url = os.environ.get(RETRIEVER_URL_ENV)
        if not url:
            raise ConfigError(f"{entry}.env", f"no retriever: give env.retriever_url (or env.corpus_path) in the "
                                              f"agent-loop YAML, or set {RETRIEVER_URL_ENV} (or give env.tools "
                                              "without search / access: [] for verl's tools only)")
        env_data = {"retriever": "http", "retriever_url": url}
    env = _section(EnvConfig, env_data, ENV_KEYS, f"{entry}.env")
    scoring = None
    if score_memory:
        scoring = _section(ScoringConfig, options.get("scoring"), SCORING_KEYS, f"{entry}.scoring")
    elif options.get("scoring") is not None:
        raise ConfigError(f"{entry}.scoring", "is read only with score_memory: true (this entry does no scoring)")
    forced = options.get("forced_logprobs")
    if forced is not None and not score_memory:
        raise ConfigError(f"{entry}.forced_logprobs", "is read only by the training loop (this entry's rows are "
                                                      "not trained)")
    if forced is not None and forced not in FORCED_LOGPROBS:
        raise ConfigError(f"{entry}.forced_logprobs", f"must be one of {', '.join(FORCED_LOGPROBS)}, got {forced!r}")
    return LoopSettings(rollout, env, scoring,
                        _positive_int(options.get("max_concurrent_scoring", 8), f"{entry}.max_concurrent_scoring"),
                        _positive_int(options.get("max_concurrent_trajectories", 256),
                                      f"{entry}.max_concurrent_trajectories"), forced or "engine")


def loop_settings(options: Mapping[str, Any], *, entry: str, score_memory: bool, response_length: int) -> LoopSettings:
    """`LoopSettings` of one agent-loop entry's YAML options (cached: verl builds a loop per trajectory).
    ConfigError naming ``<entry>.<section>.<key>`` for an unknown key or a bad value."""
    try:
        key = json.dumps({k: _plain(v) for k, v in options.items()}, sort_keys=True)
    except TypeError as error:
        raise ConfigError(entry, f"options must be plain YAML values: {error}") from None
    return _settings_cached(key, entry, bool(score_memory), int(response_length))


# ------------------------------------------------------------------------------------------------
# per-process shared state: the tools, the engines' tokenizer tables, the worker threads
# ------------------------------------------------------------------------------------------------
_LOCK = threading.Lock()
_TOOLS: dict[tuple, tuple[Toolset, tuple]] = {}
_ENGINES: dict[tuple, RolloutEngine] = {}
_EXECUTOR: list[ThreadPoolExecutor] = []


def _toolset(settings: LoopSettings, verl_tools: Sequence[Any], entry: str, *, checked: bool = False) -> Toolset:
    """The loop's tools (`mempo.integrations.verl.tools.loop_toolset`), built once per process per entry
    settings and verl tool list (verl loads its tools once per worker; a BM25 index loads once).
    checked: the names and schemas only, over a retriever that finds nothing (what a loop checks at
    construction, before any retriever is reached)."""
    env = settings.env
    key = (repr(sorted(dataclasses.asdict(env).items())), settings.rollout.action_format,
           tuple(id(t) for t in verl_tools), entry, checked)
    with _LOCK:
        found = _TOOLS.get(key)
        if found is None:
            retriever = None if checked else build_retriever(MempoConfig(env=env))
            toolset = loop_toolset(env, settings.rollout.action_format, verl_tools, retriever, entry=entry)
            found = _TOOLS[key] = (toolset, tuple(verl_tools))  # the verl tools kept: their ids are in the key
        return found[0]


def _executor(threads: int) -> ThreadPoolExecutor:
    with _LOCK:
        if not _EXECUTOR:
            _EXECUTOR.append(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mempo-verl-loop"))
        return _EXECUTOR[0]


class _ServerBackend:
    """mempo's `GenerationBackend` over verl's ``server_manager.generate``, called from a worker thread:
    each request is a coroutine on the verl worker's event loop (``max_tokens`` = the round's limit,
    ``stop_token_ids`` = the loop's stop ids + the ids that close an action block; verl's sampling
    parameters as given). The ids come back as generated (mempo's ``cut_round`` cuts the round)."""

    def __init__(self, server_manager: Any, loop: asyncio.AbstractEventLoop, request_id: str,
                 sampling_params: Mapping[str, Any], action_stop_ids: Sequence[int]) -> None:
        self.server_manager, self.loop, self.request_id = server_manager, loop, request_id
        self.sampling_params = dict(sampling_params)
        self.action_stop_ids = tuple(action_stop_ids)
        self.seconds = 0.0
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        outputs = []
        for request in requests:
            params = dict(self.sampling_params, max_tokens=int(request.max_new_tokens),
                          stop_token_ids=list(dict.fromkeys([*request.stop_token_ids, *self.action_stop_ids])))
            began = time.perf_counter()
            future = asyncio.run_coroutine_threadsafe(
                self.server_manager.generate(self.request_id, prompt_ids=list(request.prompt_ids),
                                             sampling_params=params), self.loop)
            output = future.result()
            self.seconds += time.perf_counter() - began
            self.calls += 1
            if getattr(output, "stop_reason", None) == "aborted":
                raise RuntimeError("the inference server aborted a generation request (a weight sync during the "
                                   "rollout?); mempo_agent supports verl's sync trainer modes only")
            logprobs = None if output.log_probs is None else [float(v) for v in output.log_probs]
            outputs.append(GenerationOutput(list(output.token_ids), str(getattr(output, "stop_reason", None)),
                                            logprobs=logprobs))
        return outputs

    def sync_weights(self, weights: Any = None) -> None:
        raise RuntimeError("verl syncs the servers' weights itself")


def response_logprobs(trajectory: Trajectory) -> list[float]:
    """The rollout log-prob of every response id (verl's ``response_logprobs``): the servers' sampled
    log-probs the loop kept with each round's ids (`Trajectory.rollout_logprobs`); the forced prefix
    (prompt input of its round's request: the server reports nothing for it) and the tool segments
    (mask 0) get 0.0 here, and `MemPOAgentLoop.run` puts the forced ids' own log-probs in
    (`forced_prefix_logprobs`). RuntimeError when the server sent no log-probs for a round."""
    if trajectory.rollout_logprobs is None:
        raise RuntimeError("actor_rollout_ref.rollout.calculate_log_probs is true but the inference server "
                           "returned no log-probs for a generated round")
    return list(trajectory.rollout_logprobs)


def trained_forced_spans(trajectory: Trajectory) -> list[tuple[int, int]]:
    """Response offsets ``[start, start + prefix_len)`` of every round's forced prefix that carries loss
    (``rollout.train_forced_prefix``): the ids whose rollout log-prob the trainer's correction reads."""
    return [(r.start, r.start + r.prefix_len) for r in trajectory.rounds
            if r.prefix_len > 0 and trajectory.response_mask[r.start] == 1]


def _question(raw_prompt: Any) -> tuple[str, Optional[str]]:
    """(question, system prompt or None) of the dataset's chat messages: at most one system message and
    exactly one user message (the question); ValueError naming the field otherwise."""
    messages = list(_plain(raw_prompt) or [])
    users = [m for m in messages if m.get("role") == "user"]
    systems = [m for m in messages if m.get("role") == "system"]
    if len(users) != 1 or len(systems) > 1 or len(users) + len(systems) != len(messages):
        roles = [m.get("role") for m in messages]
        raise ValueError(f"raw_prompt must hold one user message (the question) and at most one system message, "
                         f"got roles {roles}")
    return str(users[0]["content"]), (str(systems[0]["content"]) if systems else None)


def _check_no_tool_options(sample: Mapping[str, Any]) -> None:
    """ValueError naming the dataset field when a sample asks for per-sample tool options, which the
    mempo loops do not apply: ``tools_kwargs`` (a verl tool's ``create_kwargs``, which can carry the
    sample's gold into a tool and so into an observation) or ``extra_info.tool_selection``."""
    if _plain(sample.get("tools_kwargs")):
        raise ValueError("the sample has tools_kwargs (extra_info.tools_kwargs); the mempo loops create every verl "
                         "tool with empty create_kwargs (they could carry the gold into an observation): drop them")
    extra_info = _plain(sample.get("extra_info")) or {}
    if isinstance(extra_info, Mapping) and extra_info.get("tool_selection"):
        raise ValueError("the sample has extra_info.tool_selection; the mempo loops give every sample all the "
                         "entry's tools: drop it, or make an agent-loop entry per tool set")


def _golds(reward_model: Any) -> Any:
    """The golds of ``reward_model.ground_truth`` (`mempo.integrations.verl.reward.gold_answers`): the
    gold answer string (or aliases, per-objective lists, ``{"target": ...}``); ValueError without."""
    reward_model = _plain(reward_model) or {}
    return gold_answers(reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None)


class MemPOAgentLoop(AgentLoopBase):
    """``mempo_agent``: MemPO's protocol against verl's servers, with teacher scoring.

    YAML options (each section validated by mempo's typed config; unknown keys refused by name):
    ``rollout`` (`ROLLOUT_KEYS`: max_turns, max_new_tokens_per_round, context_policy, chat_template,
    system_prompt, forced_prefix, train_forced_prefix, stop_token_ids, tool_workers, score_mode,
    action_format), ``env`` (`ENV_KEYS`: tools, tool_timeout, tool_result_chars; retriever "http" +
    retriever_url, or "bm25" + corpus_path; topk, doc_chars, page_chars; without it
    ``$MEMPO_RETRIEVER_URL``), ``scoring`` (`SCORING_KEYS`: threshold,
    comparator, reward, log_clip), ``max_concurrent_scoring`` (8), ``max_concurrent_trajectories``
    (256), ``forced_logprobs`` ("engine" or "exclude", `FORCED_LOGPROBS`). verl's tools (the
    ``tools`` argument verl's worker passes) follow ``env.tools``. After ``run`` the loop
    keeps ``trajectory`` (the mempo `Trajectory`; its outcome is scored by verl's reward path) and
    ``memory_rewards`` (one entry per scored round).
    """

    score_memory = True
    entry_name = "mempo_agent"

    def __init__(self, *args: Any, rollout: Any = None, env: Any = None, scoring: Any = None,
                 max_concurrent_scoring: int = 8, max_concurrent_trajectories: int = 256,
                 forced_logprobs: Optional[str] = None, name: Optional[str] = None, tools: Any = None,
                 **kwargs: Any) -> None:
        check_verl_version()
        super().__init__(*args, **kwargs)
        consumer = consumer_problem(self.config)
        if consumer:  # before any generation or scoring is paid for
            raise ConfigError("", consumer)
        reward = outcome_reward_problem(self.config)
        if reward:
            raise ConfigError("", reward)
        entry = self.entry = name or self.entry_name
        options = {"rollout": rollout, "env": env, "scoring": scoring,
                   "max_concurrent_scoring": max_concurrent_scoring,
                   "max_concurrent_trajectories": max_concurrent_trajectories, "forced_logprobs": forced_logprobs}
        self.settings = loop_settings(options, entry=entry, score_memory=self.score_memory,
                                      response_length=int(self.rollout_config.response_length))
        self.prompt_length = int(self.rollout_config.prompt_length)
        trainer = self.config.get("trainer", None) or {}
        if self.score_memory and self.settings.rollout.context_policy == "memory" and not trainer.get("use_v1", True):
            raise ConfigError(f"{entry}.rollout.context_policy", "'memory' trains one row per round, which needs "
                                                                 "verl's V1 trainer (trainer.use_v1=true)")
        forced = forced_exclusion_problem(self.config, self.settings.rollout, self.settings.forced_logprobs) \
            if self.score_memory else None
        if forced:
            raise ConfigError(f"{entry}.rollout.train_forced_prefix", forced)
        # verl's tools of this worker (tool_config_path / function_tool_path), as verl hands them to every loop
        self.verl_tools = list(tools.tools) if tools is not None else []
        _toolset(self.settings, self.verl_tools, entry, checked=True)  # names and schemas, before any request
        self.trajectory: Optional[Trajectory] = None
        self.memory_rewards: list[Optional[float]] = []

    # -- the engine --------------------------------------------------------------------------------
    def _engine(self, backend: Optional[_ServerBackend], system_prompt: Optional[str]) -> RolloutEngine:
        """The engine of one trajectory: a copy of this process's engine for the entry and its tools (the
        chat-template check and the tokenizer's byte table made once), with `backend` and the dataset's
        system message (None: the entry's ``system_prompt``), followed by the tools' schemas in the json
        format."""
        settings = self.settings
        toolset = _toolset(settings, self.verl_tools, self.entry)
        max_context = self.rollout_config.get("max_model_len", None) or (
            self.prompt_length + int(self.rollout_config.response_length))
        key = (id(self.tokenizer), repr(settings), int(max_context), id(toolset))
        with _LOCK:
            template = _ENGINES.get(key)
        if template is None:  # the chat template check and the tokenizer's byte table, once per process
            template = RolloutEngine(backend, self.tokenizer, toolset, config=settings.rollout,
                                     max_context_tokens=int(max_context))
            with _LOCK:
                _ENGINES[key] = template
        engine = copy.copy(template)
        engine.backend, engine.stats, engine._calls = backend, RolloutStats(), 0
        if system_prompt is not None and system_prompt != settings.rollout.system_prompt:
            engine.config = dataclasses.replace(settings.rollout, system_prompt=system_prompt)
            engine.system_prompt = system_prompt if settings.rollout.action_format == "tags" \
                else toolset.system_prompt(system_prompt)
        return engine

    # -- run ---------------------------------------------------------------------------------------
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """One trajectory of the sample (``raw_prompt``, ``reward_model.ground_truth``, ``uid``): one
        `AgentLoopOutput`, or one per round (context policy "memory" under the V1 trainer)."""
        rollout = self.settings.rollout
        multi_output = rollout.context_policy == "memory" and self.score_memory
        if multi_output and "session_id" not in kwargs:
            raise ConfigError(f"{self.entry_name}.rollout.context_policy",
                              "'memory' trains one row per round, which needs verl's V1 trainer (trainer.use_v1=true);"
                              " the legacy trainer takes one row per trajectory")
        question, system_prompt = _question(kwargs.get("raw_prompt"))
        _check_no_tool_options(kwargs)
        golds = _golds(kwargs.get("reward_model")) if self.score_memory else None  # teacher scoring's answer only
        request_id = uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        engine = self._engine(None, system_prompt)
        backend = engine.backend = _ServerBackend(self.server_manager, loop, request_id, sampling_params,
                                                  action_closing_token_ids(TokenBytes.of(self.tokenizer), engine.tags))
        memory = AgentMemory(question, system_prompt=engine.system_prompt)
        self._check_prompt(engine.chat.prompt_ids(memory.messages("full")), "the prompt")  # before any generation
        task = RolloutTask(str(kwargs.get("uid", request_id)), question, golds)
        [trajectory] = await loop.run_in_executor(_executor(self.settings.max_concurrent_trajectories),
                                                  functools.partial(engine.run, [task], group_size=1))
        rewards: list[Optional[float]] = []
        details: list = []
        if self.settings.scoring is not None:
            scorer = ServerScorer(self.server_manager, self.tokenizer, self.settings.scoring,
                                  self.settings.max_concurrent_scoring)
            rewards, details = await scorer.score(trajectory, request_id)
        self.trajectory, self.memory_rewards = trajectory, rewards
        metrics = AgentLoopMetrics(generate_sequences=backend.seconds, tool_calls=engine.stats.tool_seconds)
        common = {
            "mempo_p_mem": [float(d.p_mem) for d in details], "mempo_p_full": [float(d.p_cmp) for d in details],
            "mempo_scored_rounds": [int(d.round_index) for d in details], "mempo_rounds": len(trajectory.rounds),
            "mempo_finish_reason": trajectory.finish_reason, SCORE_MODE_KEY: rollout.score_mode,
            ACTION_FORMAT_KEY: rollout.action_format, TOOLS_KEY: list(engine.toolset.names),
        }
        # what the reward function scores, and the question its example holds (last output)
        last = {PROTOCOL_TEXT_KEY: trajectory.protocol_text or "", PROMPT_KEY: question}
        scored = trajectory.scored_rounds()
        logprobs, excluded = None, []
        if sampling_params.get("logprobs"):
            logprobs, excluded = await self._rollout_logprobs(trajectory, sampling_params, request_id)
        common[FORCED_SPANS_KEY] = [list(span) for span in excluded]
        if not multi_output:
            extra = {**empty_extra_fields(), **common, **last,
                     **memory_extra_fields(rewards, [r.mem_span for r in scored][:len(rewards)])}
            return AgentLoopOutput(prompt_ids=trajectory.prompt_ids, response_ids=trajectory.response_ids,
                                   response_mask=trajectory.response_mask, response_logprobs=logprobs,
                                   num_turns=self._num_turns(trajectory), metrics=metrics, extra_fields=extra)
        outputs = self._round_outputs(trajectory, rewards, metrics, common, logprobs)
        outputs[-1].extra_fields.update(last)
        return outputs

    async def _rollout_logprobs(self, trajectory: Trajectory, sampling_params: Mapping[str, Any], request_id: str
                                ) -> tuple[list[float], list[tuple[int, int]]]:
        """(rollout log-prob of every response id, the trained forced spans left out of rollout correction).

        Generated ids: the servers' sampled log-probs. Trained forced ids (the validation loop's rows
        are not trained: skipped): the engine's own prompt log-probs at temperature 1
        (`forced_prefix_logprobs`), exact when verl samples at temperature 1. At another temperature
        the engines' prompt log-probs are not the sampling distribution's, so (as with
        ``forced_logprobs: exclude``, which saves those requests) the spans are returned as excluded:
        0.0 in the list, and ``mempo_sync`` gives them the trainer's log-prob (IS weight 1) and keeps
        them out of the correction's metrics."""
        logprobs = response_logprobs(trajectory)
        forced = trained_forced_spans(trajectory) if self.score_memory else []
        if not forced:
            return logprobs, []
        if self.settings.forced_logprobs == "exclude" or float(sampling_params.get("temperature", 1.0)) != 1.0:
            return logprobs, forced
        values = await forced_prefix_logprobs(self.server_manager, trajectory, request_id, forced,
                                              self.settings.max_concurrent_scoring)
        for (start, end), span_values in zip(forced, values):
            logprobs[start:end] = span_values
        return logprobs, []

    def _round_outputs(self, trajectory: Trajectory, rewards: Sequence[Optional[float]], metrics: AgentLoopMetrics,
                       common: dict[str, Any], logprobs: Optional[list[float]]) -> list[AgentLoopOutput]:
        """One output per round: prompt = the round's memory context, response = the round's ids and its
        tool segment; the round's own scored ``<mem>`` span (if any) in that row's coordinates."""
        reward_of = {r.index: value for r, value in zip(trajectory.scored_rounds(), rewards)}
        outputs = []
        for round_ in trajectory.rounds:
            prompt = trajectory.round_context_ids(round_)
            self._check_prompt(prompt, f"the memory context of round {round_.index}")
            lo, hi = round_.start, round_.tool_end
            has = round_.index in reward_of
            memory = memory_extra_fields([reward_of[round_.index]] if has else [],
                                         [round_.mem_span] if has else [], offset=lo)
            memory[FORCED_SPANS_KEY] = [[a - lo, b - lo] for a, b in common[FORCED_SPANS_KEY] if lo <= a < hi]
            outputs.append(AgentLoopOutput(
                prompt_ids=prompt, response_ids=trajectory.response_ids[lo:hi],
                response_mask=trajectory.response_mask[lo:hi],
                response_logprobs=None if logprobs is None else logprobs[lo:hi],
                num_turns=2 + int(hi > round_.end), metrics=metrics,
                extra_fields={**empty_extra_fields(), **common, **memory}))
        return outputs

    def _check_prompt(self, prompt_ids: Sequence[int], what: str) -> None:
        if len(prompt_ids) > self.prompt_length:
            raise ValueError(f"{what} has {len(prompt_ids)} ids, more than actor_rollout_ref.rollout.prompt_length="
                             f"{self.prompt_length} (verl would cut it silently); raise data.max_prompt_length")

    @staticmethod
    def _num_turns(trajectory: Trajectory) -> int:
        """verl's count: the user turn, every assistant round and every tool result."""
        return 1 + len(trajectory.rounds) + sum(r.tool_end > r.end for r in trajectory.rounds)


class MemPOEvalAgentLoop(MemPOAgentLoop):
    """``mempo_agent_eval``: the same protocol for validation, without teacher scoring (verl does not
    tell a loop whether its batch is validation, so it is a second name). Its outputs carry every
    `fields.EXTRA_KEYS` key (empty memory lists) and a whole trajectory per output whatever the
    context policy."""

    score_memory = False
    entry_name = "mempo_agent_eval"


for _name, _cls in (("mempo_agent", MemPOAgentLoop), ("mempo_agent_eval", MemPOEvalAgentLoop)):
    if _name not in _agent_loop_registry:  # an agent_loop_config_path entry of that name (with options) wins
        register(_name)(_cls)
