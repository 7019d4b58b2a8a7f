"""Which verl trainers may consume a mempo loop's rows: the refusals by name (in the loop, before any
request, and in ``python -m mempo.integrations.verl --config``), on verl 0.9.1's own default config."""
import asyncio
import json
import re

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install .[verl])")
pytestmark = pytest.mark.verl

from omegaconf import OmegaConf, open_dict  # noqa: E402
from support.corpus import make_corpus  # noqa: E402
from support.rollout_fixtures import chat_tokenizer, tiny_qwen2  # noqa: E402
from support.verl_standin import HFServer, dummy_worker, question_batch, verl_config, write_agents_yaml  # noqa: E402

from mempo.config import ConfigError  # noqa: E402
from mempo.integrations.verl.__main__ import main  # noqa: E402
from mempo.integrations.verl.run_check import check_run_config, load_run_config  # noqa: E402
from mempo.integrations.verl.run_config import consumer_problem  # noqa: E402


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run_config")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d.to_json()) + "\n" for d in make_corpus(20)))
    return write_agents_yaml(tmp / "agents.yaml", corpus)


def _set(config, **dotted):
    with open_dict(config):
        for key, value in dotted.items():
            OmegaConf.update(config, key.replace("__", "."), value, force_add=True)
    return config


@pytest.mark.parametrize("settings, match", [
    ({}, r"^trainer\.v1\.trainer_mode=sync: that trainer does not read the memory reward .* set "
         r"trainer\.v1\.trainer_mode=mempo_sync$"),
    ({"trainer__v1__trainer_mode": "colocate_async"}, r"trainer_mode=colocate_async: an asynchronous trainer .* "
                                                      r"set trainer\.v1\.trainer_mode=mempo_sync$"),
    ({"trainer__v1__trainer_mode": "separate_async"}, r"trainer_mode=separate_async: an asynchronous trainer"),
    ({"trainer__use_v1": False}, r"algorithm\.adv_estimator=gae under trainer\.use_v1=false .* "
                                 r"trainer\.v1\.trainer_mode=mempo_sync, or algorithm\.adv_estimator=mempo$"),
    ({"trainer__v1__trainer_mode": "mempo_sync", "async_training": {"staleness_threshold": 1}},
     r"fully async trainer .* trainer\.v1\.trainer_mode=mempo_sync$"),
    ({"trainer__v1__trainer_mode": "mempo_sync", "rollout": {"nnodes": 1, "n_gpus_per_node": 8}},
     r"one-step-off-policy trainer"),
])
def test_trainers_that_do_not_read_the_memory_reward_are_named(settings, match):
    config = _set(load_run_config(), **settings)  # verl's defaults: trainer.v1.trainer_mode=sync
    problem = consumer_problem(config)
    assert problem is not None and "\n" not in problem
    assert re.search(match, problem), problem


def test_mempos_trainers_consume_the_rows():
    assert consumer_problem(load_run_config(overrides=["trainer.v1.trainer_mode=mempo_sync"])) is None
    assert consumer_problem(load_run_config(overrides=["trainer.use_v1=false", "algorithm.adv_estimator=mempo"])) \
        is None


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_the_loop_refuses_at_construction_before_any_request(agents, mode):
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tok = chat_tokenizer()
    config = verl_config(agents, prompt_length=128, response_length=256, n=2, trainer_mode=mode)
    server = HFServer(tiny_qwen2(len(tok)))
    worker = dummy_worker(config, tok, server)
    for name in ("mempo_agent", "mempo_agent_eval"):  # every mempo loop (hydra wraps what the constructor raises)
        with pytest.raises(InstantiationException) as caught:
            instantiate(_agent_loop_registry[name], trainer_config=DictConfigWrap(config), server_manager=server,
                        tokenizer=tok, processor=None, hf_model_type="qwen2", dataset_cls=RLHFDataset,
                        data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))
        assert isinstance(caught.value.__cause__, ConfigError)
        assert re.fullmatch(rf"trainer\.v1\.trainer_mode={mode}: .*mempo_sync", str(caught.value.__cause__))
    # through verl's own worker too: the batch fails, and no generation or scoring request was sent
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    with pytest.raises(InstantiationException, match=f"trainer_mode={mode}: .*mempo_sync"):
        asyncio.run(AgentLoopWorker.generate_sequences(worker, question_batch("q?", ["a"], 2)))
    assert server.requests == []


