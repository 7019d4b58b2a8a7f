"""mempo.eval.run on the synthetic world: oracle EM, token counting by hand, a tiny random model."""
import json
import math

import pytest

pytest.importorskip("transformers")

from mempo.synthetic.build import build_world
from mempo.eval import EvalReport, closed_book_policy, eval_episodes, evaluate, round_prompt_tokens
from mempo.synthetic.backend import OracleBackend
from mempo.config import config_from_dict
from mempo.env.build import build_tools
from support.rollout_fixtures import chat_tokenizer, tiny_qwen2


def _cfg(**eval_section):
    section = {"objectives": [1, 2], "episodes": 2, "policies": ["memory", "full"], **eval_section}
    return config_from_dict({"synthetic": {"world_entities": 30}, "env": {"topk": 3, "doc_chars": 600},
                             "rollout": {"max_new_tokens_per_round": 400}, "eval": section})


@pytest.fixture(scope="module")
def world():
    return build_world(_cfg())


def _chatml(messages):
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + "<|im_start|>assistant\n"


def test_oracle_backend_em_is_one_and_tokens_match_a_hand_count(world):
    from mempo.synthetic.oracle import run_oracle
    from mempo.env.tools import make_tools

    w, retriever = world
    cfg = _cfg()
    tok = chat_tokenizer()
    episodes = eval_episodes(w, cfg)
    report = evaluate(None, tok, episodes, retriever, cfg, backend=OracleBackend(tok), show_progress=False,
                      log=lambda line: None, keep_trajectories=True)
    assert len(report.rows) == 4
    for row in report.rows:
        assert row.em == 1.0 and row.f1 == 1.0 and row.score == 1.0 and row.format_rate == 1.0
        assert row.answer_rate == 1.0 and row.episodes == 2
    tools = make_tools(retriever, options={"search": {"topk": 3, "doc_chars": 600}})
    for k, eps in episodes.items():
        for episode, traj in zip(eps, report.trajectories[("", k, "memory")]):
            # hand count: the ChatML text of the messages the oracle saw, encoded by the tokenizer
            oracle = run_oracle(episode, tools, policy="memory")
            expected = [len(tok.encode(_chatml(r.messages), add_special_tokens=False)) for r in oracle.rounds]
            assert round_prompt_tokens(traj) == expected
        for traj in report.trajectories[("", k, "full")]:
            # full context: the prompt plus everything before the round (rounds and tool segments)
            expected, seen = [], len(traj.prompt_ids)
            for r in traj.rounds:
                expected.append(seen)
                seen += r.tool_end - r.start
            assert round_prompt_tokens(traj) == expected
        for policy in ("memory", "full"):
            trajs = report.trajectories[("", k, policy)]
            row = report.row(k, policy)
            sums = [sum(round_prompt_tokens(t)) for t in trajs]
            assert row.prompt_tokens_per_episode == pytest.approx(sum(sums) / len(sums))
            assert row.peak_prompt_tokens == max(max(round_prompt_tokens(t)) for t in trajs)
            assert row.mean_turns == pytest.approx(sum(len(t.rounds) for t in trajs) / len(trajs))
    # memory context is cheaper than the full history for the same answers
    assert report.row(2, "memory").prompt_tokens_per_episode < report.row(2, "full").prompt_tokens_per_episode


