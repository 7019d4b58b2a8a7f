"""The synthetic tasks the demo runs (``synthetic.task``): what differs between the search world and the
ledger, behind one interface the demo's stages call (`SyntheticTask`, `synthetic_task`). It sits with the
demo above the library it composes (the evaluation's episodes, the synthetic worlds and teachers).

* ``search`` (`SearchTask`): the world of `mempo.synthetic.world` (entities, articles, k questions an
  episode), the tools of ``env.tools`` (built-in ``search`` / ``access`` over the world's retriever), the
  held-out split by evaluated entity (`mempo.synthetic.heldout`), the teacher `mempo.synthetic.oracle.
  OracleAgent` (tags format).
* ``ledger`` (`LedgerTask`): the ledger of `mempo.synthetic.ledger` (one question over k accounts an
  episode), its own tools (`mempo.synthetic.ledger_tools`: ``lookup`` over the ledger and ``calc``, user-style
  tools called as JSON tool calls; ``env.tools`` stays empty), the split by account (test for evaluation,
  validation for choices, train for SFT and RL), the teacher `mempo.synthetic.ledger_oracle.LedgerOracle`.

Either way the agent loop, training, teacher scoring and evaluation are the library's own: a task only
chooses the world, the tools, the episodes and the teacher. `mempo train`, `eval`, `sft` and `serve` build
the search world only (`mempo.synthetic.build.synthetic_world` refuses the ledger, naming the field).
"""
from __future__ import annotations

from typing import Any, Callable, Collection, NamedTuple, Optional, Sequence, Union

from mempo.config import ConfigError, MempoConfig
from mempo.env.build import build_retriever, build_tools
from mempo.env.closed_book import ClosedBookRetriever
from mempo.env.retriever import Retriever
from mempo.eval.episodes import eval_episodes, held_out_of_training
from mempo.protocol.grammar import answer_template_text
from mempo.protocol.tags import JSON_TAG_SET
from mempo.rollout.loop import rollout_system_prompt
from mempo.seeds import eval_question_seed, sft_question_seed, validation_question_seed
from mempo.synthetic.cold_start import ColdStart, oracle_cold_start
from mempo.synthetic.build import synthetic_world
from mempo.synthetic.copy_warmup import copy_records
from mempo.synthetic.heldout import training_episodes
from mempo.synthetic.ledger import Ledger
from mempo.synthetic.ledger_oracle import LEDGER_MEMORY_KINDS, LedgerOracle, ledger_memory_kinds
from mempo.synthetic.ledger_tools import ledger_tools
from mempo.synthetic.oracle import run_oracle
from mempo.synthetic.oracle_memory import MEMORY_LINE_KINDS, memory_line_kinds
from mempo.synthetic.rename import rename_excluded, rename_trajectories
from mempo.tools import Toolset
from mempo.utils.progress import progress

__all__ = ["TaskEnv", "SyntheticTask", "SearchTask", "LedgerTask", "TASKS", "synthetic_task", "ledger_world",
           "copy_entries", "name_ids", "LEDGER_PROMPT_STYLES"]

#: The prompt layouts a ledger episode may have (``synthetic.world_prompt_style``; None: ``"tools"``): the
#: others name the search tools.
LEDGER_PROMPT_STYLES = ("tools", "bare")


class TaskEnv(NamedTuple):
    """A task's environment: its ``world``, the ``retriever`` the ``env`` section's built-in tools query
    (the ledger's tools query none: a `ClosedBookRetriever`), the agent's ``tools`` and the closed-book
    evaluation's (``closed_book_tools``: the same tools finding nothing; None when ``eval.closed_book`` is
    off)."""

    world: Any
    retriever: Retriever
    tools: Toolset
    closed_book_tools: Optional[Toolset]


