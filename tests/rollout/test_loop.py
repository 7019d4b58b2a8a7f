"""The agent loop with a scripted backend: both context policies, G samples of several questions,
answers, the turn limit, the token budget, malformed rounds, tool errors, concurrent tools, the HTTP
retriever, token-in/token-out, serialisation.

The scripted backend replays oracle-like round texts (tokenised with the test tokenizer, or as
deliberately non-canonical id sequences) so the loop runs deterministically; the retriever is the
shared BM25 fixture over `tests/support/corpus.py` (`needle-i` holds the unique word `zebulon<i>`).
"""
import threading

import pytest

from mempo.algo.outcome import score_outcomes
from mempo.config import MempoConfig, RolloutConfig
from mempo.env.client import HTTPRetriever
from mempo.env.server import RetrieverServer
from mempo.env.tools import make_tools
from mempo.eval import eval_rollout_config
from mempo.protocol.memory import AgentMemory
from mempo.protocol.reward import compute_score
from mempo.rollout.backends import RequestKey, ScriptedBackend, round_script
from mempo.rollout.chat import ChatFormat
from mempo.records.trajectory import Trajectory, read_trajectories_jsonl, write_trajectories_jsonl
from mempo.rollout.chat import render_builtin
from mempo.rollout.loop import RolloutEngine
from mempo.protocol.tags import JSON_TAG_SET
from mempo.tools import load_tools, tool
from support import user_tools
from support.rollout_fixtures import chat_tokenizer, merged_closer, needle_scripts, needle_task, raw_tokenizer


@pytest.fixture(scope="module")
def tok():
    return chat_tokenizer()


def engine(tok, scripts, retriever=None, tools=None, overgenerate=False, max_context_tokens=None, **config):
    backend = ScriptedBackend(round_script(tok, scripts), tok, overgenerate=overgenerate)
    config.setdefault("max_new_tokens_per_round", 128)
    return RolloutEngine(backend, tok, tools, retriever=retriever, config=RolloutConfig(**config),
                         max_context_tokens=max_context_tokens), backend


def scored_run(eng, tasks, **kwargs):
    """The engine's trajectories, scored as the rewards stage scores them (`score_outcomes`)."""
    return score_outcomes(eng.run(tasks, **kwargs))


def protocol_messages(trajectory: Trajectory, tok, system="You are a helpful assistant."):
    """The chat messages of the whole trajectory, rebuilt from the response ids (independently of
    the loop's memory)."""
    memory = AgentMemory(tok.decode(trajectory.prompt_ids).split("<|im_start|>user\n")[1].split("<|im_end|>")[0],
                         system_prompt=system)
    for r in trajectory.rounds:
        memory.add_llm_gen(tok.decode(trajectory.response_ids[r.start:r.end]))
        if r.information is not None:
            text = tok.decode(trajectory.response_ids[r.information[0]:r.information[1]])
            (memory.add_webpage if r.action == "access" else memory.add_search_results)(text)
    return memory


# ------------------------------------------------------------------------------------------------
# full policy, several questions x G samples
# ------------------------------------------------------------------------------------------------

