"""The outcome reward of a trajectory, computed after the rollout by training and evaluation alike.

    outcome = compute_score(protocol_text, golds, mode, format_kwargs)     (no golds: {}, not scored)

``protocol_text`` is the text the rollout built from its `AgentMemory` records (round texts and tool
texts as given, no chat glue), not a re-decoding of the ids. The scored trajectories are new records
(`dataclasses.replace`); the rollout's records are not changed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

from mempo.protocol.reward import compute_score
from mempo.records.trajectory import Trajectory

__all__ = ["outcome", "score_outcomes"]


def outcome(trajectory: Trajectory, *, mode: str = "mean",
            format_kwargs: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """`mempo.protocol.reward.compute_score` of the trajectory's ``protocol_text`` against its golds
    ({} when it has none). ValueError for a trajectory with golds but no protocol text."""
    if trajectory.golds is None:
        return {}
    if trajectory.protocol_text is None:
        raise ValueError(f"trajectory {trajectory.uid}/{trajectory.sample_index} has no protocol_text to score")
    return compute_score(trajectory.protocol_text, trajectory.golds, mode=mode, format_kwargs=format_kwargs)


def score_outcomes(trajectories: Sequence[Trajectory], *, mode: str = "mean",
                   format_kwargs: Optional[Mapping[str, Any]] = None) -> list[Trajectory]:
    """The scored copies of ``trajectories``, in order: each with ``outcome`` set (`outcome`).

    mode: how per-objective EM becomes the score (``rollout.score_mode``: "mean", "all", "sum");
    format_kwargs: keyword arguments of the format check (None: its defaults, which every command uses).
    """
    return [dataclasses.replace(t, outcome=outcome(t, mode=mode, format_kwargs=format_kwargs)) for t in trajectories]
