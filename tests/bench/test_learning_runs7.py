"""bench/learning_runs7/ex7.py (execution 7's rules as code) on constructed inputs: Student's t against
tabulated quantiles, the pooled estimate and its Welch-Satterthwaite interval, the SFT gate (the lowest
passing seeds, judged on the validation split), the definition chosen on validation (the graded label,
ties, eligibility), the signal check, collapse, and every branch of the decision rule; the summary
written from a constructed folder."""
import json
import math
import os
import signal
import subprocess
import time

import pytest

from support.paths import REPO, load_script


def _ex7():
    return load_script("bench/learning_runs7/ex7.py")


ex7 = _ex7()


def test_t_quantiles_match_the_tables():
    for df, q in ((1, 12.706205), (2, 4.302653), (7, 2.364624), (21, 2.079614), (1000, 1.962339)):
        assert ex7.t_quantile(0.975, df) == pytest.approx(q, abs=1e-5)
    assert ex7.t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-6) and ex7.t_cdf(0.0, 3) == 0.5
    assert ex7.t_cdf(-2.364624, 7) == pytest.approx(0.025, abs=1e-6)
    with pytest.raises(ValueError):
        ex7.t_quantile(1.0, 7)


def test_pooled_counts_each_model_the_same_with_a_welch_satterthwaite_interval():
    models = [{"d": 0.05, "se": 0.01, "n": 8}, {"d": 0.04, "se": 0.01, "n": 8}, {"d": 0.06, "se": 0.01, "n": 8}]
    p = ex7.pooled(models)
    se = math.sqrt(3e-4) / 3
    assert p["mean"] == pytest.approx(0.05) and p["se"] == pytest.approx(se) and p["df"] == pytest.approx(21.0)
    assert p["low"] == pytest.approx(0.05 - 2.079614 * se, abs=1e-6)
    assert p["high"] == pytest.approx(0.05 + 2.079614 * se, abs=1e-6)
    assert p["cochran_q"] == pytest.approx(2.0) and p["q_df"] == 2
    # one noisy model: the df fall towards its 7, the interval widens
    noisy = ex7.pooled([{"d": 0.05, "se": 0.05, "n": 8}, {"d": 0.04, "se": 0.001, "n": 8}])
    assert 7.0 <= noisy["df"] < 7.1 and noisy["high"] - noisy["low"] > 2 * 2.36 * noisy["se"] * 0.99
    with pytest.raises(ValueError):
        ex7.pooled([{"d": 0.05, "se": None, "n": 1}])
    with pytest.raises(ValueError):
        ex7.pooled([])


def _row(seed, em8, split="validation"):
    return {"seed": seed, "split": split, "em_k2": 0.9, "em_k4": 0.5, "em_k8": em8}


def test_the_gate_takes_the_lowest_passing_seeds_once_every_lower_seed_is_judged():
    rows = {0: _row(0, 0.25), 1: _row(1, 0.1), 2: _row(2, 0.3), 3: _row(3, 0.2)}  # 0.2 exactly passes
    assert ex7.gate(rows) == {"models": [0, 2, 3], "judged": [0, 1, 2, 3], "next": [], "settled": True}
    assert ex7.gate({0: _row(0, 0.25)})["next"] == [1, 2]
    gap = ex7.gate({0: _row(0, 0.25), 2: _row(2, 0.3), 3: _row(3, 0.3)})  # seed 1 unjudged: only seed 0 counts
    assert gap["models"] == [0] and gap["next"] == [1, 4] and not gap["settled"]
    failing = {s: _row(s, 0.19 if s % 3 else 0.5) for s in range(6)}  # seeds 0 and 3 pass
    assert ex7.gate(failing) == {"models": [0, 3], "judged": list(range(6)), "next": [], "settled": True}
    # E8's amendment A2: settled once the unjudged seeds cannot make up three passes, not before
    two_failed = {0: _row(0, 0.1), 1: _row(1, 0.0)}
    assert ex7.gate(two_failed) == {"models": [], "judged": [0, 1], "next": [2, 3], "settled": False}
    four_failed = {**two_failed, 2: _row(2, 0.19), 3: _row(3, 0.0)}
    assert ex7.gate(four_failed) == {"models": [], "judged": [0, 1, 2, 3], "next": [], "settled": True}
    one_of_four = {**four_failed, 2: _row(2, 0.2)}  # one pass, two seeds left: three still reachable
    assert ex7.gate(one_of_four) == {"models": [2], "judged": [0, 1, 2, 3], "next": [4, 5], "settled": False}
    one_of_five = {**one_of_four, 4: _row(4, 0.0)}
    assert ex7.gate(one_of_five) == {"models": [2], "judged": [0, 1, 2, 3, 4], "next": [], "settled": True}
    with pytest.raises(ValueError, match="validation-split row"):
        ex7.gate({0: _row(0, 0.9, split="test")})
    with pytest.raises(ValueError, match="em_k8"):
        ex7.passes_gate({"seed": 0, "split": "validation", "em_k2": 0.9})