def test_check_command_checks_a_given_config(agents, tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text(f"actor_rollout_ref:\n  rollout:\n    agent:\n      agent_loop_config_path: {agents}\n"
                   "algorithm:\n  adv_estimator: grpo\n")
    assert main(["--config", str(run)]) == 2  # verl's default trainer mode
    out = capsys.readouterr().out
    assert "ERROR trainer.v1.trainer_mode=sync:" in out and "set trainer.v1.trainer_mode=mempo_sync" in out
    assert main(["--config", str(run), "trainer.v1.trainer_mode=mempo_sync", "+algorithm.mempo.memory_weight=0.5"]) == 0
    out = capsys.readouterr().out
    assert "run config: ok" in out and "ERROR" not in out
    # the agent-loop YAML's options and the estimator are checked as the loop and the trainer read them
    bad = tmp_path / "agents_bad.yaml"
    bad.write_text(agents.read_text().replace("max_turns: 4", "max_turns: 0", 1))
    assert main(["--config", str(run), "trainer.v1.trainer_mode=mempo_sync", "algorithm.adv_estimator=gae",
                 f"actor_rollout_ref.rollout.agent.agent_loop_config_path={bad}"]) == 2
    out = capsys.readouterr().out
    assert "ERROR algorithm.adv_estimator=gae: the mempo_sync trainer" in out
    assert "ERROR mempo_agent.rollout.max_turns" in out
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "ERROR --config: cannot read" in capsys.readouterr().out


def test_check_run_config_without_a_mempo_loop_says_so():
    problems = check_run_config(load_run_config(overrides=["trainer.v1.trainer_mode=mempo_sync",
                                                           "algorithm.adv_estimator=grpo"]))
    assert problems == ["actor_rollout_ref.rollout.agent.agent_loop_config_path: no mempo agent loop in it; give "
                        "mempo's agents.yaml (python -c \"import mempo.integrations.verl as m; print(m.AGENTS_YAML)\")"]


@pytest.mark.parametrize("overrides, why", [
    (["trainer.use_v1=false", "algorithm.adv_estimator=mempo"], "the legacy trainer"),
    (["trainer.v1.trainer_mode=mempo_sync", "algorithm.adv_estimator=grpo",
      "algorithm.rollout_correction.bypass_mode=true"], "bypass mode"),
])
def test_forced_ids_without_an_engine_log_prob_need_mempo_sync_outside_bypass(agents, overrides, why):
    """At temperature != 1 the forced ids are left out of rollout correction, which only mempo_sync does."""
    config = load_run_config(overrides=[*overrides, "actor_rollout_ref.rollout.temperature=0.7",
                                        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agents}"])
    problems = check_run_config(config)
    assert len(problems) == 1 and problems[0].startswith("mempo_agent.rollout.train_forced_prefix: trained forced "
                                                         "<mem> ids: at actor_rollout_ref.rollout.temperature=0.7")
    assert why in problems[0] and problems[0].endswith("or set rollout.train_forced_prefix: false")
    ok = load_run_config(overrides=[*overrides, f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agents}"])
    assert check_run_config(ok) == []  # at temperature 1 the engine gives their log-probs
    excluding = agents.parent / "agents_exclude.yaml"  # forced_logprobs: exclude needs mempo_sync outside bypass
    excluding.write_text(agents.read_text().replace("  scoring:", "  forced_logprobs: exclude\n  scoring:", 1))
    problems = check_run_config(load_run_config(overrides=[
        *overrides, f"actor_rollout_ref.rollout.agent.agent_loop_config_path={excluding}"]))
    assert len(problems) == 1 and "forced_logprobs: exclude gives them no rollout log-prob" in problems[0]
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    entry = OmegaConf.load(agents)[0]
    with pytest.raises(InstantiationException) as caught:  # the loop refuses it at start-up too
        instantiate(entry, trainer_config=DictConfigWrap(config), server_manager=None, tokenizer=chat_tokenizer(),
                    processor=None, hf_model_type="qwen2", dataset_cls=RLHFDataset,
                    data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))
    assert isinstance(caught.value.__cause__, ConfigError) and why in str(caught.value.__cause__)


@pytest.mark.parametrize("which", ["shipped", "example"])
def test_the_retriever_url_comes_from_each_nodes_environment(which, monkeypatch):
    """agents.yaml reads $MEMPO_RETRIEVER_URL where the loop is built (each node's agent-loop worker),
    else the node's own 127.0.0.1:8000."""
    from hydra.utils import instantiate
    from support.paths import REPO
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from mempo.integrations.verl import AGENTS_YAML

    path = AGENTS_YAML if which == "shipped" else REPO / "examples" / "verl" / "agents.yaml"
    config = verl_config(path, prompt_length=1024, response_length=6144, n=2)

    def loops():
        return [instantiate(entry, trainer_config=DictConfigWrap(config), server_manager=None,
                            tokenizer=chat_tokenizer(), processor=None, hf_model_type="qwen2", dataset_cls=RLHFDataset,
                            data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))
                for entry in OmegaConf.load(path)]

    monkeypatch.delenv("MEMPO_RETRIEVER_URL", raising=False)
    assert [loop.settings.env.retriever_url for loop in loops()] == ["http://127.0.0.1:8000"] * 2
    monkeypatch.setenv("MEMPO_RETRIEVER_URL", "http://10.0.0.7:8100")
    assert [loop.settings.env.retriever_url for loop in loops()] == ["http://10.0.0.7:8100"] * 2
    assert check_run_config(config) == []


def _tools_run(tmp_path, agents, tools_yaml=None, reward=("pkg://mempo.integrations.verl.reward",
                                                          "support.user_tools:overlap_reward")):
    """Overrides of a mempo_sync run whose loops take verl's tools and whose reward is a mempo reward."""
    from support.verl_user_tools import FUNCTION_TOOLS, tool_yaml

    tools_yaml = tools_yaml or tool_yaml(tmp_path / "tools.yaml", ["touch", "colour"])
    overrides = ["trainer.v1.trainer_mode=mempo_sync", "algorithm.adv_estimator=grpo",
                 f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agents}",
                 f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools_yaml}",
                 f"actor_rollout_ref.rollout.multi_turn.function_tool_path={FUNCTION_TOOLS}"]
    if reward is not None:
        overrides += [f"reward.custom_reward_function.path={reward[0]}",
                      "reward.custom_reward_function.name=outcome_reward_score"]
        if reward[1] is not None:
            overrides.append(f"+reward.custom_reward_function.reward_kwargs.outcome_reward={reward[1]}")
    return overrides


