"""mempo.config.schema: defaults, validation on construction, errors naming the field and what is allowed."""
import typing

import pytest

from mempo.algo.pooling import MEMORY_POOLINGS
from mempo.config import (ActorConfig, AlgorithmConfig, ConfigError, EvalConfig, MempoConfig, config_from_dict,
                          load_config)


def test_defaults_match_the_brief():
    cfg = MempoConfig()
    assert cfg.rollout.group_size == 16 and cfg.rollout.max_turns == 8
    assert cfg.scoring.threshold == 0.5 and cfg.algorithm.epsilon == 1e-6 and cfg.algorithm.norm_adv_by_std
    assert cfg.algorithm.skip_zero_variance_groups and cfg.algorithm.memory_weight == 1.0
    a = cfg.actor
    assert (a.lr, a.grad_clip, a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c) == (1e-6, 1.0, 0.2, 0.28, 3.0)
    assert (a.loss_agg_mode, a.kl_coef, a.kl_estimator, a.entropy_coef, a.ppo_epochs) == \
        ("token-mean", 0.001, "low_var_kl", 0.0, 1)
    assert cfg.eval.max_turns == 64 and cfg.eval.objectives[:2] == [2, 4]
    s = cfg.scoring  # the memory reward's definition: the paper's by default
    assert (s.comparator, s.scored_objectives, s.reward, s.log_clip, s.objective_reduce) == \
        ("paper", "all", "prob", 1.0, "mean")


@pytest.mark.parametrize("override, field, allowed", [
    ("actor.lr=fast", "actor.lr", "expected float"),
    ("actor.lr=0", "actor.lr", "must be > 0"),
    ("actor.lrr=1", "actor.lrr", "ActorConfig has:"),
    ("actors.lr=1", "actors", "MempoConfig has:"),
    ("rollout.group_size=0", "rollout.group_size", "must be > 0"),
    ("rollout.group_size=2.5", "rollout.group_size", "expected int"),
    ("rollout.context_policy=window", "rollout.context_policy", "'memory', 'full'"),
    ("rollout.backend=vllm", "rollout.backend", "'hf', 'sglang'"),
    ("scoring.method=fast", "scoring.method", "'packed', 'reference', 'cached'"),
    ("scoring.comparator=before", "scoring.comparator", "'paper', 'history_mem'"),
    ("scoring.scored_objectives=seen", "scoring.scored_objectives", "'all', 'retrieved', 'complete'"),
    ("scoring.reward=ratio", "scoring.reward", "'prob', 'log'"),
    ("scoring.log_clip=0", "scoring.log_clip", "must be > 0"),
    ("scoring.objective_reduce=max", "scoring.objective_reduce", "'mean', 'min'"),
    ("scoring.objective_reduce=min", "scoring.objective_reduce", "needs scored_objectives 'retrieved' or 'complete'"),
    ("scoring.answer_template=spaces", "scoring.answer_template", "'{answer}' exactly once"),
    ("scoring.answer_template=<search>{answer}</search>", "scoring.answer_template", "inside an <answer> block"),
    ("synthetic.oracle_lost_line=named", "synthetic.oracle_lost_line", "'bare', 'subject', 'value'"),
    ("synthetic.scoring_records_layout=blank", "synthetic.scoring_records_layout", "'question', 'later_round'"),
    ("synthetic.scoring_records_memories=full", "synthetic.scoring_records_memories", "'any', 'complete'"),
    ("actor.loss_agg_mode=mean", "actor.loss_agg_mode", "'token-mean'"),
    ("actor.kl_estimator=k4", "actor.kl_estimator", "'low_var_kl'"),
    ("actor.clip_ratio_low=-0.1", "actor.clip_ratio_low", "must be > 0"),
    ("actor.clip_ratio_c=0.9", "actor.clip_ratio_c", "must be > 1"),
    ("algorithm.norm_adv_by_std=maybe", "algorithm.norm_adv_by_std", "expected bool"),
    ("eval.objectives=[2, x]", "eval.objectives[1]", "expected int"),
    ("data.num_objectives=[]", "data.num_objectives", "non-empty list"),
    ("data.num_objectives=[2, 0]", "data.num_objectives", "must be > 0 (each)"),
    ("data.num_objectives=0", "data.num_objectives", "must be > 0"),
    ("data.num_objectives=2.5", "data.num_objectives", "expected int or a list of (int)"),
    ("data.num_objectives=[2, x]", "data.num_objectives", "expected int or a list of (int)"),
    ("eval.policies=[memory, window]", "eval.policies[1]", "'memory', 'full'"),
    ("trainer.keep_last=0", "trainer.keep_last", "must be > 0"),
    ("actor=1", "actor", "is a section"),
    ("actor.lr.x=1", "actor.lr", "is a field"),
    ("actor.lr", "actor.lr", "section.field=value"),
    ("rollout.sglang_url=http://127.0.0.1:30000", "rollout.sglang_url", "only used with backend 'sglang'"),
    ("rollout.sglang_mem_fraction=1.5", "rollout.sglang_mem_fraction", "must be in (0, 1)"),
    ("rollout.chat_template= ", "rollout.chat_template", "'auto', 'builtin' or the path"),
    # issue 47 C38, C42: a world of 10^7 entities (or of 1e7 distractors each) built without bound
    ("synthetic.world_entities=10000000", "synthetic.world_entities", "must be at most 1,000,000"),
    ("synthetic.world_documents=1000001", "synthetic.world_documents", "must be at most 1,000,000"),
    ("synthetic.world_distractor_ratio=1e7", "synthetic.world_distractor_ratio", "more than 1,000,000"),
    # issue 47 P08: builtin-tiny sizes torch cannot hold (or build in minutes)
    ("model.num_hidden_layers=100000", "model.num_hidden_layers", "must be at most 10,000"),
    ("model.vocab_size=100000000000000000", "model.vocab_size", "(hidden_size x vocab_size) in float32 would reach "
                                                                 "2^63 bytes"),
    ("rollout.action_format=xml", "rollout.action_format", "'tags', 'json'"),
    ("rollout.outcome_reward=exact", "rollout.outcome_reward",
     "must be one of ('em', 'f1', 'em_retrieved') or an import path"),
    ("rollout.outcome_reward=my.module", "rollout.outcome_reward", "'package.module:function'"),
    ("env.tools=[search, browse]", "env.tools[1]", "a built-in tool ('search', 'access') or an import path"),
    ("env.tools=[search, search]", "env.tools", "lists ['search'] more than once"),
    ("env.tool_timeout=0", "env.tool_timeout", "must be > 0"),
    ("env.tool_timeout=nan", "env.tool_timeout", "finite"),
    ("env.tool_result_chars=0", "env.tool_result_chars", "must be > 0"),
    ("data.gold_field=answer", "data.gold_field", "the synthetic world brings its own answers"),
    ("eval.split=train", "eval.split", "'test', 'validation'"),
    ("eval.split=validation", "eval.split", "validation_episodes is 0 (none are held out)"),
    ("eval.validation_episodes=-1", "eval.validation_episodes", "must be >= 0"),
])
def test_errors_name_the_field_and_what_is_allowed(override, field, allowed):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert info.value.field == field
    assert str(info.value).startswith(field + ":")
    assert allowed in str(info.value)


