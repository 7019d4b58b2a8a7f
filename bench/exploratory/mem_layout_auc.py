"""Exploratory (issue 20): does the memory context's layout decide the signal? The signal benchmark's AUC
(keeps vs drops, k = 2) of min_j max(l_mem_j, -10) (no comparator) and of `retrieved_min_c10` (with the
benchmark's comparator) when mem_ctx is rendered in another layout, from a `bench/bench_signal.py` run's saved
rollouts. Layouts of the memory context (the answer template after each, the same ids):
  paper      prompt + <mem>_r                    (the library's: <mem>_r where round 1's always stands)
  blank      system, question, assistant "", user "", then <mem>_r   (where a later round's <mem> stands)
  echo       system, question, assistant <mem>_r, user "", then <mem>_r
Only the question and <mem>_r carry information in each.

    PYTHONPATH=. python bench/exploratory/mem_layout_auc.py DEMO_OUT SIGNAL_RUN_DIR

Results: docs/experiments/T10-blank-layout-records.md; outputs `mem_layout_auc.txt` in
bench/signal_runs/intel_demo_sft/ and bench/signal_runs/intel_scoring_blank_s0_sft/.
"""
import dataclasses
import re
import statistics
import sys
from pathlib import Path
from saved_signal_run import b, load_saved_signal_run
from mempo.algo.contexts import scoring_requests
from mempo.protocol.grammar import answer_template_text
from mempo.rollout.chat import ChatFormat
from mempo.scoring import score
cfg, tok, model, trajs, details = load_saved_signal_run(Path(sys.argv[1]), Path(sys.argv[2]))
chat = ChatFormat(tok, template=cfg.rollout.chat_template)
USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
LAYOUTS = ("paper", "blank", "echo")


def layout_requests(t):
    """The library's scoring request of trajectory t (`scoring_requests`, per objective, the definition's
    comparator) once per layout, only mem_ctx re-rendered (the same answer ids and comparator ends)."""
    request = scoring_requests([t], tok, comparator=cfg.scoring.comparator, per_objective=True,
                               template=answer_template_text(cfg.scoring.answer_template))[0]
    question = USER.search(tok.decode(t.prompt_ids, skip_special_tokens=False)).group(1)
    msgs = [{"role": "system", "content": cfg.rollout.system_prompt}, {"role": "user", "content": question}]
    assert chat.prompt_ids(msgs) == list(t.prompt_ids), "the question did not round-trip"
    blank = chat.prompt_ids(msgs + [{"role": "assistant", "content": ""}, {"role": "user", "content": ""}])
    out = {"paper": request}
    for name in ("blank", "echo"):
        rounds = []
        for rnd, scored in zip(t.scored_rounds(), request.rounds):
            mem_ids = list(t.response_ids[rnd.mem_span[0]:rnd.mem_span[1]])
            head = blank if name == "blank" else chat.prompt_ids(msgs + [
                {"role": "assistant", "content": tok.decode(mem_ids, skip_special_tokens=False)},
                {"role": "user", "content": ""}])
            rounds.append(dataclasses.replace(scored, mem_ctx_ids=head + mem_ids))
        out[name] = dataclasses.replace(request, rounds=rounds)
    return out


rows = {}
for t, rounds in zip(trajs, details):
    keeps = t.memory_keeps(tok) or [None] * len(rounds)
    requests = layout_requests(t)
    results = {name: score(model, [requests[name]], "reference", threshold=None)[0] for name in LAYOUTS}
    for r, (item, keep) in enumerate(zip(rounds, keeps)):
        if keep is None or not item.objectives:
            continue
        for name in LAYOUTS:
            lps = results[name].objective_mean_logp_mem[r]
            nocmp = min(max(lps[j], -10.0) for j in item.objectives)
            cmp_ = min(min(max(lps[j] - item.objective_logp_cmp[j], -10.0), 10.0) for j in item.objectives)
            for label, v in ((name + " nocmp", nocmp), (name + " cmp", cmp_)):
                rows.setdefault((label, "all"), []).append((v, keep))
                rows.setdefault((label, f"round {item.round_index}"), []).append((v, keep))
for (label, part), r in sorted(rows.items()):
    a = b.auc([v for v, _ in r], [kk for _, kk in r])
    kept = [v for v, kk in r if kk]
    med_k = statistics.median_high(kept) if kept else None
    print(f"{label:14s} {part:8s} AUC {None if a is None else round(a, 3)}  n={len(r)}  "
          f"median keeps {med_k if med_k is None else round(med_k, 2)}")
