"""mempo's EM as a verl reward function, and verl's default reward function for mempo rows (the rows a
mempo loop scored end to end through verl's reward loop: test_agent_loop.py)."""
import numpy as np
import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install .[verl])")
pytestmark = pytest.mark.verl

from support.rollout_fixtures import needle_scripts  # noqa: E402
from verl.utils import reward_score  # noqa: E402

from mempo.integrations.verl import reward  # noqa: E402
from mempo.protocol.reward import compute_score as mempo_score  # noqa: E402

ROUNDS = needle_scripts(3)  # an oracle-like agent: one search, then the right answer
TEXT = f"<mem>{ROUNDS[0]}\n<information>Doc 1 (Title: Needle 3) zebulon3</information>\n<mem>{ROUNDS[1]}"


def test_scores_the_loops_protocol_text_as_mempo_does():
    golds = ["Needle 3", "needle three"]
    want = mempo_score(TEXT, golds)
    assert want["score"] == 1.0  # a real right answer, not a comparison of zeros
    info = {"mempo_protocol_text": TEXT, "mempo_score_mode": "mean"}
    got = reward.compute_score("nq", "decoded text the loop did not score", golds, info)
    assert got == {"score": 1.0, "acc": 1.0, "mempo_em": want["em"], "mempo_f1": want["f1"], "mempo_format_ok": 1.0}
    # Search-R1's ground truth ({"target": aliases}, numpy arrays from parquet) and the plain gold string
    assert reward.compute_score("nq", "", {"target": np.array(golds)}, info)["score"] == 1.0
    assert reward.compute_score("nq", "", "Needle 3", info)["score"] == 1.0
    assert reward.compute_score("nq", "", "Needle 4", info)["score"] == 0.0
    # another loop's row: verl's decoded solution string is scored
    assert reward.compute_score("nq", TEXT, golds)["score"] == 1.0


def test_refuses_what_it_cannot_score_by_name():
    with pytest.raises(ValueError, match="no reward_model.ground_truth"):
        reward.compute_score("nq", TEXT, {"rubric": "x"})
    with pytest.raises(ValueError, match="mempo_score_mode.*got 'best'"):
        reward.compute_score("nq", "", "Needle 3", {"mempo_protocol_text": TEXT, "mempo_score_mode": "best"})


def test_verls_default_reward_function_scores_mempo_rows_and_forwards_the_others():
    assert reward.is_installed()  # the plugin installed it when verl was imported
    default = reward_score.default_compute_score
    info = {"mempo_protocol_text": TEXT, "mempo_score_mode": "mean"}
    assert default("nq", "", ["Needle 3"], info) == reward.compute_score("nq", "", ["Needle 3"], info)
    # any other row is verl's own: its gsm8k scorer, and its refusal of an unknown data source
    assert default("openai/gsm8k", "so #### 42", "42") == reward_score._verl_default_compute_score(
        "openai/gsm8k", "so #### 42", "42") == 1.0
    with pytest.raises(NotImplementedError, match="Reward function is not implemented"):
        default("nq", TEXT, ["Needle 3"], {"index": 0})
    reward.install()  # idempotent: never wraps its own wrapper
    assert reward_score.default_compute_score is default


# ------------------------------------------------------------------------------------------------
# the json action format, and a mempo outcome reward as verl's reward function
# ------------------------------------------------------------------------------------------------
JSON_TEXT = ('<mem></mem>\n<think>\nlook\n</think>\n<tool_call>{"name": "lookup", "arguments": {"key": "sky"}}'
             '</tool_call><tool_response>sky is blue</tool_response><mem>sky is blue</mem>\n<think>\nok\n</think>\n'
             "<answer>blue</answer>")
JSON_ROW = {"mempo_protocol_text": JSON_TEXT, "mempo_score_mode": "mean", "mempo_action_format": "json",
            "mempo_tools": ["lookup"], "mempo_prompt": "What colour is the sky?", "mempo_mem_rewards": [0.1],
            "id": "c1", "topic": "colours", "num_turns": 4, "rollout_reward_scores": {}}


def test_a_rows_format_is_checked_under_the_loops_tags():
    assert reward.compute_score("nq", "", ["blue"], JSON_ROW)["score"] == 1.0
    # the same text under the tags format of the built-in tools breaks the format: what the keys change
    assert reward.compute_score("nq", "", ["blue"], dict(JSON_ROW, mempo_action_format=None,
                                                          mempo_tools=None))["mempo_format_ok"] == 0.0
    tags_row = {"mempo_protocol_text": "<mem></mem><think>t</think><lookup>sky</lookup><information>sky is blue"
                                       "</information><mem>m</mem><think>t</think><answer>blue</answer>",
                "mempo_action_format": "tags", "mempo_tools": np.array(["lookup"], dtype=object)}  # as parquet has it
    assert reward.compute_score("nq", "", "blue", tags_row)["score"] == 1.0
    with pytest.raises(ValueError, match=r"mempo_action_format'\] / \['mempo_tools'\]: action format must be one"):
        reward.compute_score("nq", "", "blue", dict(JSON_ROW, mempo_action_format="xml"))


def _adapter(**kwargs):
    """mempo's adapter as verl calls a custom reward function (its reward_kwargs merged in)."""
    return reward.outcome_reward_score(data_source="colours", solution_str="decoded", **kwargs)


