"""Renamed cold-start trajectories: every entity name in an oracle trajectory replaced, consistently
within it, by the name of another entity of the same kind drawn at random, so that SFT cannot learn
the world's facts or its question subjects by heart and must copy names from the question and the
search results (the held-out evaluation asks about entities SFT never saw as subjects).

Names are drawn from entities no evaluation question asks about (``held_out`` excluded), so the
held-out split stays as it is, or, with ``synthetic.oracle_rename_pool: all`` (`rename_excluded`), from
every entity, so SFT writes every name, a held-out one only with facts that are not its own. The renaming
is a pure function of (trajectory index, seed).
"""
from __future__ import annotations

import dataclasses
import random
import re
from typing import Any, Collection, Optional, Sequence

from mempo.synthetic.oracle import OracleTrajectory

__all__ = ["rename_excluded", "rename_trajectories"]


def _name_pattern(names: Collection[str], digit_suffix: bool = False) -> re.Pattern:
    """One regex matching any of `names` as whole words (with `digit_suffix`, also right before a digit:
    the ledger's ``Tamor3``); where several match at a position, the longest (a multi-word name before the
    one-word name it starts with).

    1. The names go into a character trie.
    2. The trie becomes nested groups, a node's children in character order and its end (when a
       name ends there) as the last, empty choice: the regex tries the longest continuation first
       and backtracks to a shorter name when a word character follows. Same matches as the
       alternation of the names longest first, without trying 2,000 alternatives at every position."""
    trie: dict = {}
    for name in filter(None, names):  # an empty name would match everywhere
        node = trie
        for char in name:
            node = node.setdefault(char, {})
        node[""] = {}  # a name ends here

    def regex(node: dict) -> str:
        branches = [re.escape(char) + regex(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    if not trie:
        return re.compile(r"(?!)")  # no names: nothing matches (an empty group would match everywhere)
    end = r"(?![^\W\d])" if digit_suffix else r"(?!\w)"  # not before a letter (or, without digit_suffix, a digit)
    return re.compile(r"(?<!\w)(" + regex(trie) + r")" + end)


def rename_excluded(pool: str, held_out: Collection[str]) -> frozenset[str]:
    """The names a renaming may not draw, by `pool` (``synthetic.oracle_rename_pool``, `mempo.config.SyntheticConfig`):
    `held_out` for ``"not_held_out"``, none for ``"all"``."""
    if pool not in ("not_held_out", "all"):
        raise ValueError(f"oracle_rename_pool must be 'not_held_out' or 'all', got {pool!r}")
    return frozenset(held_out) if pool == "not_held_out" else frozenset()


def rename_trajectories(trajectories: Sequence[OracleTrajectory], entities: Sequence[Any],
                        held_out: Collection[str] = (), seed: int = 0, *,
                        digit_suffix: bool = False) -> list[OracleTrajectory]:
    """New trajectories, one per `trajectories[i]`, whose text has every entity name replaced.

    1. The names of `entities` (objects with ``name`` and ``kind``) found in trajectory i's texts
       (prompt, system prompt, every round's messages, assistant text, tool argument and tool text,
       the final answer, the golds) are collected.
    2. Each is mapped to a distinct name of the same kind, drawn without replacement from the
       entities of that kind not in `held_out`, with ``random.Random(f"mempo-rename/{seed}/{i}")``.
    3. Every occurrence is replaced at once (one pass, so a name mapped onto another name found in
       the same text is never renamed twice). The score, finish and round structure are kept: a
       consistent renaming leaves an answer exactly as right or wrong as it was.

    ``tool_metadata`` (document ids) is kept as it is. ValueError when a kind has fewer
    non-held-out names than a trajectory needs. digit_suffix: a name directly followed by digits is a
    name too (the ledger writes an amount right after its account's name, ``Tamor3``)."""
    kind_of = {e.name: e.kind for e in entities}
    pools: dict[str, list[str]] = {}
    held = frozenset(held_out)
    for e in entities:
        if e.name not in held:
            pools.setdefault(e.kind, []).append(e.name)
    for names in pools.values():
        names.sort()
    pattern = _name_pattern(kind_of, digit_suffix)
    renamed = []
    for i, trajectory in enumerate(trajectories):
        texts = _texts(trajectory)
        found = sorted({m.group(1) for text in texts for m in pattern.finditer(text)})
        rng = random.Random(f"mempo-rename/{seed}/{i}")
        mapping: dict[str, str] = {}
        for kind in sorted({kind_of[name] for name in found}):
            olds = [name for name in found if kind_of[name] == kind]
            pool = pools.get(kind, [])
            if len(pool) < len(olds):
                raise ValueError(f"trajectory {trajectory.episode_id!r} names {len(olds)} entities of kind {kind!r}; "
                                 f"only {len(pool)} such entities are not held out")
            mapping.update(zip(olds, rng.sample(pool, len(olds))))
        renamed.append(_renamed(trajectory, lambda text: pattern.sub(lambda m: mapping[m.group(1)], text)))
    return renamed


def _texts(t: OracleTrajectory) -> list[str]:
    texts = [t.prompt, t.system_prompt, t.final_answer or ""] + [g for golds in t.golds for g in golds]
    for r in t.rounds:
        texts += [m.get("content", "") for m in r.messages] + [r.assistant, r.argument or "", r.tool_text or ""]
    return texts


def _renamed(t: OracleTrajectory, sub: Any) -> OracleTrajectory:
    def opt(text: Optional[str]) -> Optional[str]:
        return None if text is None else sub(text)

    rounds = [dataclasses.replace(r, messages=[{**m, "content": sub(m.get("content", ""))} for m in r.messages],
                                  assistant=sub(r.assistant), argument=opt(r.argument), tool_text=opt(r.tool_text))
              for r in t.rounds]
    return dataclasses.replace(t, prompt=sub(t.prompt), system_prompt=sub(t.system_prompt), rounds=rounds,
                               golds=[[sub(g) for g in golds] for golds in t.golds], final_answer=opt(t.final_answer))
