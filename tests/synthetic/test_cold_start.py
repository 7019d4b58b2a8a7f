"""mempo.synthetic.cold_start: the imperfect teacher from the config (oracle_agent, synthetic.oracle_keep)."""
from mempo.config import load_config
from mempo.env.build import build_tools
from mempo.synthetic.build import build_world
from mempo.synthetic.oracle import run_oracle
from mempo.synthetic.cold_start import oracle_agent, oracle_cold_start
from support.small_world import SMALL


def test_the_imperfect_teacher_from_the_config():
    overrides = SMALL + ["synthetic.oracle_objectives=[2]", "synthetic.oracle_episodes=40",
                         "synthetic.oracle_memory_style=facts", "synthetic.oracle_query_style=question",
                         "synthetic.oracle_think=minimal", "synthetic.oracle_answer_template=true"]
    perfect_cfg = load_config(None, overrides + ["synthetic.oracle_keep=all"])
    env = build_world(perfect_cfg)
    tools = build_tools(perfect_cfg, env.retriever)
    perfect = oracle_cold_start(env.world, tools, perfect_cfg)
    assert all(t.score["score"] == 1.0 for t in perfect.trajectories)
    lossy_cfg = load_config(None, overrides + ["synthetic.oracle_keep=all", "synthetic.oracle_drop_fact_prob=0.5"])
    lossy = oracle_cold_start(env.world, tools, lossy_cfg)
    assert len(lossy.trajectories) == len(perfect.trajectories) == 40 and not lossy.all_kept
    failed = [t for t in lossy.trajectories if t.score["score"] < 1.0]
    assert 8 <= len(failed) <= 32  # about half lose Q1's fact, which the answer needs
    assert all("Q1: done" in t.response_text for t in failed)
    kept_correct = oracle_cold_start(env.world, tools,
                                     load_config(None, overrides + ["synthetic.oracle_drop_fact_prob=0.5"]))
    assert len(kept_correct.trajectories) == 40 - len(failed)  # keep: correct drops them
    agent = oracle_agent(lossy_cfg)
    assert (agent.drop_fact_prob, agent.memory_style, agent.query_style) == (0.5, "facts", "question")
    episode = env.world.episodes(2, 1, seed=1)[0]
    final = run_oracle(episode, tools, policy="memory", agent=oracle_agent(perfect_cfg)).rounds[-1].assistant
    assert final.endswith("<answer>\n" + "; ".join(g[0] for g in episode.golds) + "\n</answer>")
    spaced_cfg = load_config(None, overrides + ["scoring.answer_template=spaced"])
    final = run_oracle(episode, tools, policy="memory", agent=oracle_agent(spaced_cfg)).rounds[-1].assistant
    assert final.endswith("<answer> " + "; ".join(g[0] for g in episode.golds) + " </answer>")  # scoring's template


def test_the_cold_start_uses_the_rollout_system_prompt():
    """SFT trains on the system message RL and evaluation will show (rollout.system_prompt)."""
    overrides = SMALL + ["synthetic.oracle_objectives=[1]", "synthetic.oracle_episodes=3",
                         "rollout.system_prompt=Be brief."]
    cfg = load_config(None, overrides)
    env = build_world(cfg)
    cold = oracle_cold_start(env.world, build_tools(cfg, env.retriever), cfg)
    assert cold.trajectories and all(t.system_prompt == "Be brief." for t in cold.trajectories)
    assert all(r.messages[0] == {"role": "system", "content": "Be brief."} for t in cold.trajectories for r in t.rounds)
