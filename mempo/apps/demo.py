"""`mempo demo`: MemPO end to end on CPU, from nothing, in minutes.

Stages (each prints what it did and how long it took; timings go to ``stages.json``):

1. world      the synthetic world (`mempo.env.world.World`, ``data.world_documents`` documents) and a
              BM25 retriever over it;
2. oracle     oracle trajectories (`mempo.env.oracle.run_oracle`, memory context, think style
              ``demo.oracle_think``) on ``demo.sft_episodes`` episodes of each of
              ``demo.sft_objectives`` objectives; only correct ones (score 1) are kept, as the
              paper's cold-start data. SFT and RL episodes are drawn with other question seeds than
              the evaluation's, and any that shares a question with an evaluation episode is
              dropped, so the evaluation questions are never trained on;
3. tokenizer  a byte-level BPE (`mempo.model.builtin.train_tokenizer`, ``demo.vocab_size``) trained on the
              documents and the oracle texts;
4. model      a randomly initialised Qwen2 (`mempo.model.builtin.tiny_model`, ``demo.model_size``);
5. sft        supervised cold start on the oracle trajectories (`mempo.train.sft.run_sft`; with
              ``demo.sft_prompt_loss_weight`` > 0 the prompt tokens are modelled too); the model is
              saved to ``<out>/model_sft``;
6. eval-before  evaluation (`mempo.eval.evaluate`) of ``eval.episodes`` episodes for each of
              ``eval.objectives`` under ``eval.policies`` (the memory context) -> ``eval_before.json`` / ``.md``;
7. rl         MemPO RL (`mempo.train.trainer.train`, ``trainer.total_steps`` steps) into
              ``<out>/rl`` (``metrics.jsonl``); the model is saved to ``<out>/model_rl``;
8. eval-after the same evaluation -> ``eval_after.json`` / ``.md``;
9. report     ``report.md`` + PNG plots (`mempo.apps.report.write_report`).

Re-running into the same ``--out``: the demo owns its output directory. It first removes its own
stage directories there (``rl/``: the RL run with its checkpoints, ``sft/``: the SFT metrics) and
then rewrites every file it writes (``model_sft/`` and ``model_rl/`` are replaced atomically), so
a second run starts fresh instead of being refused as a used run directory (``trainer.resume``
stays "never"). Nothing else in ``--out`` is touched.

Configuration: a YAML file with the `mempo.config.MempoConfig` sections plus a ``demo``
section (`DemoConfig`); the built-in defaults (`DEFAULT_CONFIG`) equal the repository's
``configs/demo.yaml``. Overrides are dotted (``eval.episodes=4``, ``trainer.total_steps=2``).

A stage whose function is not available (the SFT or RL module missing from this installation) is
skipped with its reason printed, written to ``stages.json`` and stated in the report; the
stages that do not need it still run.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union


__all__ = ["DemoConfig", "DEFAULT_CONFIG", "load_demo_config", "run_demo", "DemoResult"]

PathLike = Union[str, "os.PathLike[str]"]


@dataclass
class DemoConfig:
    """The demo's own settings (the ``demo`` section).

    The world itself is the ``data`` section's (``world_documents``, ``article_fillers``), so
    `mempo eval` / `mempo train` with the demo's saved config rebuild the same one. vocab_size:
    tokenizer size.
    tokenizer_documents: documents the tokenizer is trained on (plus every oracle text).
    model_size: a `mempo.model.builtin.SIZES` name. max_position_embeddings: the model's context.
    tie_embeddings: share the input embedding and the output head (`tiny_model`): the head row of
    a name the SFT targets never contain is then that name's input embedding (trained wherever the
    name is read) rather than a row only ever pushed down, which helps copying names from the context.
    oracle_think: the oracle's think style (`OracleAgent`: "full" sentences or "short", one line).
    sft_objectives / sft_episodes: oracle episodes per number of objectives for the cold start.
    sft_steps / sft_epochs / sft_lr / sft_batch_tokens: `run_sft`'s steps (None: epochs bound the
    run), epochs (None: one), learning rate and padded tokens per batch. sft_seconds: a wall-time
    bound on the SFT stage (None: none; the demo's budget is met whatever the machine's speed).
    sft_schedule: `run_sft`'s learning-rate schedule ("constant" or "cosine").
    sft_prompt_loss_weight: `run_sft`'s ``prompt_loss_weight``: the loss also models the prompt
    tokens (question, previous round, search results) with this weight (0: assistant tokens only);
    a model from scratch learns to copy names from its context much sooner.
    torch_threads: torch intra-op threads (0: automatic: the CPUs other processes leave idle, from
    /proc/stat sampled over half a second, at least 1; small models on a busy machine run much
    slower with oversubscribed threads).
    seed: model initialisation seed.
    """

    vocab_size: int = 4096
    tokenizer_documents: int = 2000
    model_size: str = "small"
    max_position_embeddings: int = 4096
    tie_embeddings: bool = True
    oracle_think: str = "short"
    sft_objectives: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    sft_episodes: int = 512
    sft_steps: Optional[int] = 4000
    sft_epochs: Optional[float] = None
    sft_seconds: Optional[float] = 570.0
    sft_lr: float = 3e-3
    sft_schedule: str = "cosine"
    sft_prompt_loss_weight: float = 1.0
    sft_batch_tokens: int = 2048
    torch_threads: int = 0
    seed: int = 0


#: The built-in demo configuration (equal to the repository's configs/demo.yaml).
DEFAULT_CONFIG: dict[str, Any] = {
    "demo": dataclasses.asdict(DemoConfig()),
    "model": {"path": "builtin-tiny", "max_position_embeddings": 4096},
    "data": {"num_objectives": 2, "questions_per_step": 2, "seed": 0, "world_seed": 0, "world_documents": 2000,
             "article_fillers": [0, 1]},
    "env": {"topk": 1, "doc_chars": 600},
    "rollout": {"group_size": 4, "max_turns": 6, "max_new_tokens_per_round": 192,
                "max_response_tokens": 2048, "temperature": 1.0, "context_policy": "memory"},
    "actor": {"lr": 1e-4, "kl_coef": 0.001, "micro_batch_tokens": 8192},
    "trainer": {"total_steps": 4, "save_every": 0, "eval_every": 0, "log_every": 1, "resume": "never",
                "tensorboard": False, "out_dir": "demo_out/rl"},
    "eval": {"objectives": [2, 4], "max_turns": 12, "policies": ["memory"], "episodes": 16, "temperature": 0.0},
}


def _split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    demo, rest = [], []
    for item in overrides:
        (demo if item.strip().startswith("demo.") else rest).append(item)
    return demo, rest


def load_demo_config(path: Optional[PathLike] = None, overrides: Sequence[str] = ()):
    """(MempoConfig, DemoConfig) from a YAML file (None: `DEFAULT_CONFIG`) plus dotted overrides."""
    from mempo.config import ConfigError, coerce_value, config_from_dict, read_yaml_mapping

    data = copy.deepcopy(DEFAULT_CONFIG) if path is None else read_yaml_mapping(path)
    demo_data = dict(data.pop("demo", None) or {})
    demo_overrides, rest = _split_overrides(overrides)
    for item in demo_overrides:
        if "=" not in item:
            raise ConfigError(item, "override must look like 'demo.field=value'")
        key, value = item.split("=", 1)
        demo_data[key.strip()[len("demo."):]] = value
    hints = {f.name: f.type for f in dataclasses.fields(DemoConfig)}
    import typing

    hints = typing.get_type_hints(DemoConfig)
    for key in list(demo_data):
        if key not in hints:
            raise ConfigError(f"demo.{key}", f"unknown key; DemoConfig has: {', '.join(sorted(hints))}")
        demo_data[key] = coerce_value(demo_data[key], hints[key], f"demo.{key}")
    return config_from_dict(data, rest), DemoConfig(**demo_data)


# ------------------------------------------------------------------------------------------------
# stage bookkeeping
# ------------------------------------------------------------------------------------------------
@dataclass
class DemoResult:
    """What the demo produced: the output directory, the report path, the stage records."""

    out_dir: Path
    report: Optional[Path]
    stages: list[dict[str, Any]]
    before: Any = None
    after: Any = None
    skipped: list[str] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return float(sum(s["seconds"] for s in self.stages))


class _Stages:
    def __init__(self, out_dir: Path, total: int, echo: Callable[[str], None]):
        self.out_dir, self.total, self.echo = out_dir, total, echo
        self.records: list[dict[str, Any]] = []
        self.started = time.perf_counter()
        from mempo.eval import machine_facts

        self.machine = machine_facts()

    def run(self, name: str, fn: Callable[[], tuple[Any, str]]) -> Any:
        number = len(self.records) + 1
        self.echo(f"[{number}/{self.total}] {name} ...")
        start = time.perf_counter()
        value, summary = fn()
        seconds = time.perf_counter() - start
        self.records.append({"name": name, "seconds": seconds, "summary": summary})
        self.echo(f"[{number}/{self.total}] {name}: {summary} ({seconds:.1f} s)")
        self.save()
        return value

    def skip(self, name: str, reason: str) -> None:
        number = len(self.records) + 1
        self.records.append({"name": name, "seconds": 0.0, "summary": f"SKIPPED: {reason}", "skipped": True})
        self.echo(f"[{number}/{self.total}] {name}: SKIPPED: {reason}")
        self.save()

    def save(self) -> None:
        data = {"stages": self.records, "total_seconds": time.perf_counter() - self.started,
                "machine": self.machine}
        (self.out_dir / "stages.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _stage_function(stage: str, module: str, name: str, stages: "_Stages", skipped: list[str]) -> Optional[Callable]:
    """`module.name`, or None after recording why the stage is skipped (the module is missing from
    this installation)."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        skipped.append(f"{stage}: `from {module} import {name}` failed ({error})")
        stages.skip(stage, f"{module}.{name} is not available ({error})")
        return None