def test_a_mempo_outcome_reward_is_verls_reward_function():
    from support import user_tools

    user_tools.REWARD_CALLS.clear()
    got = _adapter(ground_truth=np.array(["blue", "azure"]), extra_info=dict(JSON_ROW),
                   outcome_reward="support.user_tools:overlap_reward")
    assert got == {"score": 1.0, "acc": 1.0, "mempo_reward": 1.0, "mempo_em": 1.0, "mempo_f1": 1.0,
                   "mempo_format_ok": 1.0}
    [(answer, example)] = user_tools.REWARD_CALLS
    assert answer == "blue"
    assert example == {"id": "c1", "topic": "colours", "prompt": "What colour is the sky?",
                       "questions": ["What colour is the sky?"], "golds": [["blue", "azure"]], "data_source": "colours"}
    # a numbered multi-question prompt gives its questions; per-objective golds stay per objective
    two = dict(JSON_ROW, mempo_prompt="Answer.\n\nQuestions:\n1. Sky?\n2. Grass?\n\nGive all 2 answers ...",
               mempo_protocol_text=JSON_TEXT.replace("<answer>blue</answer>", "<answer>blue; red</answer>"))
    assert _adapter(ground_truth=[["blue"], ["green"]], extra_info=two,
                    outcome_reward="support.user_tools:overlap_reward")["score"] == 0.5
    assert user_tools.REWARD_CALLS[-1][1]["questions"] == ["Sky?", "Grass?"]
    # a reward that needs no reference answer, on a row without one; a format break scores 0 whatever it returns
    assert _adapter(ground_truth=None, extra_info=dict(JSON_ROW), outcome_reward="support.user_tools:answered_reward"
                    )["score"] == 1.0
    broken = dict(JSON_ROW, mempo_protocol_text="<answer>blue</answer>")
    assert _adapter(ground_truth=None, extra_info=broken, outcome_reward="support.user_tools:answered_reward") == {
        "score": 0.0, "acc": 0.0, "mempo_reward": 1.0, "mempo_em": 0.0, "mempo_f1": 0.0, "mempo_format_ok": 0.0}
    # the built-ins by name: EM, and F1 of the answer's tokens
    assert _adapter(ground_truth="blue", extra_info=dict(JSON_ROW), outcome_reward="em")["score"] == 1.0
    half = dict(JSON_ROW, mempo_protocol_text=JSON_TEXT.replace("<answer>blue</answer>", "<answer>light blue</answer>"))
    assert _adapter(ground_truth="blue", extra_info=half, outcome_reward="f1")["score"] == pytest.approx(2 / 3)
    assert _adapter(ground_truth="blue", extra_info=half, outcome_reward="em")["score"] == 0.0
    # EM once every gold was in a tool result (the row's tool-result tag: <tool_response>)
    assert _adapter(ground_truth="blue", extra_info=dict(JSON_ROW), outcome_reward="em_retrieved")["score"] == 1.0
    unread = dict(JSON_ROW, mempo_protocol_text=JSON_TEXT.replace("sky is blue</tool_response>", "no</tool_response>"))
    assert _adapter(ground_truth="blue", extra_info=unread, outcome_reward="em_retrieved")["score"] == 0.0
    assert _adapter(ground_truth="blue", extra_info=unread, outcome_reward="em")["score"] == 1.0


@pytest.mark.parametrize("spec, match", [
    ("support.user_tools:nan_reward", r"^reward\.custom_reward_function\.reward_kwargs\.outcome_reward: "
                                      r"support\.user_tools:nan_reward returned nan on the row of data source "
                                      r"'colours', id 'c1'; it must return a finite float$"),
    ("support.user_tools:string_reward", r"outcome_reward: support\.user_tools:string_reward returned str '1\.0' "
                                         r"on the row .*; it must return a float$"),
    ("support.user_tools:raising_reward", r"outcome_reward: support\.user_tools:raising_reward raised on the row of "
                                          r"data source 'colours', id 'c1' \(KeyError: 'no such field'\)$"),
])
def test_a_failing_mempo_reward_is_one_line_naming_it(spec, match):
    from mempo.algo.outcome import OutcomeRewardError

    with pytest.raises(OutcomeRewardError, match=match):
        _adapter(ground_truth="blue", extra_info=dict(JSON_ROW), outcome_reward=spec)


def test_the_adapters_setting_is_refused_by_name():
    from mempo.config import ConfigError

    option = r"^reward\.custom_reward_function\.reward_kwargs\.outcome_reward: "
    with pytest.raises(ConfigError, match=option + "must name the reward outcome_reward_score calls"):
        _adapter(ground_truth="blue", extra_info=dict(JSON_ROW))
    with pytest.raises(ConfigError, match=option + r"'support\.user_tools:nothing': 'support\.user_tools' has no "):
        _adapter(ground_truth="blue", extra_info=dict(JSON_ROW), outcome_reward="support.user_tools:nothing")
    with pytest.raises(ConfigError, match=option + "must be one of"):
        _adapter(ground_truth="blue", extra_info=dict(JSON_ROW), outcome_reward="exact")
    with pytest.raises(ValueError, match="no reward_model.ground_truth"):  # a built-in needs golds
        _adapter(ground_truth=None, extra_info=dict(JSON_ROW), outcome_reward="em")