def test_full_policy_groups_scores_offsets_and_masks(tok, bm25):
    scripts = {"q3": needle_scripts(3), ("q5", 1): needle_scripts(5, correct=False, extra_search=True),
               "q5": needle_scripts(5)}
    eng, backend = engine(tok, scripts, retriever=bm25, group_size=4)
    unscored = eng.run([needle_task(3), needle_task(5)])
    assert all(t.outcome == {} and t.protocol_text for t in unscored)  # the rewards stage scores them
    trajectories = score_outcomes(unscored)

    assert [(t.uid, t.sample_index) for t in trajectories] == [(q, g) for q in ("q3", "q5") for g in range(4)]
    # every step batches every active trajectory of every question
    assert [len(batch) for batch in backend.calls] == [8, 8, 1]
    assert eng.stats.batch_sizes == [8, 8, 1] and eng.stats.tool_calls == 9
    scores = [t.score for t in trajectories]
    assert scores == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    chat = ChatFormat(tok)
    for t in trajectories:
        t.validate()
        assert t.finish_reason == "answer" and t.policy == "full"
        assert t.outcome["format_ok"] and t.final_answer == t.outcome["answer"]
        assert t.prompt_ids == chat.prompt_ids(AgentMemory(needle_task(int(t.uid[1:]))["prompt"]).messages("full"))
        # masks: 1 exactly on the rounds (forced prefix included), 0 exactly on tool segments
        for r in t.rounds:
            assert t.response_mask[r.start:r.end] == [1] * (r.end - r.start)
            assert t.response_mask[r.end:r.tool_end] == [0] * (r.tool_end - r.end)
            assert t.response_ids[r.start:r.start + r.prefix_len] == chat.prefix_ids
            assert r.full_end == len(t.prompt_ids) + r.start
            assert t.sequence_ids[:r.full_end] == t.round_context_ids(r)
        # round 1 has an empty <mem>: no span; later rounds: the span decodes to the <mem> block
        assert t.rounds[0].mem_span is None
        for r in t.rounds[1:]:
            text = tok.decode(t.response_ids[r.mem_span[0]:r.mem_span[1]])
            assert text.startswith("<mem>zebulon") and "</mem>" in text and r.scored
        # the protocol text decoded from the ids scores the same
        assert compute_score(t.response_text(tok), t.golds)["score"] == t.score
        assert t.response_text(tok) == t.protocol_text  # no tool text cut or normalised here
        # the one sequence is the chat rendering of AgentMemory.messages("full"), turn by turn
        memory = protocol_messages(t, tok)
        assert all(record.text.count("<mem>") == 1 for record in memory.records if record.type == "llm_gen")
        expected = render_builtin(memory.messages("full"), add_generation_prompt=False)
        assert tok.decode(t.sequence_ids) + "<|im_end|>\n" == expected
    wrong = trajectories[5]
    assert [r.action for r in wrong.rounds] == ["search", "search", "answer"]
    assert [r.action_argument for r in wrong.rounds] == ["zebulon5", "zebulon5 river", "Needle 6"]
    assert wrong.final_answer == "Needle 6" and wrong.rounds[0].tool_ok is True


def test_memory_policy_records_each_round_prompt(tok, bm25):
    scripts = {"q4": ["</mem><think>find it</think><search>zebulon4</search>",
                      "search found needle-4</mem><think>read it</think><access>needle-4</access>",
                      "needle-4 is Needle 4</mem><think>done</think><answer>Needle 4</answer>"]}
    eng, backend = engine(tok, scripts, retriever=bm25, group_size=2, context_policy="memory")
    trajectories = scored_run(eng, [needle_task(4)])
    chat = ChatFormat(tok)
    for t in trajectories:
        t.validate()
        assert t.policy == "memory" and t.finish_reason == "answer" and t.score == 1.0
        assert [r.action for r in t.rounds] == ["search", "access", "answer"]
        # replay the memory independently: each round's recorded prompt is the memory-context prompt
        memory = AgentMemory(needle_task(4)["prompt"])
        for r in t.rounds:
            assert r.prompt_ids == chat.prompt_ids(memory.messages("memory"))
            assert backend.calls[r.index][t.sample_index].prompt_ids == r.prompt_ids + chat.prefix_ids
            memory.add_llm_gen(tok.decode(t.response_ids[r.start:r.end]), forced_prefix="<mem>")
            if r.information is not None:
                info = tok.decode(t.response_ids[r.information[0]:r.information[1]])
                (memory.add_webpage if r.action == "access" else memory.add_search_results)(info)
        # round 3 saw the web page only as its short text (100 characters + notice), not whole
        last_prompt = tok.decode(t.rounds[2].prompt_ids)
        assert "first 100 of" in last_prompt and "search found needle-4" in last_prompt
        assert last_prompt.count("<mem>") == 1  # the one assistant turn kept holds its <mem> once
        assert "zebulon4</search>" not in last_prompt  # round 1 dropped from the memory context
        # full_ctx of a memory-policy trajectory is the (unseen) full history
        assert "zebulon4</search>" in tok.decode(t.sequence_ids[:t.rounds[2].full_end])


