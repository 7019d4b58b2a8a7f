"""Reading verl's prompt_logprobs layout (vLLM / SGLang extractors): the answer rows, and every malformed
answer refused by what is wrong. (The scorer against a model: test_agent_loop.py.)"""
import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install .[verl])")
pytestmark = pytest.mark.verl

from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from mempo.integrations.verl.server_scoring import ServerScoringError, answer_row_logprobs  # noqa: E402


def _output(prompt, rows, ids=True):
    extra = {"prompt_logprobs": rows}
    if ids:
        extra["prompt_ids"] = [[t] for t in prompt[1:]] + [[0]]
    return TokenOutput(token_ids=[7], extra_fields=extra)


def test_answer_rows_start_at_the_contexts_last_row():
    prompt = [5, 6, 7, 8, 9]  # context [5, 6, 7], answer [8, 9]
    rows = [[-0.1], [-0.2], [-0.3], [-0.4], [0.0]]  # row k: log p(prompt[k+1] | prompt[:k+1]); last a dummy
    assert answer_row_logprobs(_output(prompt, rows), prompt, 3) == [-0.3, -0.4]
    assert answer_row_logprobs(_output(prompt, rows, ids=False), prompt, 3) == [-0.3, -0.4]


@pytest.mark.parametrize("rows, ids, match", [
    (None, True, "no extra_fields\\['prompt_logprobs'\\]"),
    ([[-0.1]] * 4, True, "4 rows for a prompt of 5 ids"),
    ([[-0.1], [-0.2], [], [-0.4], [0.0]], True, "row 2 is empty"),
    ([[-0.1], [-0.2], [0.5], [-0.4], [0.0]], True, "row 2 holds 0.5"),
    ([[-0.1], [-0.2], [float("nan")], [-0.4], [0.0]], True, "row 2 holds nan"),
    ([[-0.1], [-0.2], [-0.3], [-0.4], [0.0]], [[6], [7], [9], [9], [0]], "row 2 is for token 9, not for prompt id 8"),
])
def test_malformed_answers_are_refused_by_what_is_wrong(rows, ids, match):
    prompt = [5, 6, 7, 8, 9]
    output = TokenOutput(token_ids=[7], extra_fields={} if rows is None else {"prompt_logprobs": rows})
    if rows is not None and ids is not True:
        output.extra_fields["prompt_ids"] = ids
    with pytest.raises(ServerScoringError, match=match):
        answer_row_logprobs(output, prompt, 3)
