"""The trained agent as a service: questions in at any time, the memory loop run as `mempo eval`
runs it, rounds out as they finish, then the answer.

`AgentService` drives `mempo.rollout.loop.RolloutEngine`'s step API (`start_run`, `next_request`,
`accept_generation`, `call_tool`, `accept_tool`, `finish`: the code `RolloutEngine.run` runs for
training and evaluation) from one model thread: every pass sends every episode waiting for its next
round to the backend as one batch (episodes of different requests share batches round by round; one
never waits for another's whole episode), and the tool calls run on a thread pool meanwhile. The
settings are the evaluation's (`serving_rollout_config`: `mempo.eval.eval_rollout_config` under the
first of ``eval.policies``: same chat template, context policy, stop rules, greedy by
``eval.temperature``), so a served answer equals `mempo eval`'s for the same question and model
under greedy decoding. A plain question is laid out as the config's episodes are (`mempo.env.data.user_turn`:
the question list and its closing line, ``synthetic.world_prompt_style``'s layout for the demo's
world), so it reaches the model as training showed it questions. A request may lower or raise (within the
service's bounds) the temperature, top-p, the tokens per round and the number of rounds (`AgentOptions`). A
question is all a request gives: no gold answer ever reaches generation. A failing retriever is a tool error
in the rounds (`RolloutEngine.call_tool`); a failing backend fails the requests of that batch, and the
service keeps serving.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from mempo.config import MempoConfig, RolloutConfig
from mempo.env.build import build_tools
from mempo.errors import MempoError
from mempo.env.data import check_question, user_turn
from mempo.eval.episodes import eval_rollout_config, prompt_style
from mempo.eval.run import model_context_tokens
from mempo.protocol.grammar import parse_round
from mempo.records.trajectory import Trajectory
from mempo.rollout.backends.base import GenerationBackend, SamplingParams
from mempo.rollout.loop import EpisodeRun, RolloutEngine
from mempo.seeds import generation_seed

__all__ = ["AgentOptions", "AgentRound", "AgentAnswer", "AgentTicket", "AgentService", "AgentError",
           "DeadlineExceeded", "ServiceClosed", "check_agent_options", "serving_rollout_config"]

#: How many recent batch sizes `AgentService.batch_sizes` keeps (a server runs for days).
RECENT_BATCHES = 10_000

#: A round callback: called on the model thread for each finished round, in order (keep it short).
RoundCallback = Callable[["AgentRound"], None]


class AgentError(MempoError):
    """A request the agent could not answer (the backend failed, the service closed, ...)."""


class DeadlineExceeded(AgentError):
    """The request's deadline passed before its episode ended."""


class ServiceClosed(AgentError):
    """The service was closed before the request's episode ended."""


def serving_rollout_config(cfg: MempoConfig, policy: Optional[str] = None) -> RolloutConfig:
    """The loop's settings of a served question: the evaluation's (`eval_rollout_config`) under
    `policy`, default the first of ``cfg.eval.policies`` (``"memory"`` by default: the paper's
    inference context)."""
    return eval_rollout_config(cfg, policy or cfg.eval.policies[0])


@dataclass(frozen=True)
class AgentOptions:
    """One request's settings; None keeps the service's (the evaluation's). temperature (>= 0, 0
    greedy) and top_p (in (0, 1]) sample every round; max_new_tokens: ids per round (>= 1);
    max_turns: rounds (1..the service's ``max_turns_limit``); deadline_s: seconds from submission
    after which the request fails with `DeadlineExceeded` (None: the service's)."""

    temperature: Optional[float] = None
    top_p: Optional[float] = None
    max_new_tokens: Optional[int] = None
    max_turns: Optional[int] = None
    deadline_s: Optional[float] = None


