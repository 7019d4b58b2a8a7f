"""mempo.synthetic.rename: each trajectory's entity names replaced consistently, by names of the same
kind that are not held out; structure, correctness and determinism kept."""
import random
import re

import pytest

from mempo.config import ConfigError, load_config
from mempo.env.build import build_tools
from mempo.protocol.reward import compute_score
from mempo.synthetic.build import build_world
from mempo.synthetic.cold_start import oracle_cold_start
from mempo.synthetic.rename import _name_pattern, rename_excluded, rename_trajectories
from support.small_world import SMALL

OVERRIDES = SMALL + ["synthetic.oracle_objectives=[1,2]", "synthetic.oracle_episodes=6", "synthetic.oracle_keep=all",
                     "synthetic.oracle_query_style=question", "synthetic.oracle_memory_style=listed"]


@pytest.fixture(scope="module")
def cold():
    cfg = load_config(None, OVERRIDES)
    env = build_world(cfg)
    return env, oracle_cold_start(env.world, build_tools(cfg, env.retriever), cfg).trajectories


def _names_in(trajectory, names):
    texts = [trajectory.prompt] + [m["content"] for r in trajectory.rounds for m in r.messages]
    texts += [r.assistant for r in trajectory.rounds] + [r.tool_text or "" for r in trajectory.rounds]
    pattern = re.compile(r"(?<!\w)(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                         + r")(?!\w)")
    return [m.group(1) for text in texts for m in pattern.finditer(text)]


def test_names_are_replaced_consistently_by_same_kind_names_not_held_out(cold):
    env, trajectories = cold
    kind = {e.name: e.kind for e in env.world.entities}
    held_out = frozenset(sorted(kind)[::3])
    renamed = rename_trajectories(trajectories, env.world.entities, held_out, seed=7)
    assert len(renamed) == len(trajectories)
    changed = 0
    for before, after in zip(trajectories, renamed):
        old, new = _names_in(before, kind), _names_in(after, kind)
        assert len(old) == len(new) and old  # every occurrence replaced by exactly one name
        mapping = dict(zip(old, new))
        assert len(set(mapping.values())) == len(mapping)  # distinct names stay distinct
        assert all(kind[o] == kind[n] for o, n in mapping.items())
        assert not set(new) & held_out
        changed += sum(o != n for o, n in mapping.items())
        assert [len(r.messages) for r in after.rounds] == [len(r.messages) for r in before.rounds]
        assert after.score == before.score and after.finished == before.finished
        # the renamed answer is as right as the original: the golds were renamed with it
        assert compute_score(after.response_text, after.golds)["em"] == before.score["em"]
        assert after.golds == [[mapping.get(g, g) for g in golds] for golds in before.golds]
    assert changed > 0
    assert rename_trajectories(trajectories, env.world.entities, held_out, seed=7) == renamed
    assert rename_trajectories(trajectories, env.world.entities, held_out, seed=8) != renamed


def test_a_kind_without_enough_names_is_an_error(cold):
    env, trajectories = cold
    persons = frozenset(e.name for e in env.world.entities if e.kind == "person")
    with pytest.raises(ValueError, match="not held out"):
        rename_trajectories(trajectories, env.world.entities, persons, seed=0)


def test_the_cold_start_renames_when_configured_and_only_the_listed_way():
    cfg = load_config(None, OVERRIDES + ["synthetic.oracle_rename=true"])
    env = build_world(cfg)
    tools = build_tools(cfg, env.retriever)
    plain = oracle_cold_start(env.world, tools, load_config(None, OVERRIDES))
    renamed = oracle_cold_start(env.world, tools, cfg)
    assert renamed.trajectories == rename_trajectories(plain.trajectories, env.world.entities, (), seed=cfg.data.seed)
    assert renamed.trajectories != plain.trajectories
    with pytest.raises(ConfigError, match="oracle_rename"):
        load_config(None, SMALL + ["synthetic.oracle_rename=true"])


