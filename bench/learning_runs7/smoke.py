"""Execution 7's smoke of the recipe (docs/experiments/E7-ablation-execution-7.md): the demo's stages of
configs/demo_k8.yaml with COPY copy-warm-up and SFT_STEPS SFT steps (timed per step; 2 threads), the model saved as
a demo output (OUT/demo), a greedy evaluation of 4 validation episodes at k = 8 (timed); OUT/smoke_sft.json. A
pipeline check: a model of 50 SFT steps is not one of the recipe. Then the two benchmarks on it:

    PYTHONPATH=. python bench/learning_runs7/smoke.py scratch/k8_smoke 50 50
    python bench/bench_learning.py --demo-out scratch/k8_smoke/demo --out scratch/k8_smoke/learning --seeds 0 \\
        --steps 3 --episodes 4 --variants grpo --best retrieved_min_c10 --ks 2 4 8 --threads 1
    python bench/bench_signal.py --demo-out scratch/k8_smoke/demo --out scratch/k8_smoke/signal --questions 2 \\
        --samples 4 --ks 4 8 --definitions retrieved_min_c10 complete_min_c10 --threads 1 eval.split=validation

Outputs of 2026-12-04: smoke/.
"""
import dataclasses
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from mempo.apps import demo
from mempo.config import dump_config
from mempo.eval import eval_episodes, evaluate, held_out_of_training
from mempo.utils.allocator import keep_freed_memory


def main(argv):
    spec = importlib.util.spec_from_file_location("sft_seeds", "tools/sft_seeds.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out, copy_steps, sft_steps = Path(argv[0]), int(argv[1]), int(argv[2])
    overrides = [f"synthetic.copy_warmup_steps={copy_steps}", f"sft.steps={sft_steps}", "eval.validation_episodes=4",
                 "eval.split=validation", *argv[3:]]
    keep_freed_memory()
    cfg = tool.seed_config(0, overrides, Path("configs/demo_k8.yaml"))
    facts = {"threads": demo._set_threads(2), "load_start": os.getloadavg(), "overrides": overrides}

    def timed(name, stage, *args):
        began = time.perf_counter()
        value = stage(*args).value
        facts[name] = time.perf_counter() - began
        return value
    env = timed("world_s", demo._world_stage, cfg)
    cold = timed("oracle_s", demo._oracle_stage, cfg, env, held_out_of_training(env.world, cfg), False)
    tok = timed("tokenizer_s", demo._tokenizer_stage, cfg, env.world, cold.trajectories)
    model = demo._model_stage(cfg, tok).value
    timed("copy_s", demo._copy_stage, cfg, model, tok, env.world)
    facts["copy_s_per_step"] = facts["copy_s"] / copy_steps
    with tempfile.TemporaryDirectory() as tmp:
        sft = timed("sft_s", demo._sft_stage, cfg, model, tok, cold.sft_records, Path(tmp))
    facts["sft_s_per_step"] = facts["sft_s"] / sft_steps
    facts["sft"] = {k: sft[k] for k in ("steps", "tokens", "examples", "epochs", "seconds", "last_loss") if k in sft}
    (out / "demo").mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "demo" / "config.yaml")
    demo._save_model(out / "demo" / "model_sft", model, tok)
    val = eval_episodes(env.world, cfg)
    eval_cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, closed_book=False))
    began = time.perf_counter()
    report = evaluate(model, tok, {8: val[8]}, env.retriever, eval_cfg, label="smoke", log=lambda _: None,
                      show_progress=False)
    facts["eval_k8_s_per_episode"] = (time.perf_counter() - began) / len(val[8])
    row = report.rows[0]
    facts["eval_k8"] = {"em": row.em, "turns": row.mean_turns, "finish": row.finish_reasons,
                        "generated_tokens_per_episode": row.generated_tokens_per_episode,
                        "prompt_tokens_per_episode": row.prompt_tokens_per_episode}
    facts["load_end"] = os.getloadavg()
    print(json.dumps(facts, indent=1))
    (out / "smoke_sft.json").write_text(json.dumps(facts, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