class SyntheticTask:
    """What a synthetic task supplies to the demo's stages (the module docstring says how the two differ).

    ``memory_kinds``: the kinds `memory_kinds_of` gives, in the report's column order; ``memory_labels``:
    each kind's column title; ``memory_unit``: what one classified item is (a question, an account)."""

    name = ""
    memory_kinds: tuple[str, ...] = ()
    memory_labels: dict[str, str] = {}
    memory_unit = ""

    def build(self, cfg: MempoConfig, *, log: Optional[Callable[[str], None]] = None) -> TaskEnv:
        """The world and its tools, from the configuration."""
        raise NotImplementedError

    def describe(self, env: TaskEnv) -> str:
        """One line saying what `build` made."""
        raise NotImplementedError

    def eval_episodes(self, world: Any, cfg: MempoConfig) -> dict[int, list]:
        """``{k: episodes}``: ``eval.episodes`` test episodes per k of ``eval.objectives`` (question seed
        `mempo.seeds.eval_question_seed`) of the split ``eval.split`` names; a world too small for them is a
        ConfigError naming the field."""
        raise NotImplementedError

    def held_out(self, world: Any, cfg: MempoConfig) -> frozenset[str]:
        """The names no SFT or RL question may be about: the test split's and the validation split's,
        whichever ``eval.split`` evaluates."""
        raise NotImplementedError

    def training_episodes(self, world: Any, num_objectives: Union[int, Sequence[int]], num_episodes: int, seed: int,
                          held_out: Collection[str]) -> list:
        """``num_episodes`` training episodes (k = num_objectives, or a cycle of them) about nothing held out."""
        raise NotImplementedError

    def cold_start(self, cfg: MempoConfig, env: TaskEnv, held_out: Collection[str], *,
                   show_progress: bool = False) -> ColdStart:
        """The teacher's SFT data (the ``synthetic`` section's ``oracle_*`` and ``copy_sft_examples`` fields)."""
        raise NotImplementedError

    def memory_kinds_of(self, mem: Optional[str], episode: Any) -> list[str]:
        """What a ``<mem>`` of the teacher's format holds per item of `episode` (one of `memory_kinds` each)."""
        raise NotImplementedError

    def copy_pool(self, world: Any, tokenizer: Any) -> tuple[list[int], str]:
        """The ids the copy warm-up draws its sequences from (repeats weight an id) and a phrase saying what
        they are: the ids of the names that are one id (`name_ids`)."""
        pool = name_ids(world, tokenizer)
        return pool, f"{len(pool)} name ids"


class SearchTask(SyntheticTask):
    """The search world (the demo as it was: `mempo.synthetic.build`, `mempo.synthetic.cold_start`)."""

    name = "search"
    memory_kinds = MEMORY_LINE_KINDS
    memory_labels = {"gold": "keeps the gold", "dropped": "dropped (`done`)", "other": "other text",
                     "pending": "pending or no line"}
    memory_unit = "objective"

    def build(self, cfg: MempoConfig, *, log: Optional[Callable[[str], None]] = None) -> TaskEnv:
        """`mempo.synthetic.build.synthetic_world`, the ``env`` section's retriever over it and ``env.tools``
        (`mempo.env.build.build_tools`); closed book: the same tools over a `ClosedBookRetriever`."""
        world = synthetic_world(cfg)
        retriever = build_retriever(cfg, world, log=log)
        closed = build_tools(cfg, ClosedBookRetriever()) if cfg.eval.closed_book else None
        return TaskEnv(world, retriever, build_tools(cfg, retriever), closed)

    def describe(self, env: TaskEnv) -> str:
        return f"{env.world.num_documents} documents ({len(env.world.entities)} entities)"

    def eval_episodes(self, world: Any, cfg: MempoConfig) -> dict[int, list]:
        return eval_episodes(world, cfg)

    def held_out(self, world: Any, cfg: MempoConfig) -> frozenset[str]:
        return held_out_of_training(world, cfg)

    def training_episodes(self, world: Any, num_objectives: Union[int, Sequence[int]], num_episodes: int, seed: int,
                          held_out: Collection[str]) -> list:
        return training_episodes(world, num_objectives, num_episodes, seed, held_out)

    def cold_start(self, cfg: MempoConfig, env: TaskEnv, held_out: Collection[str], *,
                   show_progress: bool = False) -> ColdStart:
        return oracle_cold_start(env.world, env.tools, cfg, held_out, show_progress=show_progress)

    def memory_kinds_of(self, mem: Optional[str], episode: Any) -> list[str]:
        return memory_line_kinds(mem, episode.golds)


