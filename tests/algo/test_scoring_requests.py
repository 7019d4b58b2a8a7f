"""Trajectories -> teacher-scoring requests (mempo.algo.contexts) -> memory rewards
(mempo.algo.memory_reward) -> mempo_advantage inputs (mempo.algo.advantages)."""
import math

import pytest
import torch

from mempo.algo.advantages import advantage_inputs
from mempo.algo.contexts import DEFAULT_ANSWER_TEMPLATE, build_objective_answer, scoring_requests
from mempo.protocol.grammar import ANSWER_TEMPLATES, SPACED_ANSWER_TEMPLATE, answer_template_text
from mempo.algo.memory_reward import memory_rewards, memory_rewards_of
from mempo.algo.outcome import score_outcomes
from mempo.config import RolloutConfig
from mempo.ops import mempo_advantage
from mempo.records.scoring import ScoredRound, ScoringRequest, ScoringResult
from mempo.rollout.backends import ScriptedBackend, round_script
from mempo.rollout.loop import RolloutEngine
from support.rollout_fixtures import chat_tokenizer, needle_scripts, needle_task

ANSWER_PREFIX = "\n<think>\nI know it.\n</think>\n<answer>\n"
ANSWER_SUFFIX = "\n</answer>"


def answer_builder(golds, tok):
    """The ALGORITHM.md answer template; mask 1 on the gold's ids only."""
    gold = golds[0] if isinstance(golds[0], str) else golds[0][0]
    before = tok.encode(ANSWER_PREFIX, add_special_tokens=False)
    middle = tok.encode(gold, add_special_tokens=False)
    after = tok.encode(ANSWER_SUFFIX, add_special_tokens=False)
    return before + middle + after, [0] * len(before) + [1] * len(middle) + [0] * len(after)


@pytest.fixture(scope="module")
def batch(bm25):
    tok = chat_tokenizer()
    scripts = {
        "q3": needle_scripts(3, extra_search=True),  # rounds 2 and 3 scored
        ("q5", 0): needle_scripts(5),  # round 2 scored
        ("q5", 1): ["</mem><think>t</think><search>zebulon5</search>",
                    "   </mem><think>blank memory</think><answer>Needle 5</answer>"],  # blank <mem>: not scored
        ("q5", 2): ["round one memory</mem><think>t</think><answer>Needle 5</answer>"],  # round 1: never scored
    }
    backend = ScriptedBackend(round_script(tok, scripts), tok)
    config = RolloutConfig(group_size=3, max_new_tokens_per_round=128)
    trajectories = RolloutEngine(backend, tok, retriever=bm25, config=config).run([needle_task(3), needle_task(5)])
    return tok, score_outcomes(trajectories)


def test_scoring_requests_one_per_trajectory(batch):
    tok, trajectories = batch
    requests = scoring_requests(trajectories, tok, answer_builder)
    assert len(requests) == len(trajectories) and all(isinstance(r, ScoringRequest) for r in requests)
    assert [len(r.rounds) for r in requests] == [2, 2, 2, 1, 0, 0]
    for trajectory, request in zip(trajectories, requests):
        assert request.sequence_ids == trajectory.prompt_ids + trajectory.response_ids
        ids, mask = answer_builder(trajectory.golds, tok)
        assert (request.answer_ids, request.answer_mask) == (ids, mask)
        assert tok.decode([t for t, m in zip(ids, mask) if m]) == trajectory.golds[0]
        for scored, r in zip(request.rounds, trajectory.scored_rounds()):
            assert isinstance(scored, ScoredRound) and r.index >= 1
            # full_ctx[r]: everything before round r's own output (its forced <mem> included in the round)
            full_ctx = tok.decode(request.sequence_ids[:scored.full_end])
            assert full_ctx.endswith("<|im_start|>assistant\n") and full_ctx.count("<mem>") == r.index
            # mem_ctx[r]: system + question prompt, then the round's <mem>...</mem>
            assert scored.mem_ctx_ids[:len(trajectory.prompt_ids)] == trajectory.prompt_ids
            mem_text = tok.decode(scored.mem_ctx_ids[len(trajectory.prompt_ids):])
            assert mem_text.startswith("<mem>zebulon") and mem_text.rstrip().endswith("</mem>")
            assert "<information>" not in tok.decode(scored.mem_ctx_ids)


