"""mempo.apps.tasks: the search task is the demo as it was; the ledger task builds its world and tools
from the config, evaluates on the test split, keeps training and the cold start to the train split, and
offers a validation split disjoint by account from both."""

import re

import pytest

from mempo.apps.demo import load_demo_config, rl_episodes
from mempo.config import ConfigError
from mempo.env.build import build_tools
from mempo.eval import eval_episodes, held_out_of_training
from mempo.synthetic.build import build_world, synthetic_world
from mempo.synthetic.cold_start import oracle_cold_start
from mempo.synthetic.heldout import held_out_subjects
from mempo.apps.tasks import TASKS, LedgerTask, SearchTask, synthetic_task
from support.demo_smoke import LEDGER_SMOKE, SMOKE
from support.paths import REPO

LEDGER = REPO / "configs" / "ledger.yaml"


LEDGER_SMALL = ["synthetic.oracle_episodes=16", "eval.episodes=32"]


@pytest.fixture(scope="module")
def ledger_cfg():
    return load_demo_config(LEDGER, LEDGER_SMALL)


@pytest.fixture(scope="module")
def ledger_env(ledger_cfg):
    return synthetic_task(ledger_cfg).build(ledger_cfg)


def accounts_asked(episodes, names):
    return {w for e in episodes for q in e.questions for w in re.findall(r"[A-Za-z]+", q)} & names


def test_the_search_task_is_the_demo_as_it_was():
    cfg = load_demo_config(None, SMOKE)
    task = synthetic_task(cfg)
    assert isinstance(task, SearchTask) and TASKS["search"] is task
    env = task.build(cfg)
    world, retriever = build_world(cfg)
    assert [d.text for d in env.world.documents()] == [d.text for d in world.documents()]
    assert env.tools.names == build_tools(cfg, retriever).names == ("search", "access")
    assert env.closed_book_tools is not None and env.closed_book_tools.names == ("search", "access")
    episodes = task.eval_episodes(env.world, cfg)
    assert {k: [e.to_json() for e in v] for k, v in episodes.items()} == \
        {k: [e.to_json() for e in v] for k, v in eval_episodes(world, cfg).items()}
    held = task.held_out(env.world, cfg)
    assert held == held_out_subjects(episodes) == held_out_of_training(world, cfg)
    cold = task.cold_start(cfg, env, held)
    assert [t.to_json() for t in cold.trajectories] == \
        [t.to_json() for t in oracle_cold_start(world, build_tools(cfg, retriever), cfg, held).trajectories]


def test_the_ledger_task_builds_its_world_and_tools_from_the_config(ledger_cfg, ledger_env):
    ledger = ledger_env.world
    s = ledger_cfg.synthetic
    assert len(ledger.entities) == s.ledger_accounts and ledger.params["page_entries"] == s.ledger_page_entries
    assert min(ledger.amounts) >= s.ledger_amounts[0] and max(ledger.amounts) <= s.ledger_amounts[1]
    assert ledger.params["prompt_style"] == "bare"
    assert ledger_env.tools.names == ("lookup", "calc") and ledger_env.tools.tools["lookup"].ledger is ledger
    assert ledger_env.closed_book_tools.tools["lookup"].ledger is None  # the closed book: lookups find nothing
    assert ledger_env.tools.timeout == ledger_cfg.env.tool_timeout
    assert ledger_env.tools.max_chars == ledger_cfg.env.tool_result_chars
    other = load_demo_config(LEDGER, ["synthetic.ledger_accounts=300", "synthetic.ledger_page_entries=6",
                                      "synthetic.ledger_amounts=[100,200]", "synthetic.world_seed=4",
                                      "eval.closed_book=false"])
    env = synthetic_task(other).build(other)
    assert len(env.world.entities) == 300 and all(len(p) == 6 for p in list(env.world.pages.values())[:-1])
    assert min(env.world.amounts) >= 100 and env.world.seed == 4 and env.closed_book_tools is None