def copy_entries(ledger: Ledger) -> list[str]:
    """What the ledger's copy-task records repeat: every account's name with every amount the ledger allows,
    written as a page writes an entry (``Tamor3``), held-out names too. Copying one teaches the step the
    ``<mem>`` needs, the digit after a name (a copy warm-up and records over names alone left the SFT model
    at chance on it: docs/experiments/G01-ledger-demo.md); the amounts are all of them, so no record tells an
    account's own."""
    least, most = ledger.params["amounts"]
    return [f"{e.name}{amount}" for e in ledger.entities for amount in range(least, most + 1)]


def name_ids(world: Any, tokenizer: Any) -> list[int]:
    """The ids of the world's names that the tokenizer spells as one id (after a space, as the texts write
    them), sorted."""
    ids = [tokenizer.encode(" " + e.name, add_special_tokens=False) for e in world.entities]
    return sorted({x[0] for x in ids if len(x) == 1})


def ledger_world(cfg: MempoConfig) -> Ledger:
    """The ledger the ``synthetic`` section describes: seed ``world_seed``, ``ledger_accounts`` accounts on pages
    of ``ledger_page_entries``, amounts in ``ledger_amounts``, prompts in ``world_prompt_style`` (None:
    ``"tools"``; `LEDGER_PROMPT_STYLES`)."""
    s = cfg.synthetic
    return Ledger.generate(s.world_seed, s.ledger_accounts, page_entries=s.ledger_page_entries,
                           amounts=(s.ledger_amounts[0], s.ledger_amounts[1]),
                           prompt_style=s.world_prompt_style or "tools")