def test_the_rename_pool_all_draws_held_out_names_too():
    """oracle_rename_pool=all: the renaming may draw a held-out name (so SFT writes it), the default never does;
    the pool is refused without oracle_rename, which alone reads it."""
    renaming = OVERRIDES + ["synthetic.oracle_rename=true"]
    cfg = load_config(None, renaming)
    env = build_world(cfg)
    tools = build_tools(cfg, env.retriever)
    kind = {e.name: e.kind for e in env.world.entities}
    held = frozenset(sorted(n for n in kind if kind[n] == "person")[::2])  # half the persons held out
    plain = oracle_cold_start(env.world, tools, load_config(None, OVERRIDES), held).trajectories
    default = oracle_cold_start(env.world, tools, cfg, held).trajectories
    every = oracle_cold_start(env.world, tools, load_config(None, renaming + ["synthetic.oracle_rename_pool=all"]),
                              held).trajectories
    assert not {n for t in default for n in _names_in(t, kind)} & held
    assert {n for t in every for n in _names_in(t, kind)} & held
    assert every == rename_trajectories(plain, env.world.entities, (), seed=cfg.data.seed)
    with pytest.raises(ConfigError, match="oracle_rename_pool"):
        load_config(None, OVERRIDES + ["synthetic.oracle_rename_pool=all"])
    with pytest.raises(ValueError, match="oracle_rename_pool must be"):
        rename_excluded("everyone", held)


def test_the_cold_start_adds_copy_records_over_every_name_when_configured():
    cfg = load_config(None, OVERRIDES + ["synthetic.copy_sft_examples=30"])
    env = build_world(cfg)
    cold = oracle_cold_start(env.world, build_tools(cfg, env.retriever), cfg, ["Nobody"])
    assert len(cold.copy_records) == 30
    names = {e.name for e in env.world.entities}
    assert all(set(r["messages"][-1]["content"].split(" ")) <= names for r in cold.copy_records)
    assert oracle_cold_start(env.world, build_tools(cfg, env.retriever),
                             load_config(None, OVERRIDES)).copy_records == []
    with pytest.raises(ConfigError, match="copy_sft_examples"):
        load_config(None, SMALL + ["synthetic.copy_sft_examples=3"])


def test_multi_word_names_are_renamed_whole():
    """Default-style names have one to three words ("Tusi Varn", "<Word> River"): a name is replaced
    whole, never a word of it."""
    overrides = [o for o in OVERRIDES if not o.startswith("synthetic.world_names")] + ["synthetic.world_names=default"]
    cfg = load_config(None, overrides)
    env = build_world(cfg)
    trajectories = oracle_cold_start(env.world, build_tools(cfg, env.retriever), cfg).trajectories
    names = {e.name for e in env.world.entities}
    multi = {n for n in names if " " in n}
    renamed = rename_trajectories(trajectories, env.world.entities, (), seed=0)
    assert any(set(_names_in(t, multi)) for t in trajectories)
    for before, after in zip(trajectories, renamed):
        assert len(_names_in(before, names)) == len(_names_in(after, names))
        assert compute_score(after.response_text, after.golds)["em"] == before.score["em"]


def _alternation(names):
    """The plain reference: every name as one alternative, longest first."""
    ordered = sorted(names, key=lambda name: (-len(name), name))
    return re.compile(r"(?<!\w)(" + "|".join(re.escape(name) for name in ordered) + r")(?!\w)")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_trie_pattern_matches_as_the_longest_first_alternation(seed):
    """`_name_pattern` (a trie) finds exactly the spans the alternation of the names finds: names that
    are prefixes of one another ("Ann", "Anna", "Ann Lee"), regex metacharacters, names inside longer
    words (no match), random texts built from them."""
    rng = random.Random(seed)
    words = ["Ann", "Anna", "Ann Lee", "Ann Leen", "Bo", "Bob", "B.o", "C++", "Lee", "Xi Ann", "Ann-Marie", "Dé"]
    names = rng.sample(words, 8) + ["".join(rng.choice("abAB ") for _ in range(rng.randint(1, 5))).strip() or "q"
                                    for _ in range(20)]
    pattern, reference = _name_pattern(names), _alternation(set(names))
    pieces = words + names + [" ", " ", ", ", "x", "Annex", "-", "."]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert [m.span(1) for m in pattern.finditer(text)] == [m.span(1) for m in reference.finditer(text)], text
    assert _name_pattern([]).search("anything") is None and _name_pattern([""]).search("x") is None