def test_an_execution_may_gate_other_seeds(tmp_path):
    """E10 gates seeds 0-11 (its folder holds E9's rows 0-5): two passes of six leave it open, where E9's six
    seeds settled it; the 12 seeds settle it as the six did (A2), and the summary names the unrun seeds of 0-11."""
    e9_like = {s: _row(s, 0.5 if s in (3, 4) else 0.1) for s in range(6)}
    assert ex7.gate(e9_like)["settled"] and ex7.gate(e9_like)["models"] == [3, 4]
    seeds = ex7.SFT_SEEDS_BY_EXECUTION["10"]
    assert seeds == tuple(range(12))
    assert ex7.gate(e9_like, seeds) == {"models": [3, 4], "judged": list(range(6)), "next": [6, 7], "settled": False}
    assert ex7.gate({**e9_like, 6: _row(6, 0.0), 7: _row(7, 0.2)}, seeds)["models"] == [3, 4, 7]
    failing = {**e9_like, **{s: _row(s, 0.1) for s in range(6, 12)}}
    assert ex7.gate(failing, seeds) == {"models": [3, 4], "judged": list(range(12)), "next": [], "settled": True}
    folder = tmp_path / "learning_runs10"
    folder.mkdir()
    assert ex7.sft_seeds(folder) == seeds and ex7.sft_seeds(tmp_path) == ex7.SFT_SEEDS
    none_pass = {s: {**_row(s, 0.0), "em_se_k8": 0.0, "format_k8": 0.5, "turns_k8": 9.0, "copy_loss_last50": 0.15,
                     "sft_last_loss": 1.4, "mem_kinds_k8": {"gold": 0.1}} for s in range(10)}
    for seed, row in none_pass.items():
        (folder / f"sft_s{seed}.jsonl").write_text(json.dumps(row) + "\n")
    assert ex7.folder_gate(folder)["settled"]  # 0 passes, 2 seeds left: three cannot be reached
    assert ex7.main(["models", str(folder)]) == 3
    pytest.importorskip("matplotlib")
    assert ex7.main(["summary", str(folder)]) == 0
    text = (folder / "results.md").read_text()
    assert text.startswith("Execution 10: 0 of SFT seeds [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] passed") and \
        "SFT seeds [10, 11] were not run" in text


def test_execution_10_starts_from_execution_9s_rows():
    """E10's folder holds E9's six SFT rows unchanged (its protocol reuses them), so its gate opens at seeds 6-7."""
    e9, e10 = REPO / "bench" / "learning_runs9", REPO / "bench" / "learning_runs10"
    for seed in range(6):
        assert (e10 / f"sft_s{seed}.jsonl").read_text() == (e9 / f"sft_s{seed}.jsonl").read_text()
    assert ex7.folder_gate(e10)["models"][:2] == [3, 4]


def _signal(values, split="validation", **extra):
    """A bench_signal results.json: {definition: (share_spearman at k = 4, at k = 8)}."""
    cells = {name: {f"k={k}": {"all": {"share_spearman": v, **extra}} for k, v in zip((4, 8), pair)}
             for name, pair in values.items()}
    return {"split": split, "signal": cells}