def _tool_agents(path, rollout="action_format: json", tools="['support.user_tools:lookup']"):
    return write_agents_yaml(path, None, rollout=rollout, env=f"{{tools: {tools}, tool_timeout: 5}}")


def test_check_command_checks_the_action_format_the_tools_and_the_reward(tmp_path, capsys):
    import mempo.integrations.verl.reward as reward_module

    good = _tool_agents(tmp_path / "agents.yaml")
    assert main(_tools_run(tmp_path, good)) == 0
    assert "run config: ok" in capsys.readouterr().out
    # mempo's reward module named by file path is the same adapter
    assert main(_tools_run(tmp_path, good, reward=(reward_module.__file__, "support.user_tools:overlap_reward"))) == 0
    capsys.readouterr()
    cases = [
        (_tools_run(tmp_path, _tool_agents(tmp_path / "a1.yaml", rollout="action_format: xml")),
         r"ERROR mempo_agent\.rollout\.action_format: must be one of 'tags', 'json'"),
        (_tools_run(tmp_path, _tool_agents(tmp_path / "a2.yaml", tools="['support.user_tools:nothing']")),
         r"ERROR mempo_agent\.env\.tools\[0\]: 'support\.user_tools:nothing': 'support\.user_tools' has no attribute"),
        (_tools_run(tmp_path, _tool_agents(tmp_path / "a3.yaml", tools="[lookup]")),
         r"ERROR mempo_agent\.env\.tools\[0\]: must be a built-in tool"),
        (_tools_run(tmp_path, good, tools_yaml=tmp_path / "missing.yaml"),
         r"ERROR actor_rollout_ref\.rollout\.multi_turn\.tool_config_path: cannot load the verl tools of "
         r".*missing\.yaml \(FileNotFoundError"),
        (_tools_run(tmp_path, _tool_agents(tmp_path / "a4.yaml", tools="['support.user_tools:calc_tools']")),
         None),  # a factory of several tools
        (_tools_run(tmp_path, good, reward=("pkg://mempo.integrations.verl.reward", None)),
         r"ERROR reward\.custom_reward_function\.reward_kwargs\.outcome_reward: must name the reward "
         r"outcome_reward_score calls"),
        (_tools_run(tmp_path, good, reward=("pkg://mempo.integrations.verl.reward", "my_missing_module:reward")),
         r"ERROR reward\.custom_reward_function\.reward_kwargs\.outcome_reward: 'my_missing_module:reward': cannot "
         r"import 'my_missing_module'"),
    ]
    for overrides, match in cases:
        code = main(overrides)
        out = capsys.readouterr().out
        if match is None:
            assert code == 0 and "run config: ok" in out, out
        else:
            assert code == 2 and re.search(match, out), out
    # a verl tool of the same name as one of env.tools: said once, though both entries have it
    from support.verl_user_tools import TOOLS

    clash = tmp_path / "clash.yaml"
    schema = dict(TOOLS["colour"][2], function=dict(TOOLS["colour"][2]["function"], name="lookup"))
    clash.write_text(json.dumps({"tools": [{"class_name": TOOLS["colour"][0], "config": TOOLS["colour"][1],
                                            "tool_schema": schema}]}))
    both = _tool_agents(tmp_path / "both.yaml")
    both.write_text(both.read_text().replace("MemPOEvalAgentLoop\n  rollout: {", "MemPOEvalAgentLoop\n  rollout: {"
                                                                                  "action_format: json, "))
    assert main(_tools_run(tmp_path, both, tools_yaml=clash)) == 2
    out = capsys.readouterr().out
    assert out.count("ERROR") == 2, out  # mempo_agent's and mempo_agent_eval's, each named
    assert "ERROR mempo_agent.env.tools: tool(s) ['lookup'] are both in env.tools and among verl's tools" in out
    assert "ERROR mempo_agent_eval.env.tools: tool(s) ['lookup']" in out


