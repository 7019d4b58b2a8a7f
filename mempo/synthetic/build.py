"""The synthetic world a configuration describes, and the retriever over it: `mempo train`, `sft`,
`eval` and the demo build theirs here, so they agree on it.

The world is `World.generate` with the ``synthetic`` section's ``world_*`` fields and
``article_fillers``; its chronicle fraction is 0.15 with chronicles, 0 without. The retriever is the
``env`` section's (`mempo.env.build.build_retriever`: BM25 over the world's documents unless ``env``
names a corpus or a server).
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

from mempo.config import ConfigError, MempoConfig
from mempo.env.build import build_retriever
from mempo.env.retriever import Retriever
from mempo.synthetic.grammar import check_hops
from mempo.synthetic.world import World, check_relations, world_sizes

__all__ = ["SyntheticEnv", "check_world_config", "synthetic_world", "build_world"]


class SyntheticEnv(NamedTuple):
    """`build_world`'s result: the synthetic world and the retriever of the ``env`` section."""

    world: World
    retriever: Retriever


def check_world_config(cfg: MempoConfig) -> None:
    """The world's own checks of the ``synthetic`` section (`World.generate` would refuse the same),
    as a ConfigError naming the field: world_relations (known names), world_question_hops (1..4),
    and world_documents (enough for the entities and their chronicles) or world_entities. The
    section checks the rest when built (`mempo.config.SyntheticConfig`: ranges, `MAX_WORLD_DOCUMENTS`)."""
    s = cfg.synthetic
    sizes = "world_documents" if s.world_documents is not None else "world_entities"
    checks = (("world_relations", lambda: check_relations(s.world_relations)),
              ("world_question_hops", lambda: s.world_question_hops is None or check_hops(list(s.world_question_hops))),
              (sizes, lambda: world_sizes(s.world_entities, s.world_documents, s.world_distractor_ratio,
                                          check_relations(s.world_relations), s.world_chronicles)))
    for name, check in checks:
        try:
            check()
        except ValueError as error:
            raise ConfigError(f"synthetic.{name}", str(error)) from None


def synthetic_world(cfg: MempoConfig) -> World:
    """The synthetic world ``cfg.synthetic`` describes (checked first: `check_world_config`). The search
    world only: ``synthetic.task: ledger`` is a ConfigError naming that field (the ledger runs in `mempo
    demo`, `mempo.apps.tasks`)."""
    if cfg.synthetic.task != "search":
        raise ConfigError("synthetic.task", f"{cfg.synthetic.task!r} runs in `mempo demo` only (mempo.apps.tasks); "
                                            "mempo train, eval, sft and serve build the search world: leave it "
                                            "'search'")
    check_world_config(cfg)
    s = cfg.synthetic
    fillers = tuple(s.article_fillers) if s.article_fillers is not None else None
    return World.generate(s.world_seed, s.world_entities, num_documents=s.world_documents,
                          article_fillers=fillers, relations=s.world_relations, names=s.world_names,
                          article_style=s.world_article_style, chronicles=s.world_chronicles,
                          chronicle_fraction=0.15 if s.world_chronicles else 0.0,
                          distractor_ratio=s.world_distractor_ratio,
                          question_hops=s.world_question_hops, prompt_style=s.world_prompt_style)


def build_world(cfg: MempoConfig, *, log: Optional[Callable[[str], None]] = None) -> SyntheticEnv:
    """`synthetic_world(cfg)` and `build_retriever(cfg, world)` (BM25 over the world's documents
    unless ``env`` names a corpus or a server). log: progress lines of a BM25 index build or load."""
    world = synthetic_world(cfg)
    return SyntheticEnv(world, build_retriever(cfg, world, log=log))
