"""Consecutive items grouped into buckets of bounded size: the files of an exported model
(`mempo.train.export`) and the buckets of a streamed weight sync (`mempo.train.step.streamed_weights`)."""
from __future__ import annotations

from typing import Mapping, TypeVar

__all__ = ["plan_buckets"]

K = TypeVar("K")


def plan_buckets(sizes: Mapping[K, int], max_size: int) -> list[list[K]]:
    """The keys of `sizes`, in order, grouped into consecutive buckets whose sizes add up to at most
    `max_size` (an item larger than it alone)."""
    buckets: list[list[K]] = []
    current: list[K] = []
    total = 0
    for key, size in sizes.items():
        if current and total + size > max_size:
            buckets.append(current)
            current, total = [], 0
        current.append(key)
        total += size
    if current:
        buckets.append(current)
    return buckets
