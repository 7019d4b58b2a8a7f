"""bench/bench_signal.py (the memory-reward signal benchmark): its metrics (AUC, within-group Spearman,
no-spread share, the graded label: Spearman with the kept share and the AUC of rounds with a question
pending, with their bootstrap SEs) against brute-force references, with ties, one class only and empty
input giving their documented results, never NaN; definitions as config overrides; and the script end
to end on a smoke demo's output: held-out episodes of the split named (test or validation), rollouts
made once and reused, every definition on the same rollouts, results that the written per-round rows
reproduce."""
import json
import math
import random

import pytest

from support.paths import REPO, load_script


def _bench_signal():
    return load_script("bench/bench_signal.py")


bench = _bench_signal()


# ------------------------------------------------------------------------------------------------
# references: the definitions spelled out, pair by pair
# ------------------------------------------------------------------------------------------------
def _auc_pairs(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg) / (len(pos) * len(neg))


def _count_ranks(values):
    return [sum(w < v for w in values) + (sum(w == v for w in values) + 1) / 2 for v in values]


def _pearson(x, y):
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


# ------------------------------------------------------------------------------------------------
# metrics
# ------------------------------------------------------------------------------------------------
def test_average_ranks_share_the_mean_rank_among_ties():
    assert bench.average_ranks([3.0, 1.0, 3.0]) == [2.5, 1.0, 2.5]
    assert bench.average_ranks([2.0, 2.0, 2.0, 0.5]) == [3.0, 3.0, 3.0, 1.0]
    assert bench.average_ranks([]) == []
    with pytest.raises(ValueError, match="finite"):
        bench.average_ranks([1.0, float("nan")])


def test_auc_counts_ties_as_half_and_matches_the_pairwise_definition():
    assert bench.auc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert bench.auc([0.1, 0.2, 0.9, 0.8], [True, True, False, False]) == 0.0
    assert bench.auc([0.5] * 5, [True, False, True, False, False]) == 0.5  # no spread: chance, not NaN
    assert bench.auc([1.0, 1.0, 0.0], [True, False, False]) == 0.75
    rng = random.Random(0)
    for n in (2, 3, 7, 31):
        for _ in range(20):
            scores = [float(rng.choice([0, 1, 2, 3])) for _ in range(n)]  # many ties
            labels = [rng.random() < 0.4 for _ in range(n)]
            if len(set(labels)) < 2:
                assert bench.auc(scores, labels) is None
                continue
            assert bench.auc(scores, labels) == pytest.approx(_auc_pairs(scores, labels), abs=1e-12)


def test_auc_without_both_classes_is_none():
    assert bench.auc([], []) is None
    assert bench.auc([0.3, 0.1], [True, True]) is None
    assert bench.auc([0.3], [False]) is None
    with pytest.raises(ValueError, match="labels"):
        bench.auc([0.1, 0.2], [True])
    with pytest.raises(ValueError, match="finite"):
        bench.auc([float("inf"), 0.2], [True, False])


def test_spearman_matches_pearson_of_ranks_and_is_none_without_a_ranking():
    assert bench.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert bench.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    rng = random.Random(1)
    for n in (2, 3, 6, 25):
        for _ in range(20):
            x = [float(rng.randint(0, 3)) for _ in range(n)]
            y = [float(rng.randint(0, 1)) for _ in range(n)]
            if len(set(x)) < 2 or len(set(y)) < 2:
                assert bench.spearman(x, y) is None
                continue
            assert bench.spearman(x, y) == pytest.approx(_pearson(_count_ranks(x), _count_ranks(y)), abs=1e-12)
    assert bench.spearman([], []) is None
    assert bench.spearman([1.0], [0.0]) is None
    assert bench.spearman([0.2, 0.2, 0.2], [0.0, 1.0, 1.0]) is None
    with pytest.raises(ValueError, match="y values"):
        bench.spearman([1.0, 2.0], [1.0])