def _call(fn: Callable, *args: Any, **optional: Any) -> Any:
    """Call `fn` with `args` and those of `optional` that its signature accepts."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **optional)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(*args, **optional)
    return fn(*args, **{k: v for k, v in optional.items() if k in params})


def _echo(line: str) -> None:
    print(f"mempo demo: {line}", flush=True)


# ------------------------------------------------------------------------------------------------
# the demo
# ------------------------------------------------------------------------------------------------
def run_demo(cfg: Any, demo: DemoConfig, out_dir: PathLike, *, echo: Callable[[str], None] = _echo,
             show_progress: bool = True) -> DemoResult:
    """Run every stage (module docstring) into `out_dir`; returns a `DemoResult`."""
    from mempo.config import dump_config

    from mempo.train.trainer import prepare_out_dir

    out = prepare_out_dir(out_dir, "--out")
    for stage_dir in ("rl", "sft"):  # the demo's own stage directories (module docstring: re-running)
        shutil.rmtree(out / stage_dir, ignore_errors=True)
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, out_dir=str(out / "rl")))
    dump_config(cfg, out / "config.yaml")
    (out / "demo_config.json").write_text(json.dumps(dataclasses.asdict(demo), indent=2) + "\n", encoding="utf-8")
    threads = _set_threads(demo.torch_threads)
    echo(f"torch threads: {threads} (CPUs: {os.cpu_count()}, load average {os.getloadavg()[0]:.2f})")
    stages = _Stages(out, 9, echo)
    state: dict[str, Any] = {}
    skipped: list[str] = []

    # 1. world ----------------------------------------------------------------------------------
    def world_stage():
        from mempo.eval import build_world

        world, retriever = build_world(cfg)
        state["world"], state["retriever"] = world, retriever
        return world, (f"{world.num_documents} documents ({len(world.entities)} entities), "
                       f"BM25 index built")

    stages.run("world", world_stage)
    world, retriever = state["world"], state["retriever"]
    from mempo.eval import eval_episodes, evaluate

    episodes_by_k = eval_episodes(world, cfg)
    state["eval_questions"] = {q for episodes in episodes_by_k.values() for e in episodes for q in e.questions}

    # 2. oracle trajectories --------------------------------------------------------------------
    def oracle_stage():
        from mempo.env.oracle import OracleAgent, run_oracle
        from mempo.eval import config_tools
        from mempo.train.logging import progress

        tools = config_tools(retriever, cfg)
        drawn = [e for k in demo.sft_objectives
                 for e in world.episodes(int(k), demo.sft_episodes, seed=cfg.data.seed + 20_000 + int(k))]
        # Held out: another seed draws other episodes, but a question can come up again (the world
        # has finitely many); an SFT episode sharing a question with an evaluation episode is dropped.
        episodes = [e for e in drawn if not set(e.questions) & state["eval_questions"]]
        trajectories = []
        with progress("oracle", total=len(episodes), enabled=show_progress) as bar:
            for episode in episodes:
                trajectories.append(run_oracle(episode, tools, policy="memory", agent=OracleAgent(think=demo.oracle_think)))
                bar.advance()
        kept = [t for t in trajectories if float(t.score.get("score", 0.0)) == 1.0]
        what = "correct oracle trajectories kept"
        if not kept:  # a tiny world can defeat the oracle; train on what there is rather than nothing
            kept, what = trajectories, "oracle trajectories kept (none was correct: all kept)"
        state["oracle"] = kept
        rounds = sum(t.num_rounds for t in kept)
        return kept, (f"{len(kept)}/{len(trajectories)} {what} "
                      f"({rounds} rounds; objectives {list(demo.sft_objectives)}; "
                      f"{len(drawn) - len(episodes)} episodes sharing a question with the evaluation dropped)")

    stages.run("oracle", oracle_stage)

    # 3. tokenizer ------------------------------------------------------------------------------
    def tokenizer_stage():
        from mempo.model.builtin import default_corpus_texts, train_tokenizer

        texts = default_corpus_texts(world, limit=demo.tokenizer_documents)
        for t in state["oracle"]:
            texts.append(t.prompt)
            texts.append(t.response_text)
        tokenizer = train_tokenizer(texts, demo.vocab_size)
        state["tokenizer"] = tokenizer
        return tokenizer, f"byte-level BPE, {len(tokenizer)} ids, trained on {len(texts)} texts"

    stages.run("tokenizer", tokenizer_stage)
    tokenizer = state["tokenizer"]

    # 4. model ----------------------------------------------------------------------------------
    def model_stage():
        from mempo.model.builtin import tiny_model

        model = tiny_model(tokenizer, demo.model_size, demo.seed, max_position_embeddings=demo.max_position_embeddings,
                           tie_word_embeddings=demo.tie_embeddings)
        state["model"] = model
        c = model.config
        params = sum(p.numel() for p in model.parameters())
        return model, (f"Qwen2 '{demo.model_size}': {c.num_hidden_layers} layers x {c.hidden_size}, "
                       f"{params / 1e6:.2f} M parameters{' (tied embeddings)' if demo.tie_embeddings else ''}, "
                       f"random init (seed {demo.seed})")

    stages.run("model", model_stage)
    model = state["model"]

    # 5. SFT ------------------------------------------------------------------------------------
    run_sft = _stage_function("sft", "mempo.train.sft", "run_sft", stages, skipped)
    if run_sft is not None:
        def sft_stage():
            from mempo.train.logging import MetricsLogger

            with MetricsLogger(out / "sft", tensorboard=False) as logger:
                result = _call(run_sft, cfg, model, tokenizer, state["oracle"], steps=demo.sft_steps,
                               epochs=demo.sft_epochs, lr=demo.sft_lr, batch_tokens=demo.sft_batch_tokens,
                               logger=logger, seed=demo.seed, max_seconds=demo.sft_seconds,
                               schedule=demo.sft_schedule, prompt_loss_weight=demo.sft_prompt_loss_weight)
            state["sft_result"] = result
            if hasattr(result, "parameters") and result is not model:  # a new model was returned
                state["model"] = result
            _save_model(out / "model_sft", state["model"], tokenizer)
            return result, f"{_describe(result)}; saved to {out / 'model_sft'}"

        stages.run("sft", sft_stage)
    model = state["model"]

    # 6. eval before ----------------------------------------------------------------------------
    def eval_stage(which: str):
        def body():
            report = evaluate(state["model"], tokenizer, episodes_by_k, retriever, cfg, label=f"{which} RL", log=echo, show_progress=show_progress)
            report.write(out, f"eval_{which}", title=f"Evaluation {which} RL")
            state[which] = report
            cells = "; ".join(f"k={r.objectives} {r.policy}: EM {r.em:.3f} F1 {r.f1:.3f} "
                              f"prompt tok/episode {r.prompt_tokens_per_episode:.0f}" for r in report.rows)
            return report, cells
        return body

    stages.run("eval-before", eval_stage("before"))

    # 7. RL -------------------------------------------------------------------------------------
    train = _stage_function("rl", "mempo.train.trainer", "train", stages, skipped)
    if train is not None:
        def rl_stage():
            steps = cfg.trainer.total_steps
            wanted = steps * cfg.data.questions_per_step
            drawn = world.episodes(cfg.data.num_objectives, 2 * wanted, seed=cfg.data.seed)
            episodes = [e for e in drawn if not set(e.questions) & state["eval_questions"]][:wanted]
            if len(episodes) < wanted:  # a tiny world: fall back to the first draws
                episodes = drawn[:wanted]
            result = _call(train, cfg, model=state["model"], tokenizer=tokenizer, episodes=episodes,
                           retriever=retriever, out_dir=str(out / "rl"))
            state["rl_result"] = result
            trained = getattr(result, "model", None)
            if trained is not None and hasattr(trained, "parameters"):
                state["model"] = trained
            _save_model(out / "model_rl", state["model"], tokenizer)
            rollouts = "answer-blind protocol scaffold" if cfg.rollout.protocol_scaffold else "the model's own"
            return result, f"{steps} MemPO steps ({_describe(result)}, {rollouts} rollouts); metrics in {out / 'rl'}"

        stages.run("rl", rl_stage)

    # 8. eval after -----------------------------------------------------------------------------
    if train is not None:
        stages.run("eval-after", eval_stage("after"))
    else:
        stages.skip("eval-after", "no RL stage ran")

    # 9. report ---------------------------------------------------------------------------------
    def make_report():
        from mempo.apps.report import write_report

        stages.save()
        metrics_path = out / "rl" / "metrics.jsonl"
        return write_report(out, before=state.get("before"), after=state.get("after"),
                            metrics_path=metrics_path if metrics_path.is_file() else None,
                            stages=json.loads((out / "stages.json").read_text(encoding="utf-8")),
                            machine=stages.machine, title="MemPO CPU demo report", notes=skipped)

    def report_stage():
        result = make_report()
        return result, f"{result.path} and {len(result.plots)} plots ({', '.join(sorted(result.plots))})"

    report = stages.run("report", report_stage)
    make_report()  # again, so that the stage table includes the report stage itself
    total = time.perf_counter() - stages.started
    echo(f"done in {total:.1f} s; report: {report.path}")
    for item in skipped:
        echo(f"NOT RUN: {item}")
    return DemoResult(out, report.path, stages.records, state.get("before"), state.get("after"), skipped)


def _busy_cpus(window: float = 0.5) -> float:
    """CPUs kept busy by other processes right now: /proc/stat sampled over `window` seconds (the
    1-minute load average lags: it still counts a run that ended a minute ago). Falls back to the
    load average where /proc/stat is missing."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    try:
        total0, idle0 = sample()
        time.sleep(window)
        total1, idle1 = sample()
        cpus = os.cpu_count() or 1
        return cpus * (1.0 - (idle1 - idle0) / max(1, total1 - total0))
    except (OSError, ValueError, IndexError):
        try:
            return float(os.getloadavg()[0])
        except (AttributeError, OSError):
            return 0.0


