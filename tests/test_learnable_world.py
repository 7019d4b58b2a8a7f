"""The demo's learnable setting: small-world options from the config, the imperfect SFT teacher
from the config, the copy warm-up, the <mem>-keeps-the-facts measure and standard errors."""
import math

import pytest
import torch

from mempo.config import ConfigError, load_config
from mempo.env.build import build_tools, build_world, synthetic_world
from mempo.env.oracle import run_oracle
from mempo.eval import summarize
from mempo.model.builtin import tiny_model, train_tokenizer
from mempo.protocol.reward import memory_keeps
from mempo.train.copy_warmup import copy_warmup
from mempo.train.sft import oracle_agent, oracle_cold_start

SMALL = ["data.world_entities=200", "data.world_relations=[birthplace,alma_mater]", "data.world_names=short",
         "data.world_article_style=facts", "data.article_fillers=[0,0]", "data.world_chronicles=false",
         "data.world_distractor_ratio=0", "data.world_question_hops=[1]", "data.world_prompt_style=compact"]


def test_world_options_reach_the_world():
    world = synthetic_world(load_config(None, SMALL))
    assert {e.kind for e in world.entities} == {"person", "city", "university"}
    assert all(" " not in e.name for e in world.entities)  # one-word names
    assert world.num_documents == len(world.entities)  # no chronicles, no distractors
    episode = world.episodes(2, 1, seed=0)[0]
    assert "Give all 2 answers in one <answer>" in episode.prompt  # the compact prompt
    assert all(len(q.split()) <= 8 for q in episode.questions)
    relations = {f.relation for e in world.entities for f in getattr(e, "facts", ())}
    assert relations <= {"birthplace", "alma_mater"}
    # the defaults leave the world as it was
    assert synthetic_world(load_config(None, ["data.world_entities=40"])).manifest() == \
        synthetic_world(load_config(None, ["data.world_entities=40", "data.world_names=default",
                                           "data.world_chronicles=true"])).manifest()


@pytest.mark.parametrize("override, field", [("data.world_relations=[]", "data.world_relations"),
                                              ("data.world_question_hops=[0]", "data.world_question_hops"),
                                              ("data.world_distractor_ratio=-1", "data.world_distractor_ratio"),
                                              ("data.world_names=long", "data.world_names"),
                                              ("sft.oracle_drop_fact_prob=1.5", "sft.oracle_drop_fact_prob"),
                                              ("demo.copy_warmup_steps=-1", "demo.copy_warmup_steps")])
def test_bad_options_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(None, [override])


def test_the_imperfect_teacher_from_the_config():
    overrides = SMALL + ["sft.objectives=[2]", "sft.episodes=40", "sft.oracle_memory_style=facts",
                         "sft.oracle_query_style=question", "sft.oracle_think=minimal", "sft.oracle_answer_template=true"]
    perfect_cfg = load_config(None, overrides + ["sft.keep=all"])
    env = build_world(perfect_cfg)
    tools = build_tools(perfect_cfg, env.retriever)
    perfect = oracle_cold_start(env.world, tools, perfect_cfg)
    assert all(t.score["score"] == 1.0 for t in perfect.trajectories)
    lossy_cfg = load_config(None, overrides + ["sft.keep=all", "sft.oracle_drop_fact_prob=0.5"])
    lossy = oracle_cold_start(env.world, tools, lossy_cfg)
    assert len(lossy.trajectories) == len(perfect.trajectories) == 40 and not lossy.all_kept
    failed = [t for t in lossy.trajectories if t.score["score"] < 1.0]
    assert 8 <= len(failed) <= 32  # about half lose Q1's fact, which the answer needs
    assert all("Q1: done" in t.response_text for t in failed)
    kept_correct = oracle_cold_start(env.world, tools, load_config(None, overrides + ["sft.oracle_drop_fact_prob=0.5"]))
    assert len(kept_correct.trajectories) == 40 - len(failed)  # keep: correct drops them
    agent = oracle_agent(lossy_cfg)
    assert (agent.drop_fact_prob, agent.memory_style, agent.query_style) == (0.5, "facts", "question")
    episode = env.world.episodes(2, 1, seed=1)[0]
    final = run_oracle(episode, tools, policy="memory", agent=oracle_agent(perfect_cfg)).rounds[-1].assistant
    assert final.endswith("<answer>\n" + "; ".join(g[0] for g in episode.golds) + "\n</answer>")


def test_memory_keeps():
    seen = "<information>Tamor was born in the city of Belis.</information>"
    golds = [["Belis"], ["Rome"]]
    assert memory_keeps("Q1: Tamor was born in the city of Belis.\nQ2: ?", seen, golds) is True
    assert memory_keeps("Q1: done\nQ2: ?", seen, golds) is False
    assert memory_keeps("Q1: Belisar", seen, golds) is False  # whole words only
    assert memory_keeps("Q1: ?", "<information>nothing yet</information>", golds) is None
    assert memory_keeps("Belis and Rome", seen + " Rome", golds) is True


def test_copy_warmup_teaches_copying():
    tokenizer = train_tokenizer(["alpha beta gamma delta " * 20], vocab_size=300)
    model = tiny_model(tokenizer, "tiny", seed=0, hidden_size=64, num_hidden_layers=2)
    pool = list(range(40, 80))
    torch.manual_seed(0)
    result = copy_warmup(model, pool, steps=120, lr=3e-3, rows=16, min_len=6, max_len=6, seed=0)
    assert result.steps == 120 and len(result.losses) == 120
    assert math.isfinite(result.last_loss)
    # a fixed length: copying by position is learned within the run (chance is ln 40 = 3.7 nats)
    assert sum(result.losses[:10]) / 10 > 3.0 and sum(result.losses[-10:]) / 10 < 1.5, result.losses[::10]
    with pytest.raises(ValueError, match="at least 2 distinct"):
        copy_warmup(model, [5], steps=1)
    with pytest.raises(ValueError, match="token ids must be in"):
        copy_warmup(model, [1, 10 ** 6], steps=1)
    with pytest.raises(ValueError, match="min_len"):
        copy_warmup(model, pool, steps=1, min_len=5, max_len=4)


def test_eval_rows_carry_standard_errors():
    class T:
        def __init__(self, em):
            self.outcome, self.rounds, self.prompt_ids, self.response_mask = {"em": em, "f1": em}, [], [1], [1]
            self.finish_reason = "answer"

    row = summarize([T(1.0), T(0.0), T(1.0), T(0.0)], 2, "memory")
    assert row.em == 0.5 and row.em_se == pytest.approx(math.sqrt(1 / 3 / 4))
    assert summarize([T(1.0)], 2, "memory").em_se == 0.0