def test_forced_prefix_mask_can_be_zero(tok, bm25):
    eng, _ = engine(tok, {"q3": needle_scripts(3)}, retriever=bm25, group_size=1, train_forced_prefix=False)
    (t,) = scored_run(eng, [needle_task(3)])
    for r in t.rounds:
        assert t.response_mask[r.start:r.start + r.prefix_len] == [0] * r.prefix_len
        assert t.response_mask[r.start + r.prefix_len:r.end] == [1] * (r.end - r.start - r.prefix_len)


def test_builtin_template_with_a_bare_tokenizer(bm25):
    tok = raw_tokenizer()
    eng, _ = engine(tok, {"q3": needle_scripts(3)}, retriever=bm25, group_size=2)
    assert not eng.chat.uses_tokenizer_template
    trajectories = scored_run(eng, [needle_task(3)])
    assert [t.score for t in trajectories] == [1.0, 1.0]
    hf = ChatFormat(chat_tokenizer())
    assert hf.uses_tokenizer_template and hf.tool_glue() == eng.chat.tool_glue()
    assert trajectories[0].prompt_ids == hf.prompt_ids(AgentMemory(needle_task(3)["prompt"]).messages("full"))


# ------------------------------------------------------------------------------------------------
# token-in / token-out
# ------------------------------------------------------------------------------------------------

def char_ids(tok, text):
    """A valid but non-canonical tokenisation: one id per character (all single-byte characters)."""
    return [tok.convert_tokens_to_ids(tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(c)[0][0]) for c in text]


def test_generated_ids_are_stored_as_generated(tok, bm25):
    texts = needle_scripts(3)
    scripts = {"q3": [char_ids(tok, text) for text in texts]}
    eng, backend = engine(tok, scripts, retriever=bm25, group_size=2)
    trajectories = scored_run(eng, [needle_task(3)])
    for t in trajectories:
        assert t.score == 1.0
        for r in t.rounds:
            raw = backend.raw_outputs[RequestKey("q3", t.sample_index, r.index)]
            stored = t.response_ids[r.start + r.prefix_len:r.end]
            assert stored == raw
            # re-tokenising the text would give different ids: a loop that did so fails above
            assert tok.encode(tok.decode(raw), add_special_tokens=False) != raw


def test_overgenerating_backend_is_cut_after_the_token_closing_the_action(tok, bm25):
    closer, piece = merged_closer(tok)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    round1 = enc("</mem><think>go</think><search>zebulon3</search") + [closer] + enc("junk <answer>x</answer> more")
    round2 = enc("zebulon3 is in Needle 3</mem><think>ok</think><answer>Needle 3</answer>") + enc(" trailing <search>")
    eng, backend = engine(tok, {"q3": [round1, round2]}, retriever=bm25, group_size=1, overgenerate=True)
    (t,) = scored_run(eng, [needle_task(3)])
    r1, r2 = t.rounds
    assert t.response_ids[r1.end - 1] == closer  # kept whole, merged trailing bytes and all
    assert t.response_ids[r1.start + r1.prefix_len:r1.end] == round1[:round1.index(closer) + 1]
    assert r1.action == "search" and r1.action_argument == "zebulon3" and r1.stop_reason == "action"
    assert tok.decode(t.response_ids[r2.start:r2.end]).endswith("</answer>")
    assert t.finish_reason == "answer" and t.final_answer == "Needle 3"
    # the merged bytes after the marker are text outside tags for the format check
    assert t.score == (1.0 if piece[1:].strip() == b"" else 0.0)


# ------------------------------------------------------------------------------------------------
# ends: turn limit, token budget, malformed rounds
# ------------------------------------------------------------------------------------------------

