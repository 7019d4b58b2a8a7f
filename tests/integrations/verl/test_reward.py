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