@pytest.mark.parametrize("overrides, field, allowed", [
    (["rollout.backend=sglang", "rollout.sglang_url=127.0.0.1:30000"], "rollout.sglang_url", "http(s) URL"),
    (["rollout.backend=sglang", "rollout.protocol_scaffold=true"], "rollout.protocol_scaffold", "needs backend 'hf'"),
    (["scoring.reward=log"], "scoring.threshold", "must be null with reward 'log'"),
    (["data.source=files", "data.gold_field=null"], "rollout.outcome_reward",
     "compares the answer with reference answers, and data.gold_field is null"),
    (["data.source=files", "data.gold_field=null", "rollout.outcome_reward=support.user_tools:answered_reward"],
     "algorithm.memory_weight", "must be 0 when data.gold_field is null"),
    (["data.source=files", "data.gold_field=null", "rollout.outcome_reward=support.user_tools:answered_reward",
      "algorithm.memory_weight=0", "algorithm.memory_pooling=group_seen"], "algorithm.memory_pooling", "group_seen"),
    (["env.tools=[search, 'support.user_tools:lookup']", "eval.closed_book=true"], "eval.closed_book",
     "a closed book is not defined"),
    (["data.source=files", "eval.validation_episodes=4", "eval.split=validation"], "eval.split",
     "a split of the synthetic world"),
    (["data.source=files", "eval.validation_episodes=4"], "eval.validation_episodes", "with data.source 'files'"),
])
def test_cross_field_errors_name_the_field(overrides, field, allowed):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert info.value.field == field and allowed in str(info.value)


def test_sglang_backend_without_url_is_a_valid_config():
    """sglang_url null means the in-process engine (whether sglang is installed is checked when the
    backend is built: mempo.rollout.backends.factory)."""
    cfg = load_config(None, ["rollout.backend=sglang"])
    assert cfg.rollout.backend == "sglang" and cfg.rollout.sglang_url is None


