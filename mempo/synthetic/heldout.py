"""The held-out split of a synthetic world: training data never asks about an evaluated entity.

The evaluation's episodes fix the held-out *subjects*: the entities named along the hop chains of
their questions (`question_subjects`; for a one-hop question, the person asked about).
`training_episodes` is the one way SFT and RL data (the cold start, `mempo.synthetic.cold_start`;
the trainer's episode pool; the demo's RL episodes; the ablation's) draw questions: no hop of any of
its questions has a held-out subject, so no training question is about an entity the evaluation asks
about, whatever the relation or the number of objectives. (Held-out entities still appear in the
corpus, as every entity does, and may be the *answer* of a training question, e.g. a city.)
"""
from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping, Optional, Sequence, Union

from mempo.env.data import Episode, compose_episodes

__all__ = ["question_subjects", "held_out_subjects", "training_episodes"]


def question_subjects(episode: Episode) -> frozenset[str]:
    """The entity names of every hop subject of `episode`'s questions (a synthetic-world episode:
    ``metadata["records"][i]["chain"]``). ValueError for an episode without hop chains (one not
    drawn from a synthetic world: its subjects are unknown)."""
    records = episode.metadata.get("records")
    if not records or len(records) != len(episode.questions) or not all(r.get("chain") for r in records):
        raise ValueError(f"episode {episode.id!r} has no hop chains in metadata['records']: its question subjects are "
                         "unknown (only synthetic-world episodes have them)")
    return frozenset(step["subject"] for record in records for step in record["chain"])


def held_out_subjects(episodes: Union[Mapping[Any, Sequence[Episode]], Iterable[Episode]]) -> frozenset[str]:
    """The subjects (`question_subjects`) of every episode of `episodes`: ``{key: episodes}`` (as
    `mempo.eval.eval_episodes` returns) or a flat iterable of episodes."""
    groups = episodes.values() if isinstance(episodes, Mapping) else [episodes]
    return frozenset(name for group in groups for episode in group for name in question_subjects(episode))


def training_episodes(world: Any, num_objectives: Union[int, Sequence[int]], num_episodes: int, seed: int,
                      held_out: Collection[str] = (), *, hops: Union[int, Sequence[int], None] = None,
                      style: Optional[str] = None) -> list[Episode]:
    """``num_episodes`` episodes of ``num_objectives`` questions of the synthetic `world` none of
    whose hop subjects is in `held_out` (entity names, `held_out_subjects`). ``num_objectives``: k, or
    a sequence for mixed k (episode i has ``num_objectives[i % len]``, `compose_episodes`).

    Questions are drawn with question seed `seed` (`mempo.synthetic.world.World.questions`, walks
    through a held-out subject dropped) and composed with `mempo.env.data.compose_episodes` (same
    seed, ids as `World.episodes`'). With as many such questions as the episodes' k add up to, no
    question appears twice, and with nothing held out and one k the episodes are `World.episodes`'; a
    world left with fewer (the draw stops once new questions have become rare: `World.questions`'
    ``allow_fewer``) reuses questions across episodes (never within one). ValueError when fewer than
    the largest k questions are left. hops / style: as `World.episodes` (None: the world's)."""
    cycle = [int(num_objectives)] if isinstance(num_objectives, int) else [int(k) for k in num_objectives]
    n = int(num_episodes)
    drawn_ks = [cycle[i % len(cycle)] for i in range(n)]
    k = max(drawn_ks, default=0)  # the largest k among the episodes asked for (fewer episodes than the cycle: not all)
    needed = sum(drawn_ks)
    k_name = "+".join(str(c) for c in cycle)  # one k: the name World.episodes gives its questions
    style = style if style is not None else world.params.get("prompt_style", "numbered")
    pool = world.questions(needed, hops, seed, id_prefix=f"w{world.seed}-k{k_name}-q{seed}",
                           exclude_subjects=frozenset(held_out), allow_fewer=True)
    if len(pool) < k:
        raise ValueError(f"the synthetic world has {len(pool)} questions whose subjects are not held out "
                         f"({len(held_out)} held-out subjects), fewer than {k} objectives; use a larger world or "
                         "fewer evaluation episodes")
    return compose_episodes(pool, cycle, n, seed, reuse_questions=len(pool) < needed, style=style,
                            id_prefix=f"w{world.seed}")