def test_ledger_evaluation_validation_and_training_never_share_an_account(ledger_cfg, ledger_env):
    task, ledger = LedgerTask(), ledger_env.world
    names = {e.name for e in ledger.entities}
    test = task.eval_episodes(ledger, ledger_cfg)
    validation_cfg = load_demo_config(LEDGER, LEDGER_SMALL + ["eval.split=validation",
                                                              f"eval.validation_episodes={ledger_cfg.eval.episodes}"])
    validation = task.eval_episodes(ledger, validation_cfg)
    assert sorted(test) == sorted(validation) == ledger_cfg.eval.objectives
    assert all(len(v) == ledger_cfg.eval.episodes for v in test.values())
    test_names = accounts_asked([e for v in test.values() for e in v], names)
    validation_names = accounts_asked([e for v in validation.values() for e in v], names)
    assert test_names and validation_names and not test_names & validation_names
    held = task.held_out(ledger, ledger_cfg)
    assert task.held_out(ledger, validation_cfg) == held  # whichever split is evaluated
    assert test_names | validation_names <= held and len(held) == 300
    cold = task.cold_start(ledger_cfg, ledger_env, held)
    rl = rl_episodes(ledger_cfg, ledger, held, 5)
    assert len(rl) == 5 * ledger_cfg.data.questions_per_step
    assert [len(e.metadata["records"][0]["accounts"]) for e in rl[:4]] == [2, 4, 2, 4]  # data.num_objectives in turn
    # renamed to train accounts, and asking about train accounts
    for questions in ([t.prompt for t in cold.trajectories], [q for e in rl for q in e.questions]):
        assert questions and not accounts_asked([type("E", (), {"questions": questions})()], held)
    # the same draw without the exclusion asks about held-out accounts: the check can fail
    assert accounts_asked(ledger.episodes(2, 64, 0, split="test"), held)
    # oracle_rename_pool=all: renamed to any account, held-out ones too; the questions drawn stay the train split's
    every = task.cold_start(load_demo_config(LEDGER, LEDGER_SMALL + ["synthetic.oracle_rename_pool=all"]), ledger_env,
                            held)
    assert accounts_asked([type("E", (), {"questions": [t.prompt for t in every.trajectories]})()], held)
    assert every.ran == cold.ran and every.held_out == cold.held_out


def test_the_ledger_cold_start_follows_the_oracle_fields(ledger_cfg, ledger_env):
    task = LedgerTask()
    held = task.held_out(ledger_env.world, ledger_cfg)
    cold = task.cold_start(ledger_cfg, ledger_env, held)
    assert cold.ran == 16 * 4 and len(cold.trajectories) == 64 and len(cold.copy_records) == 2048
    assert cold.held_out == 300 and not cold.scoring_records
    from mempo.rollout.loop import rollout_system_prompt

    system = rollout_system_prompt(ledger_cfg.rollout, ledger_env.tools)  # the agent loop's: "" without the schemas
    assert system == "" and not ledger_cfg.rollout.tool_schemas
    assert all(t.system_prompt == system and t.rounds[0].messages[0]["content"] == system for t in cold.trajectories)
    schemas = load_demo_config(LEDGER, ["synthetic.oracle_episodes=2", "rollout.tool_schemas=true"])
    assert all(t.system_prompt == ledger_env.tools.system_prompt("") and "<tools>" in t.system_prompt
               for t in task.cold_start(schemas, ledger_env, held).trajectories)
    assert any(" done\n" in r.assistant for t in cold.trajectories for r in t.rounds)  # the teacher drops amounts
    correct = load_demo_config(LEDGER, ["synthetic.oracle_episodes=16", "synthetic.oracle_keep=correct",
                                        "synthetic.oracle_rename=false", "synthetic.oracle_think=short"])
    kept = task.cold_start(correct, ledger_env, held)
    assert 0 < len(kept.trajectories) < kept.ran and all(t.score["em"] == 1.0 for t in kept.trajectories)
    assert "\n<think>\nLook up " in kept.trajectories[0].rounds[0].assistant  # oracle_think=short


def test_the_other_commands_refuse_the_ledger_and_a_ledger_too_small_names_its_field(ledger_cfg):
    with pytest.raises(ConfigError, match=r"^synthetic\.task: 'ledger' runs in `mempo demo` only"):
        synthetic_world(ledger_cfg)
    from mempo.eval.episodes import prompt_style  # how `mempo ask` / `serve` lay out a question: the ledger's

    assert prompt_style(ledger_cfg) == "bare"
    assert prompt_style(load_demo_config(LEDGER, ["synthetic.world_prompt_style=null"])) == "tools"
    two_pages = load_demo_config(LEDGER, LEDGER_SMOKE + ["synthetic.ledger_page_entries=20"])
    ledger = synthetic_task(two_pages).build(two_pages).world
    with pytest.raises(ConfigError, match=r"^synthetic\.ledger_accounts: 2 test episodes of 4 accounts: .* fewer than "
                                          r"the 4 pages"):
        LedgerTask().eval_episodes(ledger, two_pages)