def test_the_definition_is_the_best_graded_spearman_on_validation():
    signals = {0: _signal({"paper": (0.1, 0.1), "retrieved_min_c10": (0.4, 0.2), "complete_min_c10": (0.5, None),
                           "paper_nothresh": (0.3, 0.3), "all_fixes_min_c10": (0.2, 0.2)}),
               2: _signal({"paper": (0.1, 0.1), "retrieved_min_c10": (0.4, 0.4), "complete_min_c10": (0.9, 0.9),
                           "paper_nothresh": (0.3, 0.3), "all_fixes_min_c10": (0.2, 0.2)})}
    chosen = ex7.choose(signals)
    assert chosen["best"] == "retrieved_min_c10" and "complete_min_c10" not in chosen["scores"]  # None: not eligible
    assert chosen["scores"]["retrieved_min_c10"] == pytest.approx(0.35)
    tie = {0: _signal({"paper": (0.3, 0.3), "retrieved_min_c10": (0.3, 0.3), "complete_min_c10": (0.3, 0.3),
                       "paper_nothresh": (0.3, 0.3), "all_fixes_min_c10": (0.3, 0.3)})}
    assert ex7.choose(tie)["best"] == "paper"  # ties: the fewest overrides
    with pytest.raises(ValueError, match="validation split"):
        ex7.choose({0: _signal({"paper": (0.3, 0.3)}, split="test")})
    with pytest.raises(ValueError, match="no candidate"):
        ex7.choose({0: _signal({name: (None, 0.1) for name in ex7.CANDIDATES})})


def test_the_candidates_overrides_are_bench_signals():
    bench_signal = load_script("bench/bench_signal.py")
    assert ex7.OVERRIDES == {name: len(bench_signal.DEFINITIONS[name]) for name in ex7.CANDIDATES}


def test_signal_present_needs_the_graded_label_and_a_judgeable_pending_auc():
    def signal(rho, rho_se, auc, auc_se, keeps=40, drops=40):
        return {"signal": {"d": {"k=8": {"all": {"share_spearman": rho, "share_spearman_se": rho_se,
                                                 "pending_auc": auc, "pending_auc_se": auc_se,
                                                 "pending_keeps": keeps, "pending_drops": drops}}}}}
    assert ex7.signal_present(signal(0.3, 0.1, 0.8, 0.1), "d")["present"]
    assert not ex7.signal_present(signal(0.3, 0.16, 0.8, 0.1), "d")["present"]  # rho - 2 SE < 0
    assert not ex7.signal_present(signal(0.3, 0.1, 0.65, 0.1), "d")["present"]  # AUC - 2 SE < 0.5
    few = ex7.signal_present(signal(0.3, 0.1, 0.3, 0.1, keeps=19), "d")  # not judgeable: the AUC is not required
    assert few["present"] and not few["pending_judgeable"]
    assert not ex7.signal_present(signal(None, None, 0.9, 0.01), "d")["present"]


def _runs(grpo, mempo, k=8, pending=None):
    """Run records of one model: per seed GRPO's and MemPO's EM at k (and MemPO's answered-pending share)."""
    runs = []
    for seed, (g, m) in enumerate(zip(grpo, mempo)):
        runs.append({"arm": "grpo", "seed": seed, "rows": {str(k): {"em": g, "answered_pending": 0.1}}})
        share = 0.1 if pending is None else pending[seed]
        runs.append({"arm": "mempo_x", "seed": seed, "rows": {str(k): {"em": m, "answered_pending": share}}})
    return runs


