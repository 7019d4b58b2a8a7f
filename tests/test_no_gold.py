"""No rollout is ever told a gold answer: a tiny training run (with the opt-in protocol scaffold, the
one logits processor the package has), an evaluation, a tiny demo run and the signal benchmark's
rollouts (bench/bench_signal.py), with generation instrumented (tests/support/gold_trace.py): no
request's prompt holds a gold string outside the tool results and the model's own turns, and no
logits processor's state holds a gold string or its token ids unless the agent read it in that same
generate call.

The first test checks the checker itself on the pattern the old scaffold had (a processor told
the golds: ``set_answers``), so the clean results below cannot come from a checker that sees nothing.
"""

import pytest
import torch

from support.gold_trace import install, processor_state, summary, violations
from mempo.config import load_config
from support.paths import REPO, load_script

TINY = REPO / "configs" / "tiny.yaml"
FAST = ["data.questions_per_step=2", "rollout.group_size=2", "trainer.tensorboard=false", "trainer.progress=false",
        "trainer.resume=never", "trainer.save_every=0", "trainer.total_steps=1", "rollout.max_new_tokens_per_round=48"]


@pytest.fixture
def trace():
    records: list[dict] = []
    uninstall = install(records.append)
    yield records
    uninstall()


@pytest.fixture(scope="module")
def tok():
    from mempo.model.builtin import default_corpus_texts, train_tokenizer
    from mempo.synthetic.world import World

    return train_tokenizer(default_corpus_texts(World.generate(seed=0, num_entities=25)), vocab_size=768)


def _chat(tok, system, user, tool=None):
    text = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
    if tool is not None:
        text += (f"<|im_start|>assistant\n<mem> m </mem><think>t</think><search>q</search><|im_end|>\n"
                 f"<|im_start|>user\n{tool}<|im_end|>\n")
    return tok.encode(text + "<|im_start|>assistant\n<mem>", add_special_tokens=False)


def test_the_checker_catches_a_gold_told_to_a_processor_or_a_prompt(tok):
    class GoldTellingProcessor:  # what the old scaffold held after set_answers({task_id: gold})
        def __init__(self):
            self.answers = {"ep-0": "Wehel"}
            self.plans = {(2, "Wehel"): [("choice", [tok.encode("Wehel", add_special_tokens=False), [5]])]}

    strings, int_lists = processor_state([GoldTellingProcessor()])
    task = {"kind": "task", "question": "In which city is the university?", "golds": ["Wehel"]}
    call = {"kind": "generate", "prompts": [_chat(tok, "s", "In which city is the university?")],
            "strings": strings, "int_lists": int_lists}
    found = violations([task, call], tok)
    assert any("strings" in v for v in found) and any("token ids" in v for v in found)
    only_ids = dict(call, strings=[])
    assert any("token ids" in v for v in violations([task, only_ids], tok))
    # the same state is fine once the agent has read the gold in a tool result of that call
    read = dict(call, prompts=[_chat(tok, "s", "In which city is the university?", "<information>Wehel</information>")])
    assert violations([task, read], tok) == []
    read_json = dict(call, prompts=[_chat(tok, "s", "In which city is the university?",
                                          "<tool_response>Wehel</tool_response>")])  # the json format's tool result
    assert violations([task, read_json], tok) == []
    # a hint in the system prompt is caught whatever the processors hold
    hinted = {"kind": "generate", "prompts": [_chat(tok, "the answer is wehel", "In which city?")],
              "strings": [], "int_lists": []}
    assert any("prompt outside" in v for v in violations([task, hinted], tok))


#: every non-default memory-reward option at once (ALGORITHM.md section 4): the per-objective answer,
#: the retrieved-objective gate and the in-distribution comparator all read the golds, for scoring only
REWARD_DEFINITION = ["scoring.comparator=history_mem", "scoring.reward=log",
                     "scoring.threshold=null", "scoring.log_clip=10", "scoring.objective_reduce=min"]


@pytest.mark.parametrize("gate", ["retrieved", "complete"])  # the two knowability gates of scored_objectives
def test_training_under_every_memory_reward_option_never_shows_a_gold(tmp_path, trace, gate):
    from mempo.train.trainer import train

    torch.set_num_threads(1)
    cfg = load_config(TINY, FAST + REWARD_DEFINITION + [f"scoring.scored_objectives={gate}",
                                                        f"trainer.out_dir={tmp_path / 'rl'}"])
    result = train(cfg)
    counts = summary(trace)
    assert counts["tasks"] == 2 and counts["generate_calls"] >= 2, counts
    assert violations(trace, result.tokenizer) == []
    step = result.metrics[-1]  # the memory-reward stage ran with these options
    assert "memory/unscored_rounds" in step and "memory/scored_rounds" in step