def test_sections_validate_on_construction():
    with pytest.raises(ConfigError, match="^lr: must be > 0"):
        ActorConfig(lr=-1.0)
    assert ActorConfig(lr="2e-6").lr == 2e-6
    with pytest.raises(ConfigError, match=r"^objectives\[0\]: must be >= 1"):
        EvalConfig(objectives=[0])
    assert config_from_dict({"actor": {"lr": 2}}).actor.lr == 2.0


def test_resume_defaults_to_never_and_determinism_to_auto():
    assert MempoConfig().trainer.resume == "never" and MempoConfig().trainer.deterministic is None
    assert config_from_dict({}, ["trainer.deterministic=false"]).trainer.deterministic is False
    with pytest.raises(ConfigError, match="synthetic.world_entities: must be >= 20"):
        config_from_dict({}, ["synthetic.world_entities=8"])


@pytest.mark.parametrize("impl", ["flash_attention_2", "flash_attention_3", "kernels-community/flash-attn"])
def test_flash_attention_refuses_fp32_weights(impl):
    """flash-attn has no fp32 kernels: fp32 weights with a flash implementation are refused, naming
    both fields, unless actor.param_dtype computes in half precision; half precision or SDPA in fp32
    are accepted."""
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"model.attn_implementation={impl}"])  # model.dtype defaults to float32
    assert info.value.field == "model.dtype"
    assert "attn_implementation" in str(info.value) and "bfloat16" in str(info.value)
    # fp32 master weights with half-precision compute (FSDP2 mixed precision under torchrun)
    assert load_config(None, [f"model.attn_implementation={impl}", "model.dtype=float32",
                              "actor.param_dtype=bfloat16"]).actor.param_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="^model.dtype:"):
        load_config(None, [f"model.attn_implementation={impl}", "model.dtype=float32", "actor.param_dtype=float32"])
    for dtype in ("bfloat16", "float16"):
        assert load_config(None, [f"model.attn_implementation={impl}", f"model.dtype={dtype}"]).model.dtype == dtype
    assert load_config(None, ["model.attn_implementation=sdpa", "model.dtype=float32"]).model.dtype == "float32"



def test_rollout_dtype_is_for_sglang_only():
    assert load_config(None, ["rollout.backend=sglang", "rollout.dtype=bfloat16"]).rollout.dtype == "bfloat16"
    with pytest.raises(ConfigError, match="^rollout.dtype: sets the SGLang engine's weight dtype"):
        load_config(None, ["rollout.dtype=bfloat16"])


def test_every_memory_reward_definition_builds():
    for overrides in (["scoring.comparator=history_mem"], ["scoring.scored_objectives=retrieved"],
                      ["scoring.reward=log", "scoring.threshold=null", "scoring.log_clip=2.5"],
                      ["scoring.scored_objectives=retrieved", "scoring.objective_reduce=min"],
                      ["scoring.scored_objectives=complete", "scoring.objective_reduce=min"]):
        load_config(None, overrides)
    assert load_config(None, ["scoring.reward=log", "scoring.threshold=null"]).scoring.log_clip == 1.0


def test_memory_pooling_and_std_floor():
    """Defaults are the paper's (one pool per group, no floor); the choices are `mempo.algo.pooling`'s."""
    a = MempoConfig().algorithm
    assert (a.memory_pooling, a.memory_std_floor) == ("group", 0.0)
    assert typing.get_args(typing.get_type_hints(AlgorithmConfig)["memory_pooling"]) == MEMORY_POOLINGS
    cfg = load_config(None, ["algorithm.memory_pooling=group_seen", "algorithm.memory_std_floor=0.05"])
    assert (cfg.algorithm.memory_pooling, cfg.algorithm.memory_std_floor) == ("group_seen", 0.05)
    for override, allowed in [("algorithm.memory_pooling=round", "'group', 'group_round', 'group_seen'"),
                              ("algorithm.memory_std_floor=-0.1", "must be >= 0"),
                              ("algorithm.memory_std_floor=nan", "finite"),
                              ("algorithm.memory_std_floor=1e39", "at most 3.4e38")]:
        with pytest.raises(ConfigError) as error:
            load_config(None, [override])
        assert "algorithm.memory_" in str(error.value) and allowed in str(error.value)