def test_model_estimate_and_collapse():
    grpo = [0.30, 0.32, 0.28, 0.31, 0.29, 0.30, 0.33, 0.27]
    e = ex7.model_estimate(_runs(grpo, [g + 0.05 + 0.01 * (i % 2) for i, g in enumerate(grpo)]), "mempo_x")
    assert e["n"] == 8 and e["d"] == pytest.approx(0.055) and e["ahead"] and e["grpo_em"] == pytest.approx(0.3)
    level = ex7.model_estimate(_runs(grpo, [g + (0.02 if i % 2 else -0.02) for i, g in enumerate(grpo)]), "mempo_x")
    assert level["d"] == pytest.approx(0.0) and not level["ahead"]
    pending = [0.1] * 7 + [0.9]  # seed 7 answers with a question pending, its GRPO pair does not
    assert ex7.model_estimate(_runs(grpo, grpo, pending=pending), "mempo_x")["collapsed"] == [7]
    assert ex7.model_estimate([], "mempo_x")["n"] == 0


def _model(d, se, grpo_em=0.4, signal=True, ahead=None, collapsed=()):
    return {"d": d, "se": se, "n": 8, "grpo_em": grpo_em, "signal": signal,
            "ahead": (d > 0 and d >= 2 * se) if ahead is None else ahead, "collapsed": list(collapsed)}


def test_every_branch_of_the_decision_rule():
    helps = {0: _model(0.06, 0.02), 1: _model(0.05, 0.02), 2: _model(0.01, 0.02)}
    assert ex7.decide(helps)["outcome"] == "helps"
    assert ex7.decide({**helps, 2: _model(0.01, 0.02, collapsed=[3])})["outcome"] == "not a test"  # a collapse
    assert ex7.decide({0: _model(0.06, 0.02), 1: _model(0.01, 0.02), 2: _model(0.01, 0.02)})["outcome"] \
        == "not a test"  # ahead on 1 of 3 only
    small = {0: _model(0.05, 0.02), 1: _model(0.05, 0.02), 2: _model(-0.02, 0.01)}  # pooled +0.027 < 0.03
    assert ex7.decide(small)["outcome"] == "not a test"
    none = {0: _model(0.0, 0.01), 1: _model(0.005, 0.01), 2: _model(-0.01, 0.01)}
    decision = ex7.decide(none)
    assert decision["outcome"] == "does not help" and decision["pooled_valid"]["high"] < 0.03
    floor = {0: _model(0.0, 0.01, grpo_em=0.05), 1: _model(0.0, 0.01, grpo_em=0.9), 2: _model(0.0, 0.01)}
    assert ex7.decide(floor)["outcome"] == "not a test"  # GRPO at the floor or the ceiling: not valid models
    silent = {0: _model(0.0, 0.01, signal=False), 1: _model(0.0, 0.01, signal=False), 2: _model(0.0, 0.01)}
    assert ex7.decide(silent)["outcome"] == "not a test"  # no memory signal on 2 of 3
    two_valid = {0: _model(0.0, 0.01, signal=False), 1: _model(0.0, 0.01), 2: _model(0.01, 0.01)}
    assert ex7.decide(two_valid)["outcome"] == "does not help" and ex7.decide(two_valid)["valid"] == [1, 2]
    wide = {0: _model(0.0, 0.03), 1: _model(0.01, 0.03), 2: _model(-0.01, 0.03)}  # upper end above 0.03
    assert ex7.decide(wide)["outcome"] == "not a test"
    assert ex7.decide({0: _model(0.1, 0.01), 1: _model(0.1, 0.01)})["outcome"] == "not a test"  # 2 gated models


def test_the_decision_is_settled_when_only_not_a_test_can_be_reached():
    """E10's amendment A3: an unfinished model may still be ahead and, with a signal, valid for a negative."""
    e10 = {3: _model(-0.003, 0.004, grpo_em=0.964), 4: _model(-0.01, 0.005, signal=False), 8: _model(0.0, 0.0)}
    assert ex7.reachable(e10, [3]) == {"helps", "not a test"}  # models 4 and 8 may both be ahead
    assert ex7.reachable(e10, [3, 4]) == {"not a test"}  # settled: one model left can be neither two
    assert ex7.reachable({**e10, 4: _model(0.05, 0.01, signal=False)}, [3, 4]) == {"helps", "not a test"}
    valid = {0: _model(0.0, 0.01), 1: _model(0.0, 0.01), 2: _model(0.0, 0.01)}
    assert ex7.reachable(valid, []) == {"helps", "does not help", "not a test"}
    assert ex7.reachable(valid, [0, 1]) == {"does not help", "not a test"}
    assert ex7.reachable(valid, [0, 1, 2]) == {"does not help", "not a test"}  # finished: decide reads it
    assert ex7.reachable({0: _model(0.1, 0.01), 1: _model(0.1, 0.01)}, []) == {"not a test"}  # 2 gated models


