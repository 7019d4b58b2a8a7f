"""Exploratory (issue 20): does the memory context's layout decide the signal? The signal benchmark's AUC
(keeps vs drops, k = 2) of min_j max(l_mem_j, -10) (no comparator) and of `retrieved_min_c10` (with the
benchmark's comparator) when mem_ctx is rendered in another layout, from a `bench/bench_signal.py` run's saved
rollouts. Layouts of the memory context (the answer template after each, the same ids):
  paper      prompt + <mem>_r                    (the library's: <mem>_r where round 1's always stands)
  blank      system, question, assistant "", user "", then <mem>_r   (where a later round's <mem> stands)
  echo       system, question, assistant <mem>_r, user "", then <mem>_r
Only the question and <mem>_r carry information in each.

    PYTHONPATH=. python bench/exploratory/mem_layout_auc.py DEMO_OUT SIGNAL_RUN_DIR

Results: docs/DEMO.md "Scoring-layout records in a layout of their own"; outputs `mem_layout_auc.txt` in
bench/signal_runs/intel_demo_sft/ and bench/signal_runs/intel_scoring_blank_s0_sft/.
"""
import re
import sys
from pathlib import Path
import torch
from saved_signal_run import b, load_saved_signal_run
from mempo.algo.contexts import default_objective_answer_builder
from mempo.rollout.chat import ChatFormat
cfg, tok, model, trajs, details = load_saved_signal_run(Path(sys.argv[1]), Path(sys.argv[2]))
chat = ChatFormat(tok, template=cfg.rollout.chat_template)
system = cfg.rollout.system_prompt


def objective_logps(ctx, answer_ids, labels, k):
    ids = torch.tensor([list(ctx) + list(answer_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(ctx) - 1:-1].float()
    lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(answer_ids)[:, None])[:, 0]
    return [float(lp[[i for i, j in enumerate(labels) if j == o]].mean()) for o in range(k)]


USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
rows, checked = {}, 0
for t, rounds in zip(trajs, details):
    keeps = t.memory_keeps(tok) or [None] * len(rounds)
    answer_ids, labels = default_objective_answer_builder(t.golds, tok)
    k = max(labels) + 1
    question = USER.search(tok.decode(t.prompt_ids, skip_special_tokens=False)).group(1)
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    assert chat.prompt_ids(msgs) == list(t.prompt_ids), "the question did not round-trip"
    for rnd, item, keep in zip(t.scored_rounds(), rounds, keeps):
        if keep is None or not item.objectives:
            continue
        s, e = rnd.mem_span
        mem_ids = list(t.response_ids[s:e])
        mem_text = tok.decode(mem_ids, skip_special_tokens=False)
        layouts = {
            "paper": list(t.prompt_ids) + mem_ids,
            "blank": chat.prompt_ids(msgs + [{"role": "assistant", "content": ""}, {"role": "user", "content": ""}]) + mem_ids,
            "echo": chat.prompt_ids(msgs + [{"role": "assistant", "content": mem_text}, {"role": "user", "content": ""}]) + mem_ids,
        }
        for name, ctx in layouts.items():
            lps = objective_logps(ctx, answer_ids, labels, k)
            if name == "paper" and checked < 5:  # the library's own numbers, reproduced
                assert all(abs(lps[j] - item.objective_logp_mem[j]) < 1e-3 for j in item.objectives), (lps, item.objective_logp_mem)
                checked += 1
            nocmp = min(max(lps[j], -10.0) for j in item.objectives)
            cmp_ = min(min(max(lps[j] - item.objective_logp_cmp[j], -10.0), 10.0) for j in item.objectives)
            for label, v in ((name + " nocmp", nocmp), (name + " cmp", cmp_)):
                rows.setdefault((label, "all"), []).append((v, keep))
                rows.setdefault((label, f"round {item.round_index}"), []).append((v, keep))
for (label, part), r in sorted(rows.items()):
    a = b.auc([v for v, _ in r], [kk for _, kk in r])
    med_k = sorted(v for v, kk in r if kk)[len([1 for _, kk in r if kk]) // 2] if any(kk for _, kk in r) else None
    print(f"{label:14s} {part:8s} AUC {None if a is None else round(a, 3)}  n={len(r)}  median keeps {med_k if med_k is None else round(med_k, 2)}")