@dataclass
class AgentRound:
    """One finished round as the model saw and wrote it: ``assistant`` (the forced ``<mem>`` and the
    generated text, decoded), ``memory`` (its ``<mem>`` content), ``action`` / ``argument`` (the
    search query, the accessed page, the answer; None: no closed action), ``stop_reason``;
    ``tool_result``: the tool's text as appended to the context (decoded ids; None: no call),
    ``tool_ok`` / ``tool_error``; token counts: ``prompt_tokens`` (the context the round was
    generated from, forced prefix excluded, as `mempo.eval.round_prompt_tokens` counts),
    ``generated_tokens`` (the round's ids, forced prefix included) and ``tool_tokens`` (the tool
    segment's ids, chat glue included)."""

    index: int
    assistant: str
    memory: Optional[str]
    action: Optional[str]
    argument: Optional[str]
    stop_reason: str
    tool_result: Optional[str]
    tool_ok: Optional[bool]
    tool_error: Optional[str]
    prompt_tokens: int
    generated_tokens: int
    tool_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class AgentAnswer:
    """A finished episode: ``answer`` (the final ``<answer>`` text; None: none given), its rounds,
    the loop's ``finish_reason`` (``"answer"``, ``"turn_limit"``, ``"token_budget"``,
    ``"malformed"``), token totals over the rounds and the wall ``seconds`` from submission."""

    answer: Optional[str]
    rounds: list[AgentRound]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    trajectory: Optional[Trajectory] = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"answer": self.answer, "finish_reason": self.finish_reason, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "seconds": self.seconds,
                "rounds": [r.to_dict() for r in self.rounds]}