def test_turn_limit_stops_without_calling_the_last_tool(tok, bm25):
    forever = ["</mem><think>t</think><search>zebulon1</search>"] + \
              [f"step {i}</mem><think>t</think><search>zebulon1</search>" for i in range(1, 10)]
    eng, _ = engine(tok, {"q1": forever}, retriever=bm25, group_size=2, max_turns=3)
    trajectories = scored_run(eng, [needle_task(1)])
    for t in trajectories:
        t.validate()
        assert t.finish_reason == "turn_limit" and len(t.rounds) == 3 and t.score == 0.0
        assert t.rounds[-1].tool_end == t.rounds[-1].end and t.rounds[-1].information is None
        assert "ends_with_answer" in t.outcome["failed_rules"]
    assert eng.stats.tool_calls == 4


def test_token_budget_during_generation_and_in_a_tool_segment(tok, bm25):
    scripts = {"q3": needle_scripts(3)}
    eng, _ = engine(tok, scripts, retriever=bm25, group_size=1, max_response_tokens=30)
    (t,) = scored_run(eng, [needle_task(3)])
    assert t.finish_reason == "token_budget" and len(t.response_ids) <= 30 and t.score == 0.0
    assert t.rounds[0].stop_reason == "length" and t.rounds[0].action is None

    first_round = len(eng.chat.prefix_ids) + len(tok.encode(scripts["q3"][0], add_special_tokens=False))
    eng, _ = engine(tok, scripts, retriever=bm25, group_size=1, max_response_tokens=first_round + 20)
    (t,) = scored_run(eng, [needle_task(3)])
    t.validate()
    assert t.finish_reason == "token_budget" and len(t.response_ids) == first_round + 20
    assert t.rounds[0].action == "search" and t.rounds[0].tool_end == first_round + 20

    eng, _ = engine(tok, scripts, retriever=bm25, group_size=1, max_context_tokens=60)
    (t,) = scored_run(eng, [needle_task(3)])
    assert t.finish_reason == "token_budget"


def test_malformed_rounds_end_the_trajectory_with_score_zero(tok, bm25):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    no_action = tok.encode("</mem><think>I will just stop</think>", add_special_tokens=False) + [im_end]
    rambling = tok.encode("</mem><think>" + "and then " * 80, add_special_tokens=False)
    eng, _ = engine(tok, {("q1", 0): [no_action], ("q1", 1): [rambling]}, retriever=bm25, group_size=2,
                    max_new_tokens_per_round=64)
    eos_t, long_t = scored_run(eng, [needle_task(1)])
    for t in (eos_t, long_t):
        t.validate()
        assert t.finish_reason == "malformed" and t.score == 0.0 and len(t.rounds) == 1
        assert t.rounds[0].action is None and not t.outcome["format_ok"]
    assert eos_t.rounds[0].stop_reason == "eos" and eos_t.response_ids[-1] == im_end
    assert long_t.rounds[0].stop_reason == "length" and long_t.rounds[0].num_tokens == 64 + len(eng.chat.prefix_ids)


# ------------------------------------------------------------------------------------------------
# tools: errors, concurrency, HTTP
# ------------------------------------------------------------------------------------------------

def test_tool_errors_become_information_and_the_loop_goes_on(tok, bm25):
    @tool(name="search")
    def broken_search(query: str) -> str:
        raise RuntimeError("index offline")

    scripts = {"q2": ["</mem><think>t</think><access>no-such-doc</access>",
                      "missing doc</mem><think>t</think><search>zebulon2</search>",
                      "search broke</mem><think>t</think><answer>Needle 2</answer>"]}
    tools = {"access": make_tools(bm25)["access"], "search": broken_search}
    eng, _ = engine(tok, scripts, tools=tools, group_size=1)
    (t,) = scored_run(eng, [needle_task(2)])
    t.validate()
    assert [r.tool_ok for r in t.rounds] == [False, False, None]
    first = tok.decode(t.response_ids[t.rounds[0].information[0]:t.rounds[0].information[1]])
    second = tok.decode(t.response_ids[t.rounds[1].information[0]:t.rounds[1].information[1]])
    assert first.startswith("<information>Error: no document with ID 'no-such-doc'")
    assert second.startswith("<information>Error: the search tool failed (RuntimeError: index offline)")
    assert t.finish_reason == "answer" and t.score == 1.0 and eng.stats.tool_errors == 2

    # without tools the tags format has no <access> tag: the round holds no action and is malformed
    eng, _ = engine(tok, scripts, tools={}, group_size=1)
    (t,) = scored_run(eng, [needle_task(2)])
    assert eng.tags.names == ("mem", "think", "answer", "information")
    assert t.finish_reason == "malformed" and len(t.rounds) == 1 and t.rounds[0].action is None


