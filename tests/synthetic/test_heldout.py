"""mempo.synthetic.heldout: no SFT or RL question of the demo (cold start, RL episodes) or of the
trainer's episode pool is about an entity an evaluation question asks about, at every evaluated k;
the draw itself (no held-out subject, World.episodes' draws when nothing is held out, reuse only
across episodes when the world runs short)."""
import dataclasses
import re

import pytest

from mempo.apps.demo import load_demo_config, rl_episodes
from mempo.env.build import build_tools
from mempo.env.data import Episode
from mempo.eval import eval_episodes
from mempo.synthetic.build import build_world
from mempo.synthetic.cold_start import oracle_cold_start
from mempo.synthetic.heldout import held_out_subjects, question_subjects, training_episodes
from mempo.train.trainer import _episode_pool


def _names_asked(questions, names):
    """The names of `names` that occur as a word in any of `questions` (read from the text, not from
    the episodes' metadata)."""
    words = {w for q in questions for w in re.findall(r"[A-Za-z]+", q)}
    return words & names


@pytest.fixture(scope="module")
def demo():
    cfg = load_demo_config(overrides=["eval.objectives=[2,4,6]", "synthetic.oracle_episodes=128"])
    env = build_world(cfg)
    return cfg, env


def test_no_sft_or_rl_question_is_about_an_evaluated_entity(demo):
    cfg, env = demo
    evaluated = eval_episodes(env.world, cfg)
    held = held_out_subjects(evaluated)
    persons = {e.name for e in env.world.entities if e.kind == "person"}
    asked = {n for eps in evaluated.values() for n in _names_asked([q for e in eps for q in e.questions], persons)}
    assert held == asked and len(held) > 300  # every evaluated k's subjects, read from the questions too

    cold = oracle_cold_start(env.world, build_tools(cfg, env.retriever), cfg, held)
    assert len(cold.trajectories) == 128 * len(cfg.synthetic.oracle_objectives) and cold.held_out == len(held)
    sft_questions = [line for t in cold.trajectories for line in t.prompt.splitlines()]
    rl = rl_episodes(cfg, env.world, held, cfg.trainer.total_steps)
    pool = _episode_pool(cfg, env.world)
    assert len(rl) == cfg.trainer.total_steps * cfg.data.questions_per_step
    for questions in (sft_questions, [q for e in rl for q in e.questions], [q for e in pool for q in e.questions]):
        assert questions and not _names_asked(questions, held)

    # the same draws without the held-out subjects do ask about evaluated entities: the check can fail
    unfiltered = training_episodes(env.world, cfg.data.num_objectives, len(rl), cfg.data.seed)
    assert _names_asked([q for e in unfiltered for q in e.questions], held)


def test_training_episodes_are_world_episodes_when_nothing_is_held_out(demo):
    _, env = demo
    drawn = training_episodes(env.world, 3, 20, 7)
    assert [e.to_json() for e in drawn] == [e.to_json() for e in env.world.episodes(3, 20, seed=7)]


def test_mixed_k_training_episodes_hold_out_and_never_repeat_a_question(demo):
    cfg, env = demo
    held = held_out_subjects(eval_episodes(env.world, cfg))
    episodes = training_episodes(env.world, [2, 4], 40, 7, held)
    assert [e.num_objectives for e in episodes] == [2, 4] * 20
    questions = [q for e in episodes for q in e.questions]
    assert len(questions) == len(set(questions)) == 120  # no question twice while the world has new ones
    assert not any(question_subjects(e) & held for e in episodes)
    assert training_episodes(env.world, [3], 5, 7) == training_episodes(env.world, 3, 5, 7)


def test_a_short_world_reuses_questions_across_episodes_only(demo):
    _, env = demo
    world = env.world
    keep = {e.name for e in world.entities if e.kind == "person"}
    held = set(sorted(keep)[30:])  # 30 persons left: at most 60 questions
    episodes = training_episodes(world, 2, 100, 3, held)
    assert len(episodes) == 100
    assert all(len(set(e.questions)) == 2 and not question_subjects(e) & held for e in episodes)
    assert len({q for e in episodes for q in e.questions}) <= 60
    with pytest.raises(ValueError, match="fewer than 2 objectives"):
        training_episodes(world, 2, 4, 3, set(sorted(keep)[1:]))
    # a cycle's k counts only where an episode is drawn at it: one episode of [2, 4] needs 2 questions
    few = set(sorted(keep)[2:])  # two persons left: 2 questions
    assert [e.num_objectives for e in training_episodes(world, [2, 4], 1, 3, few)] == [2]
    with pytest.raises(ValueError, match="fewer than 4 objectives"):
        training_episodes(world, [2, 4], 2, 3, few)


def test_question_subjects_needs_hop_chains():
    bare = Episode(id="e", questions=["q?"], golds=[["a"]], prompt="q?")
    with pytest.raises(ValueError, match="no hop chains"):
        question_subjects(bare)
    chained = dataclasses.replace(bare, metadata={"records": [{"chain": [{"subject": "Tamor"}, {"subject": "Belis"}]}]})
    assert question_subjects(chained) == {"Tamor", "Belis"}
    assert held_out_subjects({2: [chained]}) == held_out_subjects([chained]) == {"Tamor", "Belis"}
