"""The SFT probe behind docs/experiments/D01-learnable-task.md's table: a synthetic world with the
small-world options, oracle trajectories, a BPE tokenizer, a Qwen2 from scratch, an optional copy
warm-up, SFT, then greedy evaluation under the memory context (64 held-out episodes at k = 2 by
default).

    python tools/sft_probe.py NAME '{"world": {...}, "shape": {...}, "copy_steps": 700, "sft_steps": 1200}'

Every key of P below can be overridden by the JSON argument; results are appended to
scratch/results.jsonl and the model is saved to scratch/models/NAME (scratch/ is git-ignored).
THREADS sets torch's threads (default 1)."""
import dataclasses
import json
import os
import sys
import time

import torch

from mempo.apps.demo import load_demo_config
from mempo.synthetic.world import World
from mempo.env.bm25 import BM25Retriever
from mempo.env.build import build_tools
from mempo.eval import evaluate
from mempo.synthetic.oracle import run_oracle, OracleAgent
from mempo.algo.contexts import DEFAULT_ANSWER_TEMPLATE
from mempo.model.builtin import default_corpus_texts, train_tokenizer, tiny_model
from mempo.synthetic.copy_warmup import copy_warmup
from mempo.train.sft import run_sft

torch.set_num_threads(int(os.environ.get("THREADS", "1")))

name = sys.argv[1]
P = dict(world=dict(seed=0, num_entities=1000,
                    relations=["birthplace", "birth_year", "alma_mater", "country", "capital", "mayor", "location"],
                    names="short", article_style="facts", article_fillers=[0, 0], chronicles=False,
                    chronicle_fraction=0.0, distractor_ratio=0.0, question_hops=1, prompt_style="compact"),
    topk=1, doc_chars=600, vocab=4096, tok_docs=5000, model_size="small", shape={}, tie=True, max_pos=2048,
    model_seed=0, think="minimal", memory_style="facts", query_style="question", sft_ks=[1, 2, 3, 4], sft_episodes=512,
    drop=0.0, keep="all",
    sft_seconds=None, sft_steps=700, lr=1e-3, warmup=0.05, batch_tokens=2048, schedule="cosine", plw=1.0, sft_seed=0,
    eval_ks=[2], eval_n=64, eval_max_turns=8, max_new=96,
    copy_steps=0, copy_lr=1e-3, copy_rows=32)
P.update(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
log = {"name": name, "params": P, "load_start": open("/proc/loadavg").read().split()[:3]}
t0 = time.time()
wk = dict(P["world"])
wk["article_fillers"] = tuple(wk["article_fillers"])
wk["relations"] = tuple(wk["relations"])
world = World.generate(**wk)
retr = BM25Retriever.build(world.documents())
cfg = load_demo_config()
cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, topk=P["topk"], doc_chars=P["doc_chars"]),
                          eval=dataclasses.replace(cfg.eval, objectives=list(P["eval_ks"]), episodes=P["eval_n"],
                                                   max_turns=P["eval_max_turns"]),
                          rollout=dataclasses.replace(cfg.rollout, max_new_tokens_per_round=P["max_new"]),
                          sft=dataclasses.replace(cfg.sft, steps=P["sft_steps"], lr=P["lr"], warmup=P["warmup"],
                                                  batch_tokens=P["batch_tokens"], schedule=P["schedule"],
                                                  prompt_loss_weight=P["plw"], max_seconds=P["sft_seconds"]))
tools = build_tools(cfg, retr)
eval_eps = {k: world.episodes(k, P["eval_n"], seed=10_000 + k) for k in P["eval_ks"]}
eval_q = {q for eps in eval_eps.values() for e in eps for q in e.questions}
agent = OracleAgent(think=P["think"], drop_fact_prob=P["drop"], drop_seed=0, answer_template=DEFAULT_ANSWER_TEMPLATE,
                    memory_style=P["memory_style"], query_style=P["query_style"])
drawn = [e for k in P["sft_ks"] for e in world.episodes(k, P["sft_episodes"], seed=20_000 + k)]
sft_eps = [e for e in drawn if not set(e.questions) & eval_q]
trajs = [run_oracle(e, tools, policy="memory", agent=agent) for e in sft_eps]
if P["keep"] == "correct":
    trajs = [t for t in trajs if t.score["score"] == 1.0]
log["sft_trajs"] = len(trajs)
log["oracle_em"] = sum(t.score["em"] for t in trajs) / max(1, len(trajs))
texts = default_corpus_texts(world, limit=P["tok_docs"])
for t in trajs:
    texts += [t.prompt, t.response_text]
tok = train_tokenizer(texts, P["vocab"])
sp = [tok.encode(" " + e.name, add_special_tokens=False) for e in world.entities]
log["single_token_share"] = sum(len(x) == 1 for x in sp) / len(sp)
model = tiny_model(tok, P["model_size"], P["model_seed"], max_position_embeddings=P["max_pos"],
                   tie_word_embeddings=P["tie"], **P["shape"])
log["params_M"] = sum(p.numel() for p in model.parameters()) / 1e6
log["setup_s"] = time.time() - t0
print("setup", {k: log[k] for k in ("sft_trajs", "oracle_em", "single_token_share", "params_M", "setup_s")}, flush=True)
if P["copy_steps"]:
    pool = sorted({x[0] for x in sp if len(x) == 1})
    warm = copy_warmup(model, pool, steps=P["copy_steps"], lr=P["copy_lr"], rows=P["copy_rows"], seed=P["model_seed"])
    log["copy"] = {"s": warm.seconds, "curve": [round(v, 2) for v in warm.losses[49::50]]}
    print("copy", log["copy"], flush=True)
ts = time.time()
res = run_sft(cfg, model, tok, trajs, seed=P["sft_seed"])
log["sft"] = {k: res[k] for k in ("steps", "tokens", "epochs", "seconds", "first_loss", "last_loss")}
log["loss_curve"] = [round(sum(res["losses"][i:i+50]) / len(res["losses"][i:i+50]), 3)
                     for i in range(0, len(res["losses"]), 50)]
print("sft", log["sft"], log["loss_curve"], flush=True)
if P.get("save", True):
    model.save_pretrained(f"scratch/models/{name}")
    tok.save_pretrained(f"scratch/models/{name}")
t3 = time.time()
rep = evaluate(model, tok, eval_eps, retr, cfg, show_progress=False, log=lambda s: None, keep_trajectories=True)
log["eval_s"] = time.time() - t3
log["eval"] = {str(r.objectives): dict(em=r.em, f1=r.f1, format=r.format_rate, turns=r.mean_turns) for r in rep.rows}
trs = list(rep.trajectories.values())[0][:2]
log["load_end"] = open("/proc/loadavg").read().split()[:3]
log["total_s"] = time.time() - t0
os.makedirs("scratch", exist_ok=True)
with open("scratch/results.jsonl", "a") as fh:
    fh.write(json.dumps(log) + "\n")
print(json.dumps({k: log[k] for k in ("name", "eval", "eval_s", "total_s", "load_start", "load_end")}))
for t in trs:
    print("-----\n" + tok.decode(t.response_ids)[:1200])