def test_memory_rewards_reach_the_mem_tokens(batch):
    tok, trajectories = batch
    with pytest.raises(ValueError, match="no memory rewards"):
        advantage_inputs(trajectories)
    with pytest.raises(ValueError, match="scored rounds"):
        memory_rewards_of(trajectories, [ScoringResult(p_full=[0.0], p_mem=[0.1])] * len(trajectories))
    with pytest.raises(TypeError, match="ScoringResult"):
        memory_rewards_of(trajectories, [[0.3, -0.1]] + [ScoringResult()] * (len(trajectories) - 1))
    mem = [[0.3, -0.1], [0.2, 0.0], [0.5, 0.1], [-0.4], [], []]  # P(mem_ctx) - 0.0: the rewards themselves
    mem_rewards = memory_rewards_of(trajectories, [ScoringResult(p_full=[0.0] * len(m), p_mem=m) for m in mem])
    assert mem_rewards[2] == pytest.approx([0.5, 0.1])
    scores, index, mask, rewards, offsets, spans = advantage_inputs(trajectories, memory_rewards=mem_rewards,
                                                                    pad_to=1500)
    assert mask.shape == (6, 1500) and list(index) == ["q3"] * 3 + ["q5"] * 3
    assert offsets.tolist() == [0, 2, 4, 6, 7, 7, 7] and spans.shape == (7, 2)
    assert scores.tolist() == [t.score for t in trajectories]
    advantages, _ = mempo_advantage(scores, index, mask, rewards, offsets, spans)
    assert torch.isfinite(advantages).all()
    # q5's pool: [-0.4] plus nothing else -> one value -> 0; q3's pool of 6 values is normalised
    pool = torch.tensor([0.3, -0.1, 0.2, 0.0, 0.5, 0.1])
    z = (pool - pool.mean()) / (pool.std() + 1e-6)
    outcome = advantages[0, 0]
    for row, k in ((0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)):
        start, end = trajectories[row].scored_rounds()[k].mem_span
        assert torch.allclose(advantages[row, start:end], outcome + z[2 * row + k], atol=1e-5)
        assert torch.allclose(advantages[row, end], outcome)  # past the <mem> span
    first = trajectories[0].rounds[0]
    assert (advantages[0, first.end:first.tool_end] == 0).all()  # tool tokens: mask 0
    assert not math.isnan(float(advantages[3].sum()))


def test_end_to_end_with_the_scoring_module(batch):
    """rollout -> scoring_requests (default answer template) -> mempo.scoring -> rewards -> advantages."""
    from mempo.scoring import score_packed, score_reference
    from support.rollout_fixtures import tiny_qwen2

    tok, trajectories = batch
    requests = scoring_requests(trajectories, tok)
    ids, mask = requests[0].answer_ids, requests[0].answer_mask
    assert tok.decode(ids) == DEFAULT_ANSWER_TEMPLATE.format(answer="Needle 3")
    assert tok.decode([t for t, m in zip(ids, mask) if m]).strip() == "Needle 3"
    model = tiny_qwen2(len(tok), seed=3)
    results = score_reference(model, requests, threshold=None)
    assert all(isinstance(r, ScoringResult) for r in results)
    packed = score_packed(model, requests, threshold=None)
    for a, b in zip(results, packed):
        assert memory_rewards(a) == pytest.approx(memory_rewards(b), abs=1e-5)
    mem_rewards = memory_rewards_of(trajectories, results)
    assert [len(m) for m in mem_rewards] == [2, 2, 2, 1, 0, 0]
    assert all(v != 0.0 for m in mem_rewards for v in m)
    advantages, _ = mempo_advantage(*advantage_inputs(trajectories, memory_rewards=mem_rewards))
    assert torch.isfinite(advantages).all()


