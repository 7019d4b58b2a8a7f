"""mempo.apps.report: synthetic metrics.jsonl + eval JSONs -> report.md with the right numbers and valid PNGs."""
import json

import pytest

pytest.importorskip("matplotlib")

from mempo.eval import EvalReport, EvalRow
from mempo.apps.report import CURVE, StageTimes, load_run, metric_series, write_report
from mempo.train import metric_names
from mempo.train.logging import MetricsLogger

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(k, policy, em, f1, tokens, peak):
    return EvalRow(objectives=k, policy=policy, episodes=20, em=em, f1=f1, score=em, format_rate=0.9, answer_rate=0.95,
                   mean_turns=3.5, prompt_tokens_per_episode=tokens, peak_prompt_tokens=peak,
                   mean_prompt_tokens_per_turn=tokens / 3.5, generated_tokens_per_episode=300.0, seconds=12.0)


@pytest.fixture
def run_dir(tmp_path):
    with MetricsLogger(tmp_path / "rl", tensorboard=False) as logger:
        for step in range(1, 6):
            logger.log(step, {"reward/mean": 0.1 * step, "reward/em": 0.05 * step, "reward/f1": 0.07 * step,
                              "reward/format_rate": 1.0, "memory/reward": -0.01 * step, "memory/p_mem": 0.2,
                              "memory/p_full": 0.2 + 0.01 * step, "actor/kl_loss": 0.001 * step,
                              "actor/entropy": 2.0, "actor/pg_clipfrac": 0.0, "train/tokens": 1000 + step,
                              "time/rollout": 2.0,
                              "time/update": 1.5})
    with MetricsLogger(tmp_path / "sft", tensorboard=False) as logger:
        for step in range(1, 4):
            logger.log(step, {"sft/loss": 5.0 - step})
    before = EvalReport([_row(2, "memory", 0.125, 0.25, 1234.0, 567), _row(4, "memory", 0.0625, 0.125, 2345.0, 678),
                         _row(2, "full", 0.1, 0.2, 4321.0, 2222)], {"seconds": 30.0, "max_turns": 12})
    after = EvalReport([_row(2, "memory", 0.375, 0.5, 1111.0, 555), _row(4, "memory", 0.1875, 0.3125, 2222.0, 666)],
                       {"seconds": 31.0, "max_turns": 12})
    before.write(tmp_path, "eval_before")
    after.write(tmp_path, "eval_after")
    stages = {"stages": [{"name": "sft", "seconds": 123.4, "summary": "90 steps"},
                         {"name": "rl", "seconds": 77.7, "summary": "4 steps"}],
              "total_seconds": 201.1, "machine": {"cpu_count": 2, "torch": "9.9.9-test",
                                                     "cpu_model": "Test CPU @ 1 GHz", "cpu_capability": "AVX2"}}
    (tmp_path / "stages.json").write_text(json.dumps(stages))
    return tmp_path


def test_report_numbers_and_plots(run_dir):
    result = write_report(run_dir)
    text = result.path.read_text()
    assert result.path == run_dir / "report.md"
    # machine facts and stage wall times
    assert "9.9.9-test" in text and "| CPU count (os.cpu_count) | 2 |" in text
    # the CPU model and the kernels' instruction set: the floats of a CPU run follow them
    assert "| CPU model | Test CPU @ 1 GHz |" in text and "| torch CPU kernels (instruction set) | AVX2 |" in text
    assert "| sft | 123.400 | 90 steps |" in text and "| rl | 77.700 | 4 steps |" in text
    # before / after, memory context, 2 and 4 objectives
    # (rows without standard errors: they read as 0, and the change has no SE count)
    # (files without answered_pending and looped: "-")
    assert ("| 2 | 20 | 0.125 ± 0.000 | 0.375 ± 0.000 | +0.250 | 0.250 ± 0.000 | 0.500 ± 0.000 | 0.900 | 0.900 | "
            "3.500 | 3.500 | - | - | - | - | 1234 | 1111 | 567 | 555 |" in text)
    assert ("| 4 | 20 | 0.062 ± 0.000 | 0.188 ± 0.000 | +0.125 | 0.125 ± 0.000 | 0.312 ± 0.000 |" in text
            or "| 4 | 20 | 0.063 ± 0.000 | 0.188 ± 0.000 | +0.125 | 0.125 ± 0.000 | 0.312 ± 0.000 |" in text)
    assert "### full context" in text and "4321" in text
    # training curve: step 3 row has reward 0.3, mem reward -0.03, p_full 0.23, kl 0.003, tokens 1003
    assert "| 3 | 0.300 | 0.150 | 0.210 | 1.000 | -0.030 | 0.200 | 0.230 | 0.003 | 2.000 | 0.000 | 1003 |" in text
    assert "| rollout | 2.000 | 10.000 |" in text  # seconds per stage: mean and total over 5 steps
    assert "loss 4.000 (first) -> 2.000 (last)" in text
    assert set(result.plots) == {"reward", "memory_reward", "kl", "tokens", "sft"}
    for path in result.plots.values():
        assert path.is_file() and path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 1000
        assert f"]({path.name})" in text
    assert not result.missing


def test_report_without_inputs_says_so(tmp_path):
    result = write_report(tmp_path)
    text = result.path.read_text()
    assert "No training metrics" in text and "No evaluation files" in text and "No stage timings" in text
    assert result.plots == {} and len(result.missing) == 4


def test_the_report_reads_one_name_per_metric(run_dir):
    """Each curve metric has one name (`mempo.train.metric_names`); another spelling is not read."""
    names = {value for key, value in vars(metric_names).items() if key.isupper() and isinstance(value, str)}
    assert {key for _, key in CURVE} <= names and len({key for _, key in CURVE}) == len(CURVE)
    records = [{"step": 1, "memory/reward": 0.5, "reward/mean": 0.25, "kl": 1.0, "rollout/kl": 1.0}]
    assert metric_series(records, metric_names.REWARD) == ([1], [0.25])
    assert metric_series(records, metric_names.KL) == ([], [])
    found = load_run(run_dir)
    assert isinstance(found.stages, StageTimes) and [s.name for s in found.stages.stages] == ["sft", "rl"]
    assert found.metrics_path == run_dir / "rl" / "metrics.jsonl" and len(found.metrics) == 5


def test_closed_book_rows_say_what_retrieval_adds(tmp_path):
    from mempo.apps.report import closed_book_lines

    before = EvalReport([_row(2, "memory", 0.375, 0.5, 1000.0, 500),
                         _row(2, "memory-closed-book", 0.125, 0.2, 900.0, 450),
                         _row(4, "memory", 0.25, 0.3, 2000.0, 600)], {})
    after = EvalReport([_row(2, "memory", 0.5, 0.6, 1000.0, 500)], {})
    assert closed_book_lines(before, after) == [
        "### Closed book", "", "The same model, every search answered with no results (`eval.closed_book`): how much "
        "of the EM comes from retrieval.", "",
        "* before RL, k=2, memory context: EM with search 0.375 ± 0.000, closed-book 0.125 ± 0.000: "
        "retrieval adds +0.250",
        ""]
    assert closed_book_lines(after, None) == []  # no closed-book row: no lines
    text = write_report(tmp_path, before=before, after=after).path.read_text()
    assert "### memory-closed-book context" in text and "retrieval adds +0.250" in text