def test_tool_calls_of_one_step_run_concurrently(tok, bm25):
    group = 4
    barrier = threading.Barrier(group, timeout=10)
    search = make_tools(bm25)["search"]

    @tool(name="search")
    def slow_search(query: str) -> str:
        barrier.wait()  # returns only when all 4 calls are in flight at once
        return search.call(query=query)

    eng, _ = engine(tok, {"q3": needle_scripts(3)}, tools={"search": slow_search}, group_size=group, tool_workers=4)
    trajectories = scored_run(eng, [needle_task(3)])
    assert all(t.rounds[0].tool_ok for t in trajectories) and [t.score for t in trajectories] == [1.0] * group


def test_http_retriever_on_loopback(tok, bm25):
    with RetrieverServer(bm25) as server:
        retriever = HTTPRetriever(server.url, timeout=5, retries=0)
        eng, _ = engine(tok, {"q7": needle_scripts(7)}, retriever=retriever, group_size=2)
        trajectories = scored_run(eng, [needle_task(7)])
        retriever.close()
    assert [t.score for t in trajectories] == [1.0, 1.0]
    info = trajectories[0].rounds[0].information
    assert "needle-7" in tok.decode(trajectories[0].response_ids[info[0]:info[1]])


# ------------------------------------------------------------------------------------------------
# records
# ------------------------------------------------------------------------------------------------

def test_trajectories_round_trip_through_jsonl(tok, bm25, tmp_path):
    eng, _ = engine(tok, {"q3": needle_scripts(3, extra_search=True)}, retriever=bm25, group_size=2,
                    context_policy="memory")
    trajectories = scored_run(eng, [needle_task(3)])
    path = tmp_path / "t.jsonl"
    assert write_trajectories_jsonl(path, trajectories) == 2
    loaded = read_trajectories_jsonl(path)
    assert [t.to_dict() for t in loaded] == [t.to_dict() for t in trajectories]
    assert loaded[0].rounds[1].prompt_ids == trajectories[0].rounds[1].prompt_ids
    assert loaded[0].outcome["failed_rules"] == []
    bad = loaded[1].to_dict()
    bad["rounds"][1]["full_end"] += 1
    with pytest.raises(ValueError, match="full_end"):
        Trajectory.from_dict(bad)


def test_episode_objects_and_uids(tok, bm25):
    from mempo.env.data import Episode

    episode = Episode(id="ep", questions=["which doc mentions zebulon3?"], golds=[["Needle 3"]],
                      prompt="Which document mentions zebulon3?")
    eng, _ = engine(tok, {"ep": needle_scripts(3), "ep#1": needle_scripts(3, correct=False)}, retriever=bm25,
                    group_size=1)
    first, second = scored_run(eng, [episode, episode])
    assert (first.uid, second.uid) == ("ep", "ep#1") and first.episode_id == second.episode_id == "ep"
    assert (first.score, second.score) == (1.0, 0.0) and first.golds == [["Needle 3"]]