def test_scoring_methods_agree_on_rollout_trajectories(bm25):
    """Real trajectories from the agent loop: multi-objective answers, a trajectory cut at the turn
    limit, a round without memory. Reference, packed and cached scoring agree to 1e-5 (fp32)."""
    from mempo.scoring import score_cached, score_packed, score_reference
    from support.rollout_fixtures import tiny_qwen2

    tok = chat_tokenizer()
    two_hops = ["</mem><think>first objective</think><search>zebulon3</search>",
                "zebulon3: Needle 3; next zebulon5</mem><think>second</think><search>zebulon5</search>",
                "zebulon3: Needle 3; zebulon5: Needle 5</mem><think>done</think><answer>Needle 3; Needle 5</answer>"]
    scripts = {("m", 0): two_hops,
               ("m", 1): two_hops[:2] + ["   </mem><think>no memory</think><answer>Needle 3; Needle 5</answer>"],
               ("t", 0): needle_scripts(4, extra_search=True), ("t", 1): needle_scripts(4, extra_search=True)}
    tasks = [{"id": "m", "prompt": "Which documents mention zebulon3 and zebulon5?",
              "golds": [["Needle 3"], ["Needle 5"]]},
             {"id": "t", "prompt": "Which document mentions zebulon4?", "golds": ["Needle 4"]}]
    engine = RolloutEngine(ScriptedBackend(round_script(tok, scripts), tok), tok, retriever=bm25,
                           config=RolloutConfig(group_size=2, max_new_tokens_per_round=128, max_turns=2))
    truncated = engine.run(tasks[1:])
    assert {t.finish_reason for t in truncated} == {"turn_limit"}
    engine = RolloutEngine(ScriptedBackend(round_script(tok, scripts), tok), tok, retriever=bm25,
                           config=RolloutConfig(group_size=2, max_new_tokens_per_round=128, max_turns=8))
    trajectories = engine.run(tasks[:1]) + truncated
    requests = scoring_requests(trajectories, tok)
    assert [len(r.rounds) for r in requests] == [2, 1, 1, 1]
    assert sum(requests[0].answer_mask) > 0
    model = tiny_qwen2(len(tok), seed=5)
    with torch.no_grad():  # scale the head so that a 0.5 threshold keeps some tokens and drops others
        model.lm_head.weight.mul_(40.0)
    for threshold in (None, 0.5):
        want = score_reference(model, requests, threshold=threshold)
        for method in (score_packed, score_cached):
            got = method(model, requests, threshold=threshold)
            for a, b in zip(want, got):
                assert a.p_full == pytest.approx(b.p_full, abs=1e-5)
                assert a.p_mem == pytest.approx(b.p_mem, abs=1e-5)
                assert memory_rewards(a) == pytest.approx(memory_rewards(b), abs=1e-5)


def test_the_spaced_template_spells_the_first_answer_as_the_memory_does(batch):
    """With a BPE that marks words by their leading space, the line template spells the first answer
    apart from how a <mem> line writes it; the spaced one writes the same ids."""
    from mempo.model.builtin import train_tokenizer

    tok = train_tokenizer(["Q1: Bedur was born in the city of Minu. The city of Minu."] * 50 +
                          ["Lidar; Minu studied at Lidar."] * 50, vocab_size=300)
    in_memory = tok.encode(" Minu", add_special_tokens=False)

    def first_answer_ids(template):
        ids, objectives = build_objective_answer(tok, ["Minu", "Lidar"], template)
        return [i for i, j in zip(ids, objectives) if j == 0]

    assert first_answer_ids(SPACED_ANSWER_TEMPLATE) == in_memory
    assert first_answer_ids(DEFAULT_ANSWER_TEMPLATE) != in_memory
    assert answer_template_text("spaced") == SPACED_ANSWER_TEMPLATE == ANSWER_TEMPLATES["spaced"]
    assert answer_template_text("line") == DEFAULT_ANSWER_TEMPLATE
    # scoring_requests builds the answer in the template it is given, and refuses a template with a builder
    chat_tok, trajectories = batch
    spaced = scoring_requests(trajectories, chat_tok, template=SPACED_ANSWER_TEMPLATE)
    line = scoring_requests(trajectories, chat_tok)
    assert chat_tok.decode(spaced[0].answer_ids).endswith(f"<answer> {trajectories[0].golds[0]} </answer>")
    assert [r.rounds for r in spaced] == [r.rounds for r in line] and spaced[0].answer_ids != line[0].answer_ids
    with pytest.raises(ValueError, match="answer_builder or a template"):
        scoring_requests(trajectories, chat_tok, answer_builder, template=SPACED_ANSWER_TEMPLATE)