#: a user's tools and outcome reward (tests/support/user_tools.py) in the json action format: the reward reads the
#: golds from each trajectory's example, after the rollout
USER_TASK = ["rollout.action_format=json", "env.tools=['support.user_tools:lookup', search]",
             "rollout.outcome_reward=support.user_tools:overlap_reward"]


def test_training_and_evaluation_with_a_users_tools_and_reward_never_show_a_gold(tmp_path, trace):
    """The json format's tool schemas in the system prompt, the user's tool results and the examples the
    user's reward reads: no generation request (training through the scaffold, then evaluation) holds a gold."""
    from mempo.eval import eval_episodes, evaluate
    from mempo.synthetic.build import build_world
    from mempo.train.trainer import train
    from support import user_tools

    torch.set_num_threads(1)
    user_tools.LOOKUPS.clear()
    user_tools.REWARD_CALLS.clear()
    # a JSON call is longer than a <search>: rounds of 96 tokens hold the scaffold's whole turn
    cfg = load_config(TINY, FAST + USER_TASK + ["rollout.max_new_tokens_per_round=96",
                                                f"trainer.out_dir={tmp_path / 'rl'}"])
    result = train(cfg)
    counts = summary(trace)
    assert counts["tasks"] == 2 and counts["generate_calls"] >= 2 and counts["processor_int_lists"] > 0, counts
    assert user_tools.LOOKUPS and all(example["golds"] for _, example in user_tools.REWARD_CALLS)
    assert violations(trace, result.tokenizer) == []
    trace.clear()

    eval_cfg = load_config(TINY, USER_TASK + ["eval.objectives=[2]", "eval.episodes=2", "eval.max_turns=3",
                                              "rollout.max_new_tokens_per_round=48"])
    world, retriever = build_world(eval_cfg)
    evaluate(result.model, result.tokenizer, eval_episodes(world, eval_cfg), retriever, eval_cfg, show_progress=False)
    assert summary(trace)["tasks"] == 2 and summary(trace)["generate_calls"] > 0
    assert violations(trace, result.tokenizer) == []


def test_train_eval_and_demo_never_show_a_gold(tmp_path, trace):
    from mempo.synthetic.build import build_world
    from mempo.eval import eval_episodes, evaluate
    from mempo.train.trainer import train

    torch.set_num_threads(1)
    # 1. training, through the protocol scaffold (tags forced, answer chosen among context strings)
    cfg = load_config(TINY, FAST + [f"trainer.out_dir={tmp_path / 'rl'}"])
    assert cfg.rollout.protocol_scaffold
    result = train(cfg)
    counts = summary(trace)
    assert counts["tasks"] == 2 and counts["generate_calls"] >= 2 and counts["processor_int_lists"] > 0, counts
    assert violations(trace, result.tokenizer) == []
    trace.clear()

    # 2. evaluation of the trained policy (both context policies, each also closed-book)
    eval_cfg = load_config(TINY, ["eval.objectives=[2]", "eval.episodes=2", "eval.max_turns=3",
                                  "eval.policies=[memory,full]", "eval.closed_book=true",
                                  "rollout.max_new_tokens_per_round=48"])
    world, retriever = build_world(eval_cfg)
    evaluate(result.model, result.tokenizer, eval_episodes(world, eval_cfg), retriever, eval_cfg, show_progress=False)
    assert summary(trace)["tasks"] == 8 and summary(trace)["generate_calls"] > 0
    assert violations(trace, result.tokenizer) == []
    trace.clear()

    # 3. a tiny demo: SFT, evaluation before and after (with the closed-book pass of configs/demo.yaml), RL
    from support.demo_smoke import SMOKE
    from transformers import AutoTokenizer

    from mempo.apps.demo import load_demo_config, run_demo

    demo_cfg = load_demo_config(None, SMOKE)
    out = tmp_path / "demo"
    run_demo(demo_cfg, out, echo=lambda line: None, show_progress=False)
    counts = summary(trace)
    assert counts["tasks"] > 0 and counts["generate_calls"] > 0, counts
    assert violations(trace, AutoTokenizer.from_pretrained(out / "model_sft")) == []
    trace.clear()

    # 4. the signal benchmark's rollouts from the demo's SFT model (bench/bench_signal.py), plain and
    #    through the protocol scaffold (rollout.protocol_scaffold, as training builds it)
    bench_signal = load_script("bench/bench_signal.py")
    for name, extra in (("plain", []), ("scaffold", ["rollout.protocol_scaffold=true"])):
        bench_signal.run(out, tmp_path / f"signal_{name}", questions=1, samples=2, ks=[2],
                         definitions=["paper"], overrides=extra, log=lambda line: None)
    counts = summary(trace)
    assert counts["tasks"] == 2 and counts["generate_calls"] > 0 and counts["processor_int_lists"] > 0, counts
    assert violations(trace, AutoTokenizer.from_pretrained(out / "model_sft")) == []