def test_the_summary_of_a_constructed_execution(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "best.txt").write_text("x\n")
    (tmp_path / "signal.json").write_text(json.dumps({"models": [0, 2, 3], "best": "x",
                                                      "signal": {str(s): {"present": True} for s in (0, 2, 3)}}))
    grpo = [0.30, 0.32, 0.28, 0.31, 0.29, 0.30, 0.33, 0.27]
    for seed, shift in ((0, 0.0), (2, 0.005), (3, -0.005)):
        folder = tmp_path / f"m{seed}"
        folder.mkdir()
        for i, g in enumerate(grpo):
            for arm, em in (("grpo", g), ("mempo_x", g + shift + (0.01 if i % 2 else -0.01))):
                rows = {str(k): {"em": em, "turns": 9.0, "answered_pending": 0.1, "token_ratio": 0.4}
                        for k in (2, 4, 8)}
                (folder / f"{arm}_s{i}.json").write_text(json.dumps({"arm": arm, "seed": i, "rows": rows}))
    (tmp_path / "m0" / "results.json").write_text("{}")  # the runner's mark of a finished model
    (tmp_path / "m2" / "results.json").write_text("{}")
    assert ex7.main(["summary", str(tmp_path)]) == 0  # 8 pairs on each model, but model 3 not marked finished
    text = (tmp_path / "results.md").read_text()
    assert "Decision: **unfinished**" in text and "Pooled at k = 8" not in text
    (tmp_path / "m3" / "results.json").write_text("{}")
    assert ex7.main(["summary", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert "Decision: **does not help**" in text and "Pooled at k = 8 (3 models): +0.000" in text
    assert (tmp_path / "ablation_e7.png").read_bytes()[:4] == b"\x89PNG"
    assert ex7.main(["nope", str(tmp_path)]) == 2


def test_the_summary_of_a_failed_gate_is_its_table_and_not_a_test(tmp_path):
    pytest.importorskip("matplotlib")
    for seed, em8 in enumerate((0.018, 0.21, 0.0, 0.0, 0.19, 0.05)):  # one seed passes: not a test
        row = {**_row(seed, em8), "em_se_k8": 0.01, "format_k8": 0.5, "turns_k8": 9.0, "copy_loss_last50": 0.15,
               "sft_last_loss": 1.4, "mem_kinds_k8": {"gold": 0.1}, "right_by_position_k8": [0.2, 0.1]}
        (tmp_path / f"sft_s{seed}.jsonl").write_text(json.dumps(row) + "\n")
    assert ex7.main(["summary", str(tmp_path)]) == 0  # no signal.json, no RL run: the gate's summary
    text = (tmp_path / "results.md").read_text()
    assert "1 of SFT seeds [0, 1, 2, 3, 4, 5] passed the gate" in text and "Decision: **not a test**" in text
    assert "| 1 | 0.900 | 0.500 | 0.210 ± 0.010 |" in text and text.count("| no |") == 5
    assert (tmp_path / "gate_e7.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "sft_s5.jsonl").unlink()  # one pass, one seed left: settled, seed 5 not run (A2)
    assert ex7.main(["summary", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert "1 of SFT seeds [0, 1, 2, 3, 4] passed the gate (greedy EM >= 0.2 at k = 8 on the validation split), " \
           "fewer than 3: no RL run. SFT seeds [5] were not run" in text and "Decision: **not a test**" in text
    (tmp_path / "sft_s4.jsonl").unlink()  # the gate not settled: the table so far, the next seeds, unfinished
    assert ex7.main(["summary", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert "1 of SFT seeds [0, 1, 2, 3] passed the gate (greedy EM >= 0.2 at k = 8 on the validation split) so " \
           "far; SFT seeds [4, 5] run next" in text
    assert "Decision: **unfinished**" in text and "not a test" not in text and text.count("| no |") == 3
    for seed in (2, 3, 4):  # three pass: settled, but no signal benchmark chosen on yet
        row = {**json.loads((tmp_path / "sft_s0.jsonl").read_text()), "seed": seed, "em_k8": 0.3}
        (tmp_path / f"sft_s{seed}.jsonl").write_text(json.dumps(row) + "\n")
    assert ex7.main(["summary", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert "the signal benchmarks and the definition's choice run next" in text and "**unfinished**" in text


def test_an_execution_folder_names_its_outputs(tmp_path):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "learning_runs8"  # execution 8's folder: its number in the text and the plot's name
    folder.mkdir()
    for seed in range(6):
        row = {**_row(seed, 0.0), "em_se_k8": 0.0, "format_k8": 0.5, "turns_k8": 9.0, "copy_loss_last50": 0.149,
               "copy_steps": 3150 + seed, "sft_last_loss": 1.4, "mem_kinds_k8": {"gold": 0.1},
               "right_by_position_k8": [0.2]}
        (folder / f"sft_s{seed}.jsonl").write_text(json.dumps(row) + "\n")
    assert ex7.execution(folder) == "8" and ex7.execution(tmp_path) == "7"
    assert ex7.main(["summary", str(folder)]) == 0
    text = (folder / "results.md").read_text()
    assert text.startswith("Execution 8: 0 of SFT seeds") and "| 0.149 | 3150 |" in text
    assert (folder / "gate_e8.png").is_file() and not (folder / "gate_e7.png").exists()
    assert ex7.main(["models", str(folder)]) == 3


def test_the_commands_run_sh_calls(tmp_path, capsys):
    def rows(folder, em8):
        folder.mkdir(exist_ok=True)
        for seed, em in em8.items():
            row = {**_row(seed, em), "weights_sha256": f"w{seed}"}
            (folder / f"sft_s{seed}.jsonl").write_text(json.dumps(row) + "\n")

    rows(tmp_path, {0: 0.3, 1: 0.1})
    assert ex7.main(["next", str(tmp_path)]) == 0 and capsys.readouterr().out.strip() == "2 3"
    assert ex7.main(["models", str(tmp_path)]) == 2  # not settled yet: seeds 2 and 3 first
    assert "not settled" in capsys.readouterr().err
    rows(tmp_path, {2: 0.25, 3: 0.4})
    assert ex7.main(["next", str(tmp_path)]) == 0 and capsys.readouterr().out.strip() == ""
    assert ex7.main(["models", str(tmp_path)]) == 0 and capsys.readouterr().out.strip() == "0 2 3"
    few = tmp_path / "few"
    rows(few, {s: 0.1 for s in range(6)})
    assert ex7.main(["models", str(few)]) == 3 and "not a test" in capsys.readouterr().err
    same = [str(tmp_path / "sft_s0.jsonl"), str(tmp_path / "sft_s0.jsonl")]
    assert ex7.main(["same-weights", *same]) == 0
    assert ex7.main(["same-weights", same[0], str(tmp_path / "sft_s2.jsonl")]) == 2
    assert "another CPU" in capsys.readouterr().err


def test_stopping_the_runner_stops_every_process_it_started(tmp_path):
    """run.sh killed (as a session's end does) leaves none of its jobs' processes running: each job is a subshell
    running python, and a killed subshell alone would leave its python going. The jobs here are stand-ins for
    python (PY: the scanner check passes, the gate asks for seeds 0 and 1, an SFT job sleeps)."""
    pids = tmp_path / "pids"
    fake = tmp_path / "py"
    fake.write_text('#!/bin/bash\ncase "$*" in\n  *"ex7.py next"*) echo "0 1";;\n'
                    f'  *sft_seeds.py*) echo $$ >> {pids}; exec sleep 300;;\nesac\n')
    fake.chmod(0o755)
    (tmp_path / "runs").mkdir()
    env = {**os.environ, "PY": str(fake), "RUNS_DIR": str(tmp_path / "runs"), "SCRATCH_DIR": str(tmp_path / "s")}
    runner = subprocess.Popen(["bash", str(REPO / "bench/learning_runs7/run.sh")], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while (not pids.exists() or len(pids.read_text().split()) < 2) and time.monotonic() < deadline:
            time.sleep(0.1)
        jobs = [int(p) for p in pids.read_text().split()]
        assert len(jobs) == 2  # both SFT jobs running
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=30) != 0

        def running(pid):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            return True

        deadline = time.monotonic() + 10
        while any(running(p) for p in jobs) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(running(p) for p in jobs)
        assert len(pids.read_text().split()) == 2  # and no job started after the stop
    finally:
        try:
            os.killpg(runner.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_fresh_machine_remakes_only_the_models_of_the_work_left(tmp_path):
    """run.sh past a settled gate on a machine without models (PY: a stand-in logging each call): a model whose
    signal benchmark and RL runs are kept is not remade; the others are remade once, checked by digest, and the
    two still to run RL are remade together before the first's runs."""
    log, runs, scratch = tmp_path / "calls", tmp_path / "runs", tmp_path / "s"
    fake = tmp_path / "py"
    fake.write_text(f"""#!/bin/bash
arg() {{ local want=$1; shift; while [ $# -gt 0 ]; do [ "$1" = "$want" ] && {{ echo "$2"; return; }}; shift; done; }}
case "$*" in
  *"ex7.py next"*) ;;
  *"ex7.py models"*) echo "3 4 7";;
  *"ex7.py choose"*) echo paper;;
  *"ex7.py same-weights"*) echo "same-weights $(basename "$4")" >> {log};;
  *"ex7.py summary"*) echo summary >> {log};;
  *sft_seeds.py*) s=$(arg --seeds "$@"); echo "sft $s" >> {log}; sleep 0.2
     mkdir -p "$(arg --models-dir "$@")/demo_k8_e9_eval.split-validation_s$s/model_sft"; touch "$(arg --out "$@")";;
  *bench_signal.py*) echo "signal $(arg --out "$@")" >> {log}; mkdir -p "$(arg --out "$@")"
     touch "$(arg --out "$@")/results.md" "$(arg --out "$@")/results.json";;
  *bench_learning.py*) out=$(arg --out "$@"); echo "rl $(basename "$out") $(arg --seeds "$@")" >> {log}
     mkdir -p "$out" "$(arg --runs "$@")"; touch "$out/results.md" "$out/results.json";;
esac
""")
    fake.chmod(0o755)
    runs.mkdir()
    for seed in (3, 4, 7):
        (runs / f"sft_s{seed}.jsonl").write_text(json.dumps({**_row(seed, 0.5), "weights_sha256": "w"}) + "\n")
    for seed in (3, 4):  # seed 7's signal benchmark is not kept
        (runs / f"signal_s{seed}").mkdir()
        (runs / f"signal_s{seed}" / "results.json").write_text("{}")
    (runs / "m3").mkdir()
    (runs / "m3" / "results.json").write_text("{}")  # model 3's RL is finished
    env = {**os.environ, "PY": str(fake), "RUNS_DIR": str(runs), "SCRATCH_DIR": str(scratch),
           "CONFIG": "configs/demo_k8_e9.yaml"}
    done = subprocess.run(["bash", str(REPO / "bench/learning_runs7/run.sh")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert [c for c in calls if c.startswith("sft")] == ["sft 7", "sft 4"]  # 7 for its signal, 4 for its RL; not 3
    assert calls[:3] == ["sft 7", "same-weights remake_s7.jsonl", f"signal {scratch}/signal_s7"]
    assert calls.index("sft 4") < min(i for i, c in enumerate(calls) if c.startswith("rl rl_m4"))
    assert not any(c.startswith("rl rl_m3") for c in calls)
    assert sorted(c for c in calls if c.startswith("rl rl_m4_s")) == sorted(f"rl rl_m4_s{s} {s}" for s in range(8))
    assert calls[-1] == "summary" and (runs / "m7" / "results.json").exists()