def test_the_loop_refuses_a_bad_reward_setting_and_bad_tools_before_any_request(tmp_path):
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.tools.tool_registry import load_all_tools
    from verl.utils.dataset.rl_dataset import RLHFDataset

    agents = _tool_agents(tmp_path / "agents.yaml")

    def build(overrides, verl_tools=()):
        config = load_run_config(overrides=overrides)
        with open_dict(config):
            config.actor_rollout_ref.rollout.name = "vllm"
        return instantiate(OmegaConf.load(agents)[0], trainer_config=DictConfigWrap(config), server_manager=None,
                           tokenizer=chat_tokenizer(), processor=None, hf_model_type="qwen2", dataset_cls=RLHFDataset,
                           data_config=DictConfigWrap(config.data), tools=ToolListWrap(list(verl_tools)))

    overrides = _tools_run(tmp_path, agents)
    config = load_run_config(overrides=overrides)
    multi_turn = config.actor_rollout_ref.rollout.multi_turn
    verl_tools = load_all_tools(multi_turn.tool_config_path, multi_turn.function_tool_path)
    loop = build(overrides, verl_tools)
    assert [t.name for t in loop.verl_tools] == ["touch", "colour", "shout"]
    with pytest.raises(InstantiationException) as caught:
        build(_tools_run(tmp_path, agents, reward=("pkg://mempo.integrations.verl.reward", None)), verl_tools)
    assert isinstance(caught.value.__cause__, ConfigError)
    assert str(caught.value.__cause__).startswith("reward.custom_reward_function.reward_kwargs.outcome_reward: must")
    from support.verl_user_tools import ColourBook, TOOLS
    from verl.tools.schemas import OpenAIFunctionToolSchema

    schema = dict(TOOLS["colour"][2], function=dict(TOOLS["colour"][2]["function"], name="lookup"))
    twin = ColourBook({"type": "native", "table": {}}, OpenAIFunctionToolSchema.model_validate(schema))
    with pytest.raises(InstantiationException) as caught:
        build(overrides, [twin])
    assert str(caught.value.__cause__).startswith("mempo_agent.env.tools: tool(s) ['lookup'] are both in env.tools")