def test_the_ledger_demo_never_shows_a_gold(tmp_path, trace):
    """configs/ledger.yaml's pipeline (its teacher's cold start, SFT, evaluation with the closed-book pass, RL with
    the memory reward, its lookup and calc tools as JSON tool calls): no generation request holds a gold (a sum, a
    difference) outside the tool results and the model's own turns."""
    from transformers import AutoTokenizer

    from mempo.apps.demo import load_demo_config, run_demo
    from support.demo_smoke import LEDGER_SMOKE

    torch.set_num_threads(1)
    cfg = load_demo_config(REPO / "configs" / "ledger.yaml", LEDGER_SMOKE + ["rollout.max_new_tokens_per_round=48"])
    out = tmp_path / "ledger"
    run_demo(cfg, out, echo=lambda line: None, show_progress=False)
    counts = summary(trace)
    assert counts["tasks"] > 0 and counts["generate_calls"] > 0, counts
    assert any(g.isdigit() for r in trace if r["kind"] == "task" for g in r["golds"])  # numbers among the golds
    assert violations(trace, AutoTokenizer.from_pretrained(out / "model_sft")) == []


def test_the_served_agent_never_shows_a_gold(trace, tok):
    """`mempo serve`'s generation (the agent service behind the OpenAI app, HF backend): the requests
    carry questions only; the prompts of every generate call hold no gold of the episodes asked."""
    import openai

    from mempo.eval import eval_episodes
    from mempo.model.builtin import tiny_model
    from mempo.protocol.reward import objectives_from_golds
    from mempo.rollout.backends.factory import hf_backend
    from mempo.serve.agent import AgentService
    from mempo.serve.openai_api import AgentServer
    from mempo.synthetic.build import build_world

    torch.set_num_threads(1)
    cfg = load_config(TINY, ["eval.objectives=[2]", "eval.episodes=3", "eval.max_turns=2",
                             "rollout.max_new_tokens_per_round=24"])
    world, retriever = build_world(cfg)
    model = tiny_model(tok, seed=0)
    service = AgentService.from_config(cfg, model, tok, retriever, hf_backend(model, tok))
    episodes = eval_episodes(world, cfg)[2]
    with AgentServer(service, model_id="tiny") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        for episode in episodes:
            golds = [alias for aliases in objectives_from_golds(episode.golds) for alias in aliases]
            trace.append({"kind": "task", "question": episode.prompt, "golds": golds})
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": episode.prompt}])
    service.close()
    counts = summary(trace)
    assert counts["tasks"] == 3 and counts["generate_calls"] >= 3, counts
    assert violations(trace, tok) == []


def test_verl_agent_loop_generation_requests_never_show_a_gold(tmp_path):
    """The verl integration's rollout path (mempo_agent inside verl's own AgentLoopWorker, against an
    HF stand-in server): its generation requests hold no gold outside what the agent read; only its
    scoring requests (prompt_logprobs) carry the gold answer."""
    pytest.importorskip("verl", reason="verl is not installed (pip install .[verl])")
    import json

    from support.corpus import make_corpus
    from support.rollout_fixtures import chat_tokenizer, tiny_qwen2
    from support.verl_standin import (HFServer, dummy_worker, needle_script, question_batch, run_worker,
                                      verl_config, write_agents_yaml)

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d.to_json()) + "\n" for d in make_corpus(40)))
    tok = chat_tokenizer()
    server = HFServer(tiny_qwen2(len(tok)), script=needle_script(tok))
    config = verl_config(write_agents_yaml(tmp_path / "agents.yaml", corpus), prompt_length=128,
                         response_length=384, n=2)
    question = "Which document mentions zebulon5? Give its title."
    run_worker(dummy_worker(config, tok, server), question_batch(question, ["Needle 5"], 2))
    generation = [r for r in server.requests if "prompt_logprobs" not in r["sampling_params"]]
    scoring = [r for r in server.requests if "prompt_logprobs" in r["sampling_params"]]
    assert generation and scoring
    records = [{"kind": "task", "question": question, "golds": ["Needle 5"]}]
    records += [{"kind": "generate", "prompts": [r["prompt_ids"]], "strings": [], "int_lists": []} for r in generation]
    assert violations(records, tok) == []
    # the check sees a gold placed where only scoring puts it (the answer template after the context)
    leaked = dict(records[1], prompts=[scoring[0]["prompt_ids"][:-3] + tok.encode(
        "<|im_end|>\n<|im_start|>user\nthe answer is Needle 5<|im_end|>\n", add_special_tokens=False)])
    assert violations(records[:1] + [leaked], tok)