@pytest.mark.parametrize("text, value, counts", [
    ("2", 2, (2,)), ("[2, 4]", [2, 4], (2, 4)), ("2,4", [2, 4], (2, 4)), ("[3]", 3, (3,)),
])
def test_num_objectives_is_an_int_or_a_mixed_k_cycle(text, value, counts):
    data = load_config(None, [f"data.num_objectives={text}"]).data
    assert data.num_objectives == value and type(data.num_objectives) is type(value)  # a one-item list is its int
    assert data.objective_counts == counts


def test_tools_rewards_and_gold_fields_that_can_work():
    cfg = load_config(None, ["env.tools=[search, 'support.user_tools:calc_tools']", "rollout.action_format=json",
                             "rollout.outcome_reward=support.user_tools:overlap_reward", "env.tool_timeout=2.5"])
    assert cfg.env.tools == ["search", "support.user_tools:calc_tools"] and cfg.env.tool_timeout == 2.5
    assert load_config(None, ["env.tools=[]"]).env.tools == []
    free = load_config(None, ["data.source=files", "data.gold_field=null", "algorithm.memory_weight=0",
                              "rollout.outcome_reward=support.user_tools:answered_reward"])
    assert free.data.gold_field is None
    assert load_config(None, ["data.source=files", "data.gold_field=reward_model.ground_truth"]).data.gold_field \
        == "reward_model.ground_truth"


#: the three settings synthetic.task 'ledger' needs (configs/ledger.yaml holds them)
LEDGER = ["synthetic.task=ledger", "env.tools=[]", "rollout.action_format=json"]


def test_the_ledger_task_and_its_fields():
    cfg = load_config(None, LEDGER + ["synthetic.ledger_accounts=500", "synthetic.ledger_page_entries=3",
                                      "synthetic.ledger_amounts=[1,9]", "synthetic.world_prompt_style=bare"])
    s = cfg.synthetic
    assert (s.task, s.ledger_accounts, s.ledger_page_entries, s.ledger_amounts) == ("ledger", 500, 3, [1, 9])
    assert MempoConfig().synthetic.task == "search" and MempoConfig().synthetic.ledger_amounts == [1, 9]


@pytest.mark.parametrize("overrides, field, allowed", [
    (["synthetic.task=bank"], "synthetic.task", "'search', 'ledger'"),
    (["synthetic.task=ledger"], "env.tools", "must be [] with synthetic.task 'ledger'"),
    (["synthetic.task=ledger", "env.tools=[]"], "rollout.action_format", "must be 'json' with synthetic.task 'ledger'"),
    (LEDGER + ["data.source=files"], "synthetic.task", "set data.source synthetic"),
    (LEDGER + ["synthetic.ledger_accounts=39"], "synthetic.ledger_accounts", "must be in [40, 1,000,000]"),
    (LEDGER + ["synthetic.ledger_accounts=1000001"], "synthetic.ledger_accounts", "must be in [40, 1,000,000]"),
    (LEDGER + ["synthetic.ledger_page_entries=0"], "synthetic.ledger_page_entries", "must be >= 1"),
    (LEDGER + ["synthetic.ledger_amounts=[9,9]"], "synthetic.ledger_amounts", "1 <= least < most <= 1,000,000,000"),
    (LEDGER + ["synthetic.ledger_amounts=[0,9]"], "synthetic.ledger_amounts", "1 <= least < most"),
    (LEDGER + ["synthetic.ledger_amounts=[1,2,3]"], "synthetic.ledger_amounts", "[least, most]"),
    # a field only the other task reads, set anyway: it would change nothing
    (LEDGER + ["synthetic.world_entities=300"], "synthetic.world_entities", "describes the search task's world"),
    (LEDGER + ["synthetic.oracle_memory_style=listed"], "synthetic.oracle_memory_style", "task is 'ledger'"),
    (LEDGER + ["synthetic.scoring_sft_examples=8", "synthetic.oracle_objectives=[1]"], "synthetic.scoring_sft_examples",
     "leave it at its default (0)"),
    (["synthetic.ledger_accounts=300"], "synthetic.ledger_accounts", "describes the ledger task's world"),
    (["synthetic.ledger_amounts=[1,5]"], "synthetic.ledger_amounts", "task is 'search'"),
    (LEDGER + ["synthetic.world_prompt_style=compact"], "synthetic.world_prompt_style", "names the search tools"),
    (["rollout.tool_schemas=false"], "rollout.tool_schemas", "action_format is 'tags' (no schemas block)"),
])
def test_ledger_settings_that_cannot_work_name_their_field(overrides, field, allowed):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert info.value.field == field and allowed in str(info.value), str(info.value)