def test_config_validation(tok):
    with pytest.raises(ValueError):
        RolloutConfig(context_policy="partial")
    with pytest.raises(ValueError):
        RolloutConfig(max_turns=0)
    with pytest.raises(ValueError, match="max_context_tokens"):
        RolloutEngine(ScriptedBackend(round_script(tok, {}), tok), tok, {}, max_context_tokens=0)
    evaluation = eval_rollout_config(MempoConfig(), "memory")
    assert (evaluation.context_policy, evaluation.group_size, evaluation.max_turns) == ("memory", 1, 64)
    assert evaluation.max_response_tokens is None and evaluation.temperature == 0.0
    assert evaluation.max_new_tokens_per_round == MempoConfig().rollout.max_new_tokens_per_round


def test_import_mempo_rollout_stays_light():
    import subprocess
    import sys

    code = ("import sys, mempo.rollout, mempo.rollout.loop, mempo.rollout.backends, mempo.algo.contexts, "
            "mempo.algo.memory_reward, mempo.algo.advantages\n"
            "print(','.join(m for m in ('transformers', 'sglang') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_rollout_section_settings_reach_the_loop(tok, bm25):
    """The loop reads the ``rollout`` section itself: settings only it uses come from overrides."""
    from mempo.config import load_config

    cfg = load_config(None, ["rollout.system_prompt=Answer briefly.", "rollout.train_forced_prefix=false",
                             "rollout.group_size=1", "rollout.max_new_tokens_per_round=128", "rollout.tool_workers=1"])
    backend = ScriptedBackend(round_script(tok, {"q3": needle_scripts(3)}), tok)
    (t,) = scored_run(RolloutEngine(backend, tok, retriever=bm25, config=cfg.rollout), [needle_task(3)])
    assert "Answer briefly." in tok.decode(t.prompt_ids) and t.score == 1.0
    prefix = len(ChatFormat(tok).prefix_ids)
    assert all(t.response_mask[r.start:r.start + prefix] == [0] * prefix for r in t.rounds)
    (default,) = RolloutEngine(ScriptedBackend(round_script(tok, {"q3": needle_scripts(3)}), tok), tok,
                               retriever=bm25, config=RolloutConfig(group_size=1)).run([needle_task(3)])
    assert "Answer briefly." not in tok.decode(default.prompt_ids) and default.response_mask[:prefix] == [1] * prefix


# ------------------------------------------------------------------------------------------------
# a user's tools (tests/support/user_tools.py) in both action formats
# ------------------------------------------------------------------------------------------------

JSON_ROUNDS = [
    '</mem>\n<think>\nlook it up\n</think>\n<tool_call>\n{"name": "lookup", "arguments": {"key": "sky"}}\n</tool_call>'
    "\n<tool_response>the model may not write this</tool_response>",  # over-generated: cut at </tool_call>
    'sky is blue</mem>\n<think>\nand the grass\n</think>\n'
    '<tool_call>{"name": "lookup", "arguments": {"key": </tool_call>',
    "bad call</mem>\n<think>\nanother tool\n</think>\n"
    "<tool_call>{\"name\": \"weather\", \"arguments\": {}}</tool_call>",
    "sky is blue</mem>\n<think>\ndone\n</think>\n<answer>blue</answer>",
]


def test_json_tool_calls_reach_a_users_tools_and_every_bad_call_is_one_line(tok):
    user_tools.LOOKUPS.clear()
    tools = load_tools("support.user_tools:lookup") + load_tools("support.user_tools:calc_tools")
    config = RolloutConfig(action_format="json", group_size=1, max_turns=6, max_new_tokens_per_round=128,
                           outcome_reward="support.user_tools:overlap_reward")
    backend = ScriptedBackend(round_script(tok, {"c": JSON_ROUNDS}), tok, overgenerate=True)
    eng = RolloutEngine(backend, tok, tools, config=config)
    assert eng.tags == JSON_TAG_SET
    task = {"id": "c", "prompt": "What colour is the sky?", "golds": ["blue"], "topic": "colours"}
    (t,) = score_outcomes(eng.run([task]), reward=config.outcome_reward, tags=eng.tags)
    t.validate()
    assert user_tools.LOOKUPS == ["sky"] and [r.action for r in t.rounds] == ["tool_call"] * 3 + ["answer"]
    observations = [tok.decode(t.response_ids[r.information[0]:r.information[1]]) for r in t.rounds[:3]]
    assert observations[0] == "<tool_response>sky is blue</tool_response>"
    assert observations[1].startswith("<tool_response>Error: the tool call is not valid JSON")
    assert observations[2] == ("<tool_response>Error: no tool named 'weather'; the tools are: lookup, calc, "
                               "alookup</tool_response>")
    assert [r.tool_ok for r in t.rounds] == [True, False, False, None] and eng.stats.tool_errors == 2
    assert "the model may not write this" not in tok.decode(t.response_ids)  # cut after </tool_call>
    assert all(r.mem_span is not None for r in t.rounds[1:])  # the scanner found every <mem> under the json tags
    # the model was told the tools: the schemas are in the system prompt, the example reached the reward only
    prompt = tok.decode(backend.calls[0][0].prompt_ids)
    assert '<tools>\n{"type": "function", "function": {"name": "lookup"' in prompt and "<tool_call>" in prompt
    assert "colours" not in prompt and t.example["topic"] == "colours"
    assert t.outcome["format_ok"] and t.outcome["score"] == 1.0 and t.final_answer == "blue"


def test_json_calls_without_the_schemas_block_when_tool_schemas_is_off(tok):
    """rollout.tool_schemas=false (configs/ledger.yaml): the json format's calls work the same, and the system
    message is rollout.system_prompt alone, as rollout_system_prompt says for the teacher and the report."""
    from mempo.rollout.loop import rollout_system_prompt

    user_tools.LOOKUPS.clear()
    tools = load_tools("support.user_tools:lookup") + load_tools("support.user_tools:calc_tools")
    config = RolloutConfig(action_format="json", tool_schemas=False, system_prompt="Be brief.", group_size=1,
                           max_turns=6, max_new_tokens_per_round=128)
    backend = ScriptedBackend(round_script(tok, {"c": JSON_ROUNDS}), tok, overgenerate=True)
    eng = RolloutEngine(backend, tok, tools, config=config)
    (t,) = eng.run([{"id": "c", "prompt": "What colour is the sky?", "golds": ["blue"]}])
    assert user_tools.LOOKUPS == ["sky"] and [r.action for r in t.rounds] == ["tool_call"] * 3 + ["answer"]
    prompt = tok.decode(backend.calls[0][0].prompt_ids)
    assert "Be brief." in prompt and "<tools>" not in prompt and "# Tools" not in prompt
    assert eng.system_prompt == rollout_system_prompt(config, tools) == "Be brief."
    with_block = RolloutConfig(action_format="json", system_prompt="Be brief.")
    assert rollout_system_prompt(with_block, tools).startswith("Be brief.\n\n# Tools") \
        and "<tools>" in rollout_system_prompt(with_block, tools)
    assert rollout_system_prompt(RolloutConfig(system_prompt="Be brief."), tools) == "Be brief."  # tags: no block


def test_tags_format_calls_a_users_tool_by_its_tag(tok):
    user_tools.LOOKUPS.clear()
    scripts = {"c": ["</mem>\n<think>\nt\n</think>\n<lookup> grass </lookup>",
                     "grass is green</mem>\n<think>\nt\n</think>\n<answer>green</answer>"]}
    eng, backend = engine(tok, scripts, tools=[user_tools.lookup], group_size=1)
    assert eng.tags.names == ("mem", "think", "lookup", "answer", "information")
    (t,) = score_outcomes(eng.run([{"id": "c", "prompt": "Colour of grass?", "golds": ["green"]}]), tags=eng.tags)
    assert user_tools.LOOKUPS == ["grass"] and t.outcome["score"] == 1.0
    assert tok.decode(t.response_ids[t.rounds[0].information[0]:t.rounds[0].information[1]]) == \
        "<information>grass is green</information>"
    assert "<tools>" not in tok.decode(backend.calls[0][0].prompt_ids)  # the tags format's prompt is the user's