class LedgerTask(SyntheticTask):
    """The ledger (module docstring)."""

    name = "ledger"
    memory_kinds = LEDGER_MEMORY_KINDS
    memory_labels = {"kept": "keeps the amount", "dropped": "dropped (`done`)", "other": "other text",
                     "pending": "pending or no line"}
    memory_unit = "account"

    def build(self, cfg: MempoConfig, *, log: Optional[Callable[[str], None]] = None) -> TaskEnv:
        """`ledger_world`, its tools (`mempo.synthetic.ledger_tools.ledger_tools`, calls bounded by
        ``env.tool_timeout`` and ``env.tool_result_chars``) and, with ``eval.closed_book``, the same over no
        ledger (every lookup finds nothing; calc still calculates)."""
        ledger = ledger_world(cfg)
        bounds = {"timeout": cfg.env.tool_timeout, "max_chars": cfg.env.tool_result_chars}
        closed = Toolset(ledger_tools(None), **bounds) if cfg.eval.closed_book else None
        return TaskEnv(ledger, ClosedBookRetriever(), Toolset(ledger_tools(ledger), **bounds), closed)

    def describe(self, env: TaskEnv) -> str:
        ledger = env.world
        split = ", ".join(f"{len(ledger.accounts(name))} {name}" for name in ("train", "validation", "test"))
        return f"{ledger.num_documents} ledger pages ({len(ledger.entities)} accounts: {split}); tools lookup, calc"

    def eval_episodes(self, world: Any, cfg: MempoConfig) -> dict[int, list]:
        """From the split ``eval.split`` names (accounts split three ways: `mempo.synthetic.ledger.SPLITS`)."""
        return self._episodes(world, cfg, cfg.eval.split)

    @staticmethod
    def _episodes(world: Ledger, cfg: MempoConfig, split: str) -> dict[int, list]:
        # the search world's counts and seeds per split (`mempo.eval.episodes`): eval.episodes test episodes,
        # eval.validation_episodes validation ones, each split with its own question seed
        count = cfg.eval.episodes if split == "test" else cfg.eval.validation_episodes
        seed_of = eval_question_seed if split == "test" else validation_question_seed
        sets = {}
        for k in cfg.eval.objectives:
            try:
                sets[int(k)] = world.episodes(int(k), count, seed_of(cfg.data.seed, k), split=split)
            except ValueError as error:
                raise ConfigError("synthetic.ledger_accounts", f"{count} {split} episodes of {k} accounts: "
                                                               f"{error}") from None
        return sets

    def held_out(self, world: Any, cfg: MempoConfig) -> frozenset[str]:
        """Every account outside the train split (test and validation), whichever split is evaluated."""
        return frozenset(world.entities[i].name for split in ("test", "validation") for i in world.accounts(split))

    def training_episodes(self, world: Any, num_objectives: Union[int, Sequence[int]], num_episodes: int, seed: int,
                          held_out: Collection[str]) -> list:
        return world.episodes(num_objectives, num_episodes, seed, split="train", exclude_accounts=held_out)

    def cold_start(self, cfg: MempoConfig, env: TaskEnv, held_out: Collection[str], *,
                   show_progress: bool = False) -> ColdStart:
        """``oracle_episodes`` training episodes per k of ``oracle_objectives`` (question seed
        `mempo.seeds.sft_question_seed`), each played by `LedgerOracle` (``oracle_think``,
        ``oracle_drop_fact_prob``, ``oracle_drop_seed``, ``oracle_lost_line``, and the teacher-scoring template
        with ``oracle_answer_template``) under the memory context with the task's tools in the json format and
        the system prompt the agent loop writes; ``oracle_keep`` as for the search world; ``oracle_rename``
        renames the accounts of each kept trajectory (`mempo.synthetic.rename`, drawn from the train split, or
        from every account with ``oracle_rename_pool: all``);
        ``copy_sft_examples`` copy-task records over entries as pages write them (`copy_entries`)."""
        s = cfg.synthetic
        if s.oracle_objectives is None:
            raise ConfigError("synthetic.oracle_objectives", "the ledger's cold start draws its episodes per number "
                                                             "of accounts; list them, e.g. [1, 2, 3, 4]")
        ledger: Ledger = env.world
        held = frozenset(held_out)
        template = answer_template_text(cfg.scoring.answer_template) if s.oracle_answer_template else None
        agent = LedgerOracle(think=s.oracle_think, drop_fact_prob=s.oracle_drop_fact_prob, drop_seed=s.oracle_drop_seed,
                             lost_line=s.oracle_lost_line, answer_template=template)
        system = rollout_system_prompt(cfg.rollout, env.tools)  # the agent loop's
        episodes = [e for k in s.oracle_objectives
                    for e in self.training_episodes(ledger, int(k), s.oracle_episodes,
                                                    sft_question_seed(cfg.data.seed, k), held)]
        trajectories = []
        with progress("oracle", total=len(episodes), enabled=show_progress) as bar:
            for episode in episodes:
                trajectories.append(run_oracle(episode, env.tools, policy="memory", agent=agent, system_prompt=system,
                                               tags=JSON_TAG_SET))
                bar.advance()
        kept = [t for t in trajectories if s.oracle_keep == "all" or float(t.score.get("score", 0.0)) == 1.0]
        all_kept = not kept
        kept = kept or trajectories
        if s.oracle_rename:
            kept = rename_trajectories(kept, ledger.entities, rename_excluded(s.oracle_rename_pool, held),
                                       seed=cfg.data.seed, digit_suffix=True)
        copies = copy_records(copy_entries(ledger), s.copy_sft_examples, seed=s.model_seed,
                              system_prompt=cfg.rollout.system_prompt)
        return ColdStart(kept, len(trajectories), len(held), all_kept, copies, [])

    def memory_kinds_of(self, mem: Optional[str], episode: Any) -> list[str]:
        return ledger_memory_kinds(mem, episode.metadata["records"][0]["amounts"])

    def copy_pool(self, world: Any, tokenizer: Any) -> tuple[list[int], str]:
        """The names' ids and the digits' ids, the digits drawn as often as the names together: a model that
        never copied a digit in its warm-up copied none after SFT either (each digit's id, trained only where
        digits are random, ended too like the others to copy: docs/experiments/G01-ledger-demo.md)."""
        names = name_ids(world, tokenizer)
        digits = [ids[0] for ids in (tokenizer.encode(str(d), add_special_tokens=False) for d in range(10))
                  if len(ids) == 1]
        weight = max(1, len(names) // max(1, len(digits)))
        return names + digits * weight, f"{len(names)} name ids and {len(digits)} digit ids (weighted to half)"


#: The tasks by ``synthetic.task`` value.
TASKS: dict[str, SyntheticTask] = {"search": SearchTask(), "ledger": LedgerTask()}


def synthetic_task(cfg: MempoConfig) -> SyntheticTask:
    """The task ``synthetic.task`` names (`TASKS`)."""
    return TASKS[cfg.synthetic.task]
