"""Exploratory (issue 20): the signal benchmark's AUC (keeps vs drops, k = 2) of `retrieved_min_c10` with and
without its comparator, from a `bench/bench_signal.py` run's saved rollouts: "cmp" is the definition
(min_j clip(l_mem_j - l_full_j, -10, 10)), "nocmp_log" min_j max(l_mem_j, -10) and "nocmp_prob" min_j P_mem_j
(no full context subtracted), over the same scored rounds, overall and per round index.

    PYTHONPATH=. python bench/exploratory/no_comparator_auc.py DEMO_OUT SIGNAL_RUN_DIR

Results: docs/experiments/X1-another-cpu.md (the Intel SFT model)."""
import sys
from pathlib import Path
from saved_signal_run import b, load_saved_signal_run
cfg, tok, model, trajs, details = load_saved_signal_run(Path(sys.argv[1]), Path(sys.argv[2]))
rows = {"cmp": [], "nocmp_log": [], "nocmp_prob": []}
byround = {}
for t, rounds in zip(trajs, details):
    keeps = t.memory_keeps(tok) or [None] * len(rounds)
    for item, keep in zip(rounds, keeps):
        if keep is None or not item.objectives:
            continue
        nl = min(max(item.objective_logp_mem[j], -10.0) for j in item.objectives)
        npb = min(item.objective_p_mem[j] for j in item.objectives)
        for name, v in (("cmp", item.reward), ("nocmp_log", nl), ("nocmp_prob", npb)):
            rows[name].append((v, keep))
            byround.setdefault((name, item.round_index), []).append((v, keep))
for name, r in rows.items():
    print(name, "all", round(b.auc([v for v, _ in r], [k for _, k in r]) or -1, 3), len(r))
    for ri in sorted({ri for (n, ri) in byround if n == name}):
        rr = byround[(name, ri)]
        a = b.auc([v for v, _ in rr], [k for _, k in rr])
        print("   round", ri, None if a is None else round(a, 3), len(rr))