def _set_threads(requested: int) -> int:
    import torch

    if requested and requested > 0:
        torch.set_num_threads(int(requested))
    else:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        torch.set_num_threads(max(1, min(torch.get_num_threads(), cpus - int(round(_busy_cpus())))))
    return torch.get_num_threads()


def _describe(result: Any) -> str:
    """A short text for a stage result object (its scalar fields)."""
    if result is None:
        return "done"
    if dataclasses.is_dataclass(result):
        items = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    elif isinstance(result, Mapping):
        items = dict(result)
    else:
        return type(result).__name__
    parts = []
    for key, value in items.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            continue
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return ", ".join(parts[:8]) or type(result).__name__


def _save_model(path: Path, model: Any, tokenizer: Any) -> None:
    """A plain HF directory (`mempo.model.export.save_model_dir`) with the demo as its provenance."""
    from mempo.model.export import save_model_dir

    save_model_dir(path, model, tokenizer, provenance={"written_by": "mempo demo", "stage": path.name})


# ------------------------------------------------------------------------------------------------
# CLI glue (registered in mempo.apps.eval_command)
# ------------------------------------------------------------------------------------------------
def add_arguments(parser) -> None:
    parser.add_argument("--config", default=None,
                        help="demo YAML (MempoConfig sections + a 'demo' section); default: the built-in "
                             "configuration (= configs/demo.yaml)")
    parser.add_argument("--out", default="demo_out", help="output directory (default demo_out)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (stage lines only)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.episodes=4 trainer.total_steps=2")


def run_command(args) -> int:
    from mempo.config import ConfigError

    try:
        cfg, demo = load_demo_config(args.config, args.overrides)
    except (ConfigError, OSError) as error:
        print(f"mempo demo: {error}", file=sys.stderr)
        return 2
    result = run_demo(cfg, demo, args.out, show_progress=not args.no_progress)
    return 0 if not result.skipped else 1