def test_within_group_spearman_averages_groups_with_both_classes():
    groups = [
        ([0.9, 0.1], [True, False]),             # +1
        ([0.1, 0.9, 0.5], [True, False, False]),  # keeps ranked last: negative
        ([0.4, 0.4], [True, False]),             # no spread among both classes: counts 0
        ([0.3, 0.7], [True, True]),              # one class: left out
        ([], []),                                # empty: left out
    ]
    second = _pearson(_count_ranks([0.1, 0.9, 0.5]), [1.0, 0.0, 0.0])
    mean, count = bench.within_group_spearman(groups)
    assert count == 3 and mean == pytest.approx((1.0 + second + 0.0) / 3)
    assert bench.within_group_spearman([([0.3, 0.7], [False, False])]) == (None, 0)
    assert bench.within_group_spearman([]) == (None, 0)


def test_no_spread_share_counts_pools_of_two_or_more():
    assert bench.no_spread_share([[0.1, 0.1], [0.1, 0.2], [0.5], []]) == (0.5, 2)
    assert bench.no_spread_share([[0.1, 0.1005]], tolerance=1e-3) == (1.0, 1)
    assert bench.no_spread_share([[0.1, 0.1005]]) == (0.0, 1)
    assert bench.no_spread_share([[0.3]]) == (None, 0)
    assert bench.no_spread_share([]) == (None, 0)


def _row(group, index, keeps, reward, k=2, share=None, pending=None):
    return bench.RoundRow(k, group, 0, index, keeps, {"d": reward}, share, pending)


def test_auc_bootstrap_se_resamples_whole_groups():
    # every group separates perfectly: every draw's AUC is 1, so no spread
    perfect = [[(1.0, True), (0.0, False)] for _ in range(6)]
    assert bench.auc_bootstrap_se(perfect) == 0.0
    assert bench.auc_bootstrap_se([[(0.3, True)], [(0.1, True)]]) is None  # one class
    assert bench.auc_bootstrap_se([]) is None
    # one row per group (independent rows): close to Hanley & McNeil's (1982) SE
    rng = random.Random(1)
    groups = [[(rng.gauss(1.0 if y else 0.0, 1.0), y)] for y in [True] * 120 + [False] * 180]
    rows = [row for g in groups for row in g]
    a = bench.auc([v for v, _ in rows], [y for _, y in rows])
    n1, n0 = 120, 180
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    hanley = math.sqrt((a * (1 - a) + (n1 - 1) * (q1 - a * a) + (n0 - 1) * (q2 - a * a)) / (n1 * n0))
    se = bench.auc_bootstrap_se(groups)
    assert se == bench.auc_bootstrap_se(groups)  # seeded: the same on every run
    assert 0.8 * hanley < se < 1.2 * hanley
    # rows repeated within a group are one draw: the SE of 4 copies of each group is not smaller
    copies = [g * 4 for g in groups]
    assert bench.auc_bootstrap_se(copies) > 0.8 * se
    m = bench.signal_metrics([_row(str(i), 1, y, v) for i, g in enumerate(groups) for v, y in g], "d", with_se=True)
    assert m["auc_se"] == se and bench.signal_metrics([_row("a", 1, True, 0.5)], "d")["auc_se"] is None


def test_signal_metrics_leave_out_unknown_keeps_and_unscored_rounds():
    rows = [_row("a", 1, True, 0.9), _row("a", 1, False, 0.2), _row("a", 2, None, 0.5),
            _row("b", 1, False, 0.3), _row("b", 2, True, None), _row("b", 2, True, 0.3)]
    m = bench.signal_metrics(rows, "d")
    assert (m["rounds"], m["scored"], m["keeps"], m["drops"]) == (6, 5, 2, 2)
    assert m["auc"] == pytest.approx(_auc_pairs([0.9, 0.2, 0.3, 0.3], [True, False, False, True]))
    # group a: (0.9 keep, 0.2 drop) -> +1; group b: (0.3 drop, 0.3 keep) -> no spread -> 0
    assert m["spearman"] == pytest.approx(0.5) and m["spearman_groups"] == 2
    assert (m["no_spread"], m["pools"]) == (0.5, 2)  # pools: a = [0.9, 0.2, 0.5] spreads, b = [0.3, 0.3] does not
    table = bench.signal_table(rows, ["d"])["d"]["k=2"]
    assert list(table) == ["all", "round 1", "round 2"]
    assert {**table["all"], "auc_se": None} == m and table["all"]["auc_se"] >= 0  # the SE: overall cells only
    assert all(cell["auc_se"] is None for split, cell in table.items() if split != "all")
    assert table["round 1"]["auc"] == pytest.approx(_auc_pairs([0.9, 0.2, 0.3], [True, False, False]))
    assert (table["round 1"]["no_spread"], table["round 1"]["pools"]) == (0.0, 1)  # (a, 1) = [0.9, 0.2]; (b, 1) alone
    assert table["round 2"]["auc"] is None and table["round 2"]["spearman"] is None  # keeps only
    assert (table["round 2"]["no_spread"], table["round 2"]["pools"]) == (None, 0)  # one reward per (group, round)
    table = bench.signal_table(rows, ["d"])
    no_rows = bench.signal_table([], ["d"], ks=[4])["d"]["k=4"]
    assert list(no_rows) == ["all"] and no_rows["all"]["rounds"] == 0 and no_rows["all"]["auc"] is None
    empty = bench.signal_metrics([], "d")
    assert empty["auc"] is None and empty["spearman"] is None and empty["no_spread"] is None
    json.dumps(table, allow_nan=False)  # None, never NaN
    text = bench.markdown_table(table)
    assert "| 2 | d | all |" in text and "n/a" in text