def check_agent_options(options: AgentOptions, max_turns_limit: Optional[int] = None) -> None:
    """ValueError naming the option when `options` is out of range (max_turns at most
    `max_turns_limit` when given); needs no model, so a command checks its flags before loading one."""
    def number(name: str, value: Any, ok: Callable[[float], bool], rule: str) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or not ok(value)):
            raise ValueError(f"{name} must be {rule}, got {value!r}")

    number("temperature", options.temperature, lambda v: v >= 0, "a number >= 0")
    number("top_p", options.top_p, lambda v: 0 < v <= 1, "a number in (0, 1]")
    number("deadline_s", options.deadline_s, lambda v: v > 0, "a number of seconds > 0")
    for name, value, top in (("max_new_tokens", options.max_new_tokens, None),
                             ("max_turns", options.max_turns, max_turns_limit)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (top is not None and value > top):
            bound = f" and <= {top}" if top is not None else ""
            raise ValueError(f"{name} must be an integer >= 1{bound}, got {value!r}")


class AgentTicket:
    """A submitted question: `result` waits for the `AgentAnswer` (or raises the `AgentError`);
    `future` is the same as a `concurrent.futures.Future`; `cancel` drops the episode at its next
    round (a client that went away); `rounds` are the rounds finished so far."""

    def __init__(self, question: str, prompt: str, options: AgentOptions, on_round: Optional[RoundCallback],
                 deadline: Optional[float]) -> None:
        self.question, self.prompt = question, prompt  # the user's message; the user turn the model reads
        self.options, self.on_round, self.deadline = options, on_round, deadline
        self.future: Future = Future()
        self.rounds: list[AgentRound] = []
        self.submitted = time.monotonic()
        self.cancelled = False

    def result(self, timeout: Optional[float] = None) -> AgentAnswer:
        return self.future.result(timeout)

    def cancel(self) -> None:
        self.cancelled = True

    def done(self) -> bool:
        return self.future.done()


class _Episode:
    """A ticket's run inside the scheduler."""

    def __init__(self, ticket: AgentTicket, run: EpisodeRun, sampling: tuple[float, float]) -> None:
        self.ticket, self.run, self.sampling = ticket, run, sampling
        self.waiting_for_tool = False
        self.dropped = False


class AgentService:
    """Runs questions through the agent loop on one model thread (module docstring).

    Args:
        engine: the `RolloutEngine` (backend, tokenizer, tools, settings: `serving_rollout_config`).
        max_batch_size: most episodes per backend call (None: every waiting one).
        max_turns_limit: the most rounds a request may ask for (default: the engine's ``max_turns``).
        deadline_s: default seconds a request may take (None: no deadline).
        gather_s: how long the model thread waits for more arrivals before a batch that has room.
        prompt_style: the layout of a question's user turn (`mempo.env.data.user_turn`; None: the
            question is the user turn as it is).

    ``batch_sizes`` holds the batch sizes of the last `RECENT_BATCHES` backend calls, in order, and
    ``generation_batches`` / ``generated_rounds`` count all calls and the rounds they generated
    (``/health``, the benchmark and the tests read them; written on the model thread only).
    """

    def __init__(self, engine: RolloutEngine, *, max_batch_size: Optional[int] = None,
                 max_turns_limit: Optional[int] = None, deadline_s: Optional[float] = None,
                 gather_s: float = 0.002, prompt_style: Optional[str] = None) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0 or None, got {deadline_s}")
        self.engine = engine
        self.config = engine.config
        self.max_batch_size = max_batch_size
        self.max_turns_limit = int(max_turns_limit or engine.config.max_turns)
        self.deadline_s = deadline_s
        self.gather_s = float(gather_s)
        self.prompt_style = prompt_style
        self.batch_sizes: deque[int] = deque(maxlen=RECENT_BATCHES)
        self.generation_batches = 0
        self.generated_rounds = 0
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._tools = ThreadPoolExecutor(max_workers=engine.config.tool_workers, thread_name_prefix="mempo-agent-tool")
        self._calls = itertools.count()
        self._closed = threading.Event()
        self._live: list[_Episode] = []  # the model thread's only
        self._thread = threading.Thread(target=self._loop, name="mempo-agent-model", daemon=True)
        self._thread.start()

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: MempoConfig, model: Any, tokenizer: Any, retriever: Any, backend: GenerationBackend,
                    *, policy: Optional[str] = None, **options: Any) -> "AgentService":
        """The service `mempo serve` and `mempo ask` run: the tools of ``cfg.env`` over `retriever`
        (`build_tools`), `serving_rollout_config`, the model's context bound (as `mempo eval`), the
        config's question layout (`prompt_style`), and `options` (this class's keywords)."""
        engine = RolloutEngine(backend, tokenizer, build_tools(cfg, retriever),
                               config=serving_rollout_config(cfg, policy),
                               max_context_tokens=model_context_tokens(model))
        return cls(engine, **{"prompt_style": prompt_style(cfg), **options})

    # -- public ------------------------------------------------------------------------------------
    def check_options(self, options: AgentOptions) -> None:
        """ValueError naming the option when `options` is out of range (`check_agent_options`, with
        this service's ``max_turns_limit``)."""
        check_agent_options(options, self.max_turns_limit)

    def submit(self, question: str, options: AgentOptions = AgentOptions(), *,
               on_round: Optional[RoundCallback] = None) -> AgentTicket:
        """Start an episode of `question` (the user's message, laid out as ``prompt_style`` says:
        `mempo.env.data.user_turn`; nothing else reaches the model); returns at once. ValueError
        for an empty question, one the layout cannot hold, or bad options, `mempo.env.data.DataError`
        (a ValueError) for a question the agent cannot take (`check_question`: longer than
        `MAX_QUESTION_CHARS` characters, or not encodable, e.g. a lone surrogate; lines are allowed);
        `ServiceClosed` after `close`."""
        if not isinstance(question, str) or not question.strip():
            raise ValueError("the question is empty")
        check_question(question, "question", one_line=False)
        prompt = question if self.prompt_style is None else user_turn(question, self.prompt_style)
        self.check_options(options)
        if self._closed.is_set():
            raise ServiceClosed("the agent service is closed")
        deadline_s = options.deadline_s if options.deadline_s is not None else self.deadline_s
        ticket = AgentTicket(question, prompt, options, on_round,
                             None if deadline_s is None else time.monotonic() + deadline_s)
        self._inbox.put(("start", ticket))
        return ticket

    def answer(self, question: str, options: AgentOptions = AgentOptions(), *,
               on_round: Optional[RoundCallback] = None) -> AgentAnswer:
        """`submit` and wait for the answer (raises the request's `AgentError`)."""
        return self.submit(question, options, on_round=on_round).result()

    def close(self, timeout: float = 10.0) -> None:
        """Fail every unfinished request with `ServiceClosed`, stop the model thread and the tool pool."""
        self._closed.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout)
        self._tools.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "AgentService":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- the model thread --------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            try:
                self._pass()
            except Exception as error:  # a bug must not leave requests waiting for ever: fail them, go on
                for episode in self._live:
                    self._fail(episode, AgentError(f"internal error: {type(error).__name__}: {error}"))
            self._live = [e for e in self._live if not e.dropped]
            if self._closed.is_set():
                for episode in self._live:
                    self._fail(episode, ServiceClosed("the agent service was closed before the answer"))
                return

    def _pass(self) -> None:
        """One pass of the model thread: take new requests and tool results, drop expired or
        cancelled episodes, generate the next round of every ready one (`_live`: the episodes not
        yet answered or failed; new ones are appended to it as they arrive)."""
        episodes = self._live
        ready = [e for e in episodes if not e.waiting_for_tool]
        self._drain(episodes, block=not ready, timeout=self._next_deadline(episodes))
        if self._closed.is_set():
            return
        self._expire(episodes)
        ready = [e for e in episodes if not e.waiting_for_tool and not e.dropped]
        if not ready:
            return
        if self.gather_s > 0 and (self.max_batch_size is None or len(ready) < self.max_batch_size):
            time.sleep(self.gather_s)  # let requests arriving together share this batch
            self._drain(episodes, block=False)
            ready = [e for e in episodes if not e.waiting_for_tool and not e.dropped]
        for sampling, group in _groups(ready).items():
            size = self.max_batch_size or len(group)
            for begin in range(0, len(group), size):
                self._step(group[begin:begin + size], sampling)

    def _drain(self, episodes: list[_Episode], *, block: bool, timeout: Optional[float] = None) -> None:
        """Take every message in the inbox (waiting for the first when `block`, at most `timeout` s)."""
        first = True
        while True:
            try:
                kind, *payload = self._inbox.get(block=block and first, timeout=timeout if block and first else None)
            except queue.Empty:
                return
            first = False
            if kind == "start":
                episode = self._start(payload[0])
                if episode is not None:
                    episodes.append(episode)
            elif kind == "tool":
                self._tool_done(*payload)

    def _next_deadline(self, episodes: list[_Episode]) -> Optional[float]:
        deadlines = [e.ticket.deadline for e in episodes if e.ticket.deadline is not None]
        return max(0.0, min(deadlines) - time.monotonic()) + 0.001 if deadlines else None

    def _start(self, ticket: AgentTicket) -> Optional[_Episode]:
        options, cfg = ticket.options, self.config
        try:
            run = self.engine.start_run({"id": f"request-{next(self._calls)}", "prompt": ticket.prompt},
                                        max_turns=options.max_turns, max_new_tokens=options.max_new_tokens)
        except Exception as error:  # a prompt the chat template cannot render, ...
            ticket.future.set_exception(AgentError(f"cannot start the episode: {type(error).__name__}: {error}"))
            return None
        sampling = (float(cfg.temperature if options.temperature is None else options.temperature),
                    float(cfg.top_p if options.top_p is None else options.top_p))
        return _Episode(ticket, run, sampling)

    def _expire(self, episodes: list[_Episode]) -> None:
        now = time.monotonic()
        for episode in episodes:
            ticket = episode.ticket
            if ticket.cancelled:
                self._fail(episode, AgentError("the request was cancelled"))
            elif ticket.deadline is not None and now >= ticket.deadline:
                self._fail(episode, DeadlineExceeded(
                    f"the request's deadline passed after {now - ticket.submitted:.1f} s and "
                    f"{len(episode.run.rounds)} round(s)"))

    def _step(self, group: list[_Episode], sampling: tuple[float, float]) -> None:
        """One backend call for `group`'s next rounds, then their tool calls submitted."""
        requests, waiting = [], []
        for episode in group:
            request = self.engine.next_request(episode.run)
            if request is None:  # no room for another round
                self._complete(episode)
            else:
                requests.append(request)
                waiting.append(episode)
        if not requests:
            return
        temperature, top_p = sampling
        params = SamplingParams(temperature, top_p, self.config.top_k,
                                seed=generation_seed(self.engine.seed, 0, self.generation_batches))
        self.batch_sizes.append(len(requests))
        self.generation_batches += 1
        self.generated_rounds += len(requests)
        try:
            outputs = self.engine.backend.generate(requests, params)
            if len(outputs) != len(requests):
                raise RuntimeError(f"the backend returned {len(outputs)} outputs for {len(requests)} requests")
        except Exception as error:  # the service keeps serving; these requests fail
            for episode in waiting:
                self._fail(episode, AgentError(f"generation failed: {type(error).__name__}: {error}"))
            return
        for episode, output in zip(waiting, outputs):
            call = self.engine.accept_generation(episode.run, output.token_ids)
            if call is None:
                self._emit(episode, None)
                self._complete(episode)
                continue
            episode.waiting_for_tool = True
            future = self._tools.submit(self.engine.call_tool, *call)
            future.add_done_callback(lambda done, e=episode: self._inbox.put(("tool", e, done)))

    def _tool_done(self, episode: _Episode, done: Future) -> None:
        if episode.dropped:
            return
        try:
            result = done.result()
        except BaseException as error:  # call_tool turns tool errors into results; this is the pool shutting down
            self._fail(episode, AgentError(f"the tool call did not run: {type(error).__name__}: {error}"))
            return
        self.engine.accept_tool(episode.run, result)
        episode.waiting_for_tool = False
        self._emit(episode, result)
        if episode.run.done:
            self._complete(episode)

    def _emit(self, episode: _Episode, tool_result: Any) -> None:
        """The run's last round as an `AgentRound`, kept on the ticket and given to its callback."""
        run = episode.run
        record = run.rounds[-1]
        text = run.round_texts[-1]
        information = None
        if record.information is not None:
            information = self.engine.chat.decode(run.response_ids[record.information[0]:record.information[1]])
        prompt_tokens = len(record.prompt_ids) if record.prompt_ids is not None else len(run.prompt_ids) + record.start
        error = None if tool_result is None or tool_result.ok else str(tool_result.metadata.get("error", "tool error"))
        round_ = AgentRound(
            index=record.index, assistant=text, memory=parse_round(text, self.engine.tags).mem, action=record.action,
            argument=record.action_argument, stop_reason=record.stop_reason, tool_result=information,
            tool_ok=record.tool_ok, tool_error=error, prompt_tokens=prompt_tokens,
            generated_tokens=record.end - record.start, tool_tokens=record.tool_end - record.end)
        episode.ticket.rounds.append(round_)
        if episode.ticket.on_round is not None:
            try:
                episode.ticket.on_round(round_)
            except Exception:  # a caller's callback must not stop the model thread
                episode.ticket.cancel()

    def _complete(self, episode: _Episode) -> None:
        episode.dropped = True
        ticket = episode.ticket
        trajectory = self.engine.finish([episode.run])[0]
        answer = AgentAnswer(
            answer=trajectory.final_answer, rounds=list(ticket.rounds), finish_reason=trajectory.finish_reason,
            prompt_tokens=sum(r.prompt_tokens for r in ticket.rounds),
            completion_tokens=sum(r.generated_tokens for r in ticket.rounds),
            seconds=time.monotonic() - ticket.submitted, trajectory=trajectory)
        if not ticket.future.done():
            ticket.future.set_result(answer)

    def _fail(self, episode: _Episode, error: AgentError) -> None:
        episode.dropped = True
        if not episode.ticket.future.done():
            episode.ticket.future.set_exception(error)


def _groups(episodes: list[_Episode]) -> dict[tuple[float, float], list[_Episode]]:
    """Episodes by sampling settings (one backend call samples with one setting), arrival order kept."""
    groups: dict[tuple[float, float], list[_Episode]] = {}
    for episode in episodes:
        groups.setdefault(episode.sampling, []).append(episode)
    return groups