def test_one_round_answer_counts_exactly_the_first_prompt(world):
    from mempo.protocol.memory import DEFAULT_SYSTEM_PROMPT
    from mempo.rollout.backends import ScriptedBackend, round_script

    _, retriever = world
    tok = chat_tokenizer()
    cfg = _cfg(objectives=[1], policies=["memory"])
    task = {"id": "q", "prompt": "Who wrote it?", "golds": ["Ann"]}
    backend = ScriptedBackend(round_script(tok, {"q": ["</mem>\n<think>\nx\n</think>\n<answer>Ann</answer>"]}), tok)
    report = evaluate(None, tok, {1: [task]}, retriever, cfg, backend=backend, show_progress=False,
                      log=lambda line: None)
    row = report.row(1, "memory")
    hand = len(tok.encode(_chatml([{"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
                                   {"role": "user", "content": "Who wrote it?"}]), add_special_tokens=False))
    assert row.em == 1.0 and row.mean_turns == 1.0
    assert row.prompt_tokens_per_episode == hand and row.peak_prompt_tokens == hand


def test_tiny_random_model_reports_finite_numbers(world, tmp_path):
    w, retriever = world
    tok = chat_tokenizer()
    model = tiny_qwen2(len(tok))
    cfg = _cfg(objectives=[1, 2], episodes=2, max_turns=3)
    report = evaluate(model, tok, eval_episodes(w, cfg), retriever, cfg, max_new_tokens=12, show_progress=False,
                      log=lambda line: None)
    assert len(report.rows) == 4
    for row in report.rows:
        for name, value in vars(row).items():
            if isinstance(value, float):
                assert math.isfinite(value), name
        assert 0.0 <= row.em <= 1.0 and row.mean_turns >= 1 and row.peak_prompt_tokens > 0
    assert report.metadata["parameters"] > 0 and report.metadata["machine"]["cpu_count"]
    paths = report.write(tmp_path, "eval")
    loaded = EvalReport.load(paths["json"])
    assert loaded.rows == report.rows
    table = paths["markdown"].read_text()
    assert "| k | policy |" in table and table.count("\n| ") >= 5
    assert json.loads(paths["json"].read_text())["metadata"]["max_new_tokens"] == 12


def test_closed_book_adds_a_row_per_policy_where_no_search_finds_anything(world, tmp_path):
    w, retriever = world
    cfg = _cfg(closed_book=True)
    tok = chat_tokenizer()
    lines = []
    report = evaluate(None, tok, eval_episodes(w, cfg), retriever, cfg, backend=OracleBackend(tok),
                      show_progress=False, log=lines.append, keep_trajectories=True, label="before RL")
    assert [(r.objectives, r.policy) for r in report.rows] == [
        (k, p) for k in (1, 2) for p in ("memory", "memory-closed-book", "full", "full-closed-book")]
    assert report.metadata["label"] == "before RL" and all(line.startswith("eval before RL: k=") for line in lines)
    for policy in ("memory", "full"):
        opened, closed = report.row(2, policy), report.row(2, closed_book_policy(policy))
        assert opened.em == 1.0 and closed.em < opened.em and closed.episodes == opened.episodes
        results = [tok.decode(t.response_ids[r.end:r.tool_end]) for t in report.trajectories[
            ("", 2, closed_book_policy(policy))] for r in t.rounds if r.action == "search"]
        assert results and all("No results found" in text for text in results)
    assert report.metadata["closed_book"] is True
    assert "eval/em@k2_memory-closed-book" in report.scalars("eval/")
    paths = report.write(tmp_path, "eval")
    assert "memory-closed-book" in (tmp_path / "eval.md").read_text()
    loaded = EvalReport.load(tmp_path / "eval.json")
    assert loaded.row(2, "memory-closed-book").em == report.row(2, "memory-closed-book").em
    assert paths


def test_greedy_results_do_not_depend_on_batch_episodes(world):
    """eval.batch_episodes only groups episodes into generate calls: greedy trajectories (every
    generated id) and rows are the same for one episode a call, odd groups and all at once."""
    w, retriever = world
    tok = chat_tokenizer()
    model = tiny_qwen2(len(tok))
    runs = {}
    for batch in (1, 3, 16):
        cfg = _cfg(objectives=[2], episodes=5, max_turns=3, policies=["memory"], batch_episodes=batch)
        report = evaluate(model, tok, eval_episodes(w, cfg), retriever, cfg, max_new_tokens=10, show_progress=False,
                          log=lambda line: None, keep_trajectories=True)
        runs[batch] = ([t.response_ids for t in report.trajectories[("", 2, "memory")]],
                       [(r.em, r.mean_turns, r.prompt_tokens_per_episode) for r in report.rows])
    assert runs[1][0] and any(len(ids) > 0 for ids in runs[1][0])
    assert runs[1] == runs[3] == runs[16]


def test_batch_episodes_must_be_positive():
    with pytest.raises(Exception, match="batch_episodes"):
        _cfg(batch_episodes=0)


def test_evaluation_calls_a_users_tools_in_the_json_format_and_scores_with_a_users_reward(world):
    """A scripted agent calls the user's lookup with a Hermes JSON call, then answers each question with
    its first gold; the user's reward (tests/support/user_tools.py) scores the episodes from their examples."""
    from mempo.rollout.backends import ScriptedBackend
    from support import user_tools

    w, retriever = world
    tok = chat_tokenizer()
    cfg = config_from_dict({"synthetic": {"world_entities": 30},
                            "env": {"topk": 3, "doc_chars": 600, "tools": ["support.user_tools:lookup", "search"]},
                            "rollout": {"max_new_tokens_per_round": 400, "action_format": "json",
                                        "outcome_reward": "support.user_tools:overlap_reward"},
                            "eval": {"objectives": [2], "episodes": 2, "policies": ["memory"], "max_turns": 3}})
    episodes = eval_episodes(w, cfg)
    answers = {e.prompt: "; ".join(aliases[0] for aliases in e.golds) for e in episodes[2]}

    def respond(request):
        text = tok.decode(request.prompt_ids)
        if "<tool_response>" not in text:
            return tok.encode('</mem><think>t</think><tool_call>{"name": "lookup", "arguments": {"key": "sky"}}'
                              "</tool_call>", add_special_tokens=False)
        answer = next(a for prompt, a in answers.items() if prompt in text)
        return tok.encode(f"sky is blue</mem><think>t</think><answer>{answer}</answer>", add_special_tokens=False)

    user_tools.LOOKUPS.clear()
    user_tools.REWARD_CALLS.clear()
    report = evaluate(None, tok, episodes, retriever, cfg, backend=ScriptedBackend(respond, tok), show_progress=False,
                      log=lambda line: None)
    (row,) = report.rows
    assert user_tools.LOOKUPS == ["sky", "sky"] and row.tool_calls == 2 and row.failed_tool_calls == 0
    assert row.em == row.score == 1.0 and row.format_rate == 1.0 and len(user_tools.REWARD_CALLS) == 2
    assert {e["prompt"] for _, e in user_tools.REWARD_CALLS} == set(answers)


def test_a_failed_call_warning_names_the_retriever_only_when_a_builtin_tool_queries_it():
    from mempo.env.closed_book import ClosedBookRetriever
    from mempo.eval.run import tools_name
    from mempo.synthetic.ledger_tools import ledger_tools
    from mempo.tools import Toolset

    cfg = config_from_dict({})
    builtin = build_tools(cfg, ClosedBookRetriever())
    assert tools_name(builtin, ClosedBookRetriever()) == "retriever: ClosedBookRetriever"
    # the ledger's tools query no retriever (its TaskEnv holds a placeholder): the warning names the tools
    assert tools_name(Toolset(ledger_tools(None)), ClosedBookRetriever()) == "tools: lookup, calc"