def test_spearman_with_the_kept_share_on_known_correlations_and_ties():
    # reward = share: +1 whatever the ties (the same ranking on both sides); reward = -share: -1
    shares = [0.0, 0.25, 0.5, 0.5, 1.0, 1.0, 0.25, 0.0]
    for sign in (1.0, -1.0):
        rows = [_row(str(i // 2), 2, s == 1.0, sign * s, share=s) for i, s in enumerate(shares)]
        m = bench.signal_metrics(rows, "d", with_se=True)
        assert m["share_spearman"] == pytest.approx(sign) and m["graded_rounds"] == len(shares)
        assert m["share_spearman_se"] == 0.0  # every bootstrap draw ranks alike: no spread
    # many ties, random data: the pooled rank correlation of the brute-force reference
    rng = random.Random(3)
    rows = [_row(str(g), 1 + i, None, float(rng.randint(0, 3)), share=rng.choice([0.0, 1 / 3, 2 / 3, 1.0]))
            for g in range(12) for i in range(4)]
    rewards, kept = [r.rewards["d"] for r in rows], [r.kept_share for r in rows]
    m = bench.signal_metrics(rows, "d", with_se=True)
    assert m["share_spearman"] == pytest.approx(_pearson(_count_ranks(rewards), _count_ranks(kept)), abs=1e-12)
    groups = [[(r.rewards["d"], r.kept_share) for r in rows if r.group == str(g)] for g in range(12)]
    assert m["share_spearman_se"] == bench.spearman_bootstrap_se(groups) > 0  # seeded: the same on every run
    assert bench.spearman_bootstrap_se(groups, seed=1) != m["share_spearman_se"]
    # a positive correlation of independent groups: the bootstrap SE near the normal-theory one
    many = [[(x + rng.gauss(0.0, 1.0), x)] for x in (rng.random() for _ in range(400))]
    rho = bench.spearman([a for g in many for a, _ in g], [b for g in many for _, b in g])
    se = bench.spearman_bootstrap_se(many)
    assert 0.1 < rho < 0.5 and 0.7 * (1 - rho ** 2) / math.sqrt(400 - 3) < se < 1.3 * (1 - rho ** 2) / math.sqrt(397)
    # no ranking: all shares equal, all rewards equal, rows without a share or a reward
    flat = [_row("a", 1, True, 0.1 * i, share=1.0) for i in range(4)]
    assert bench.signal_metrics(flat, "d", with_se=True)["share_spearman"] is None
    assert bench.signal_metrics(flat, "d", with_se=True)["share_spearman_se"] is None
    same = [_row("a", 1, None, 0.3, share=0.5 * i) for i in range(3)]
    assert bench.signal_metrics(same, "d")["share_spearman"] is None
    unlabelled = [_row("a", 1, None, 0.2), _row("a", 2, False, None, share=0.5), _row("b", 1, True, 0.4)]
    m = bench.signal_metrics(unlabelled, "d", with_se=True)
    assert (m["graded_rounds"], m["share_spearman"], m["share_spearman_se"]) == (0, None, None)
    assert bench.spearman_bootstrap_se([]) is None and bench.spearman_bootstrap_se([[(0.1, 0.2)]]) is None


def test_auc_on_rounds_with_a_question_pending():
    rows = [_row("a", 1, True, 0.9, pending=True), _row("a", 1, False, 0.2, pending=True),
            _row("a", 2, True, 0.1, pending=False), _row("a", 2, False, 0.8, pending=False),  # complete: left out
            _row("b", 1, False, 0.3, pending=True), _row("b", 1, True, 0.3, pending=True),
            _row("b", 2, None, 0.7, pending=True),  # nothing retrieved yet: no label
            _row("c", 1, True, 0.5, pending=None)]  # no golds: not a pending round
    m = bench.signal_metrics(rows, "d", with_se=True)
    assert (m["pending_keeps"], m["pending_drops"]) == (2, 2)
    assert m["pending_auc"] == pytest.approx(_auc_pairs([0.9, 0.2, 0.3, 0.3], [True, False, False, True]))
    assert m["auc"] == pytest.approx(_auc_pairs([0.9, 0.2, 0.1, 0.8, 0.3, 0.3, 0.5],
                                                [True, False, True, False, False, True, True]))
    assert m["pending_auc_se"] == bench.auc_bootstrap_se([[(0.9, True), (0.2, False)], [(0.3, False), (0.3, True)]])
    # one class among the pending rounds: no AUC, no SE (the complete rounds hold both classes)
    one = [r for r in rows if not (r.pending and r.keeps is False)]
    m = bench.signal_metrics(one, "d", with_se=True)
    assert m["pending_auc"] is None and m["pending_auc_se"] is None and m["auc"] is not None
    empty = bench.signal_metrics([], "d", with_se=True)
    assert (empty["pending_auc"], empty["pending_keeps"], empty["share_spearman"]) == (None, 0, None)
    table = bench.signal_table(rows, ["d"])
    assert table["d"]["k=2"]["round 1"]["pending_auc_se"] is None  # the SEs: overall cells only
    json.dumps(table, allow_nan=False)
    text = bench.markdown_table(table)
    assert "Spearman with kept share" in text and "AUC with a question pending" in text
    assert "| 2 | d | all |" in text and "; 2 / 2 |" in text


def test_definitions_start_from_the_library_scoring_defaults(tmp_path):
    from mempo.config import ConfigError, ScoringConfig, load_config

    cfg = load_config(REPO / "configs" / "demo.yaml", ["scoring.method=cached", "scoring.token_budget=4096",
                                                        "scoring.answer_template=spaced"])
    assert cfg.scoring.threshold is None  # the demo's own setting
    paper = bench.definition_config(cfg, bench.DEFINITIONS["paper"])
    assert paper.scoring.threshold == ScoringConfig().threshold == 0.5
    assert (paper.scoring.method, paper.scoring.token_budget) == ("cached", 4096)  # inherited: how, not what
    assert paper.scoring.answer_template == "spaced" != ScoringConfig().answer_template  # the model's answer round
    assert paper.rollout == cfg.rollout and paper.eval == cfg.eval
    assert bench.definition_config(cfg, bench.DEFINITIONS["paper_nothresh"]).scoring.threshold is None
    with pytest.raises(ConfigError, match="scoring.nope"):
        bench.definition_config(cfg, {"scoring.nope": 1})
    with pytest.raises(ConfigError, match="scoring.threshold"):
        bench.definition_config(cfg, {"scoring.threshold": 2.0})
    with pytest.raises(ConfigError, match="threshold"):
        bench.definition_config(cfg, {"threshold": 0.5})


# ------------------------------------------------------------------------------------------------
# the script end to end on a smoke demo's output
# ------------------------------------------------------------------------------------------------
#: room for the oracle's rounds (the smoke demo's own rollout settings cut them at 16 ids and 2 rounds)
ORACLE_ROOM = ["rollout.max_new_tokens_per_round=96", "rollout.max_turns=6", "rollout.max_response_tokens=2048"]


def test_the_benchmark_rolls_out_held_out_episodes_once_and_scores_every_definition(tmp_path, capsys):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from mempo.apps.cli import main as mempo_main
    from mempo.config import load_config
    from mempo.eval import eval_episodes
    from mempo.records.trajectory import read_trajectories_jsonl
    from mempo.scoring import score
    from mempo.algo.contexts import scoring_requests
    from mempo.protocol.grammar import answer_template_text
    from mempo.synthetic.backend import OracleBackend
    from mempo.synthetic.build import build_world
    from mempo.synthetic.cold_start import oracle_agent
    from mempo.synthetic.heldout import held_out_subjects
    from support.demo_smoke import SMOKE

    demo_out = tmp_path / "demo_out"  # with a validation split: 2 episodes per k, held out of SFT too
    assert mempo_main(["demo", "--out", str(demo_out), "--no-progress", *SMOKE, "eval.validation_episodes=2"]) == 0

    # 1. the command line, the SFT model generating (the override stands after a list option)
    out = tmp_path / "signal"
    assert bench.main(["--demo-out", str(demo_out), "--out", str(out), "--questions", "2", "--samples", "2",
                       "--ks", "2", "4", "rollout.temperature=0.7"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["ks"] == [2, 4] and results["samples"] == 2 and set(results["signal"]) == set(bench.DEFINITIONS)
    cfg = load_config(demo_out / "config.yaml")
    world = build_world(cfg).world
    held_out = eval_episodes(world, cfg)  # the demo's draw, whose questions its SFT left out
    for k in (2, 4):
        meta = json.loads((out / f"rollouts_k{k}.json").read_text())
        assert meta["episode_ids"] == [e.id for e in held_out[k][:2]] and meta["rollout"]["temperature"] == 0.7
        trajectories = read_trajectories_jsonl(out / f"rollouts_k{k}.jsonl")
        assert [t.uid for t in trajectories] == [e.id for e in held_out[k][:2] for _ in range(2)]
    assert results["held_out"]["subjects_in_sft_episodes"] == 0 and results["split"] == "test"
    text = (out / "results.md").read_text()
    assert text.startswith("2 held-out test episodes x 2 samples per k") and "\n| k | definition |" in text
    # eval.split=validation: the validation episodes, disjoint by entity from the test ones, held out of SFT too
    val_out = tmp_path / "signal_validation"
    assert bench.main(["--demo-out", str(demo_out), "--out", str(val_out), "--questions", "2", "--samples", "2",
                       "--ks", "2", "4", "eval.split=validation", "--definitions", "paper"]) == 0
    validation = eval_episodes(world, cfg, split="validation")
    val_results = json.loads((val_out / "results.json").read_text())
    assert val_results["split"] == "validation" and val_results["held_out"]["subjects_in_sft_episodes"] == 0
    for k in (2, 4):
        ids = json.loads((val_out / f"rollouts_k{k}.json").read_text())["episode_ids"]
        assert ids == [e.id for e in validation[k][:2]] and not set(ids) & {e.id for e in held_out[k]}
    assert not held_out_subjects(validation) & held_out_subjects(held_out)
    assert (val_out / "results.md").read_text().startswith("2 held-out validation episodes x 2 samples per k")
    assert bench.main(["--demo-out", str(demo_out), "--out", str(val_out), "--questions", "3", "--ks", "2",
                       "eval.split=validation"]) == 2  # the demo held out 2 validation episodes per k
    assert "held out 2 validation episodes per k (eval.validation_episodes)" in capsys.readouterr().err
    # another setting over saved rollouts: refused (exit 2, one line) unless --reroll; a k the demo trained on too
    assert bench.main(["--demo-out", str(demo_out), "--out", str(out), "--questions", "2", "--samples", "3",
                       "--ks", "2"]) == 2
    assert "holds rollouts of another setting (samples, rollout differ)" in capsys.readouterr().err
    assert bench.main(["--demo-out", str(demo_out), "--out", str(out), "--ks", "6"]) == 2
    assert "eval.objectives" in capsys.readouterr().err
    assert bench.main(["--demo-out", str(demo_out), "--out", str(out), "eval.episodes=1"]) == 2
    assert "eval.episodes=1: the synthetic/data/eval sections fix" in capsys.readouterr().err
    assert bench.main(["--demo-out", str(demo_out), "--out", str(out), "--model", "model_nope"]) == 2
    assert "model_nope/" in capsys.readouterr().err
    # --model: the RL model is the one loaded, digested and named
    rl = bench.run(demo_out, tmp_path / "signal_rl", model_name="model_rl", questions=1, samples=2, ks=[2],
                   definitions=["paper"], log=lambda line: None)
    assert rl["model"] == "model_rl" and rl["model_sha256"] == bench.model_digest(demo_out / "model_rl")
    assert "/model_rl` (weights sha256" in (tmp_path / "signal_rl" / "results.md").read_text()

    # 2. oracle rollouts (deterministic; its <mem> keeps or drops facts): the metrics on real rewards
    tokenizer = AutoTokenizer.from_pretrained(demo_out / "model_sft")
    oracle_cfg = load_config(demo_out / "config.yaml", ORACLE_ROOM)
    oracle = OracleBackend(tokenizer, agent=oracle_agent(oracle_cfg))
    out = tmp_path / "oracle"
    results = bench.run(demo_out, out, questions=2, samples=2, ks=[4], overrides=ORACLE_ROOM, backend=oracle,
                        log=lambda line: None)
    rows = [bench.RoundRow(**r) for r in map(json.loads, (out / "rounds.jsonl").read_text().splitlines())]
    assert {r.keeps for r in rows} >= {True, False}, "the oracle's rollouts should hold both classes"
    # the graded label: the kept share is 1.0 exactly where keeps is True; rounds pending and complete
    assert all((r.kept_share is None) == (r.keeps is None) for r in rows)
    assert all(r.kept_share == 1.0 for r in rows if r.keeps)
    assert all(r.kept_share < 1.0 for r in rows if r.keeps is False)
    assert {r.pending for r in rows} == {True, False}
    assert results["signal"]["paper"]["k=4"]["all"]["graded_rounds"] == sum(r.kept_share is not None for r in rows)
    assert results["signal"] == json.loads(json.dumps(bench.signal_table(rows, list(bench.DEFINITIONS), [4])))
    assert results["signal"]["paper"]["k=4"]["all"]["auc"] is not None
    read = results["rollouts"]["k=4"]["memory_read"]  # the worst retrieved objective's log P(gold | mem), by class
    assert read["keeps"] == sum(r.keeps is True for r in rows) and read["drops"] == sum(r.keeps is False for r in rows)
    assert read["median_worst_logp_mem_keeps"] <= 0 and read["median_worst_logp_mem_drops"] <= 0
    assert "median worst-objective log P(gold | mem)" in (out / "results.md").read_text()
    # "paper" is the library's threshold 0.5, although the demo's config sets none
    from transformers import AutoModelForCausalLM
    trajectories = read_trajectories_jsonl(out / "rollouts_k4.jsonl")
    model = AutoModelForCausalLM.from_pretrained(demo_out / "model_sft")
    template = answer_template_text(load_config(demo_out / "config.yaml").scoring.answer_template)  # inherited
    for name, threshold in (("paper", 0.5), ("paper_nothresh", None)):
        expected = [p_mem - p_full for result in score(model, scoring_requests(trajectories, tokenizer,
                                                                               template=template),
                                                       threshold=threshold) for p_mem, p_full in
                    zip(result.p_mem, result.p_full)]
        assert [r.rewards[name] for r in rows] == pytest.approx(expected, abs=1e-6)
    # a rerun with the same setting reuses the saved rollouts (the file is not rewritten)
    before = (out / "rollouts_k4.jsonl").stat().st_mtime_ns
    again = bench.run(demo_out, out, questions=2, samples=2, ks=[4], overrides=ORACLE_ROOM, backend=oracle,
                      definitions=["paper"], log=lambda line: None)
    assert again["rollouts"]["k=4"]["reused"] and (out / "rollouts_k4.jsonl").stat().st_mtime_ns == before
    assert again["signal"]["paper"] == results["signal"]["paper"]
    # a saved file that lost trajectories is not reused silently
    path = out / "rollouts_k4.jsonl"
    path.write_text(path.read_text().splitlines()[0] + "\n")
    with pytest.raises(bench.BenchError, match="damaged"):
        bench.run(demo_out, out, questions=2, samples=2, ks=[4], overrides=ORACLE_ROOM, backend=oracle,
                  definitions=["paper"], log=lambda line: None)
