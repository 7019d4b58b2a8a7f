"""Execution 7's probe of the recipe before any SFT (docs/experiments/E7-ablation-execution-7.md): the world, its
test and validation splits, the oracle's cold start and the tokenizer of a config; how many names are not one id;
the teacher's per-round and per-episode token counts at each k (what the rollout limits must hold). No model.

    PYTHONPATH=. python bench/learning_runs7/probe.py configs/demo_k8.yaml [overrides ...]
    (world seeds 1-5: synthetic.world_seed=S synthetic.oracle_drop_seed=S synthetic.model_seed=S)

Outputs of 2026-12-04 for world seeds 0-5: smoke/probe.txt.
"""
import statistics
import sys
import time
from pathlib import Path

from mempo.apps import demo
from mempo.eval import eval_episodes, held_out_of_training
from mempo.synthetic.heldout import held_out_subjects


def main(argv):
    cfg = demo.load_demo_config(Path(argv[0]), argv[1:])
    began = time.perf_counter()
    env = demo._world_stage(cfg).value
    test, val = eval_episodes(env.world, cfg, split="test"), eval_episodes(env.world, cfg, split="validation")
    held = held_out_of_training(env.world, cfg)
    persons = sum(e.kind == "person" for e in env.world.entities)
    print(f"world {len(env.world.entities)} entities, {persons} persons; held out {len(held)} (test "
          f"{len(held_out_subjects(test))}, validation {len(held_out_subjects(val))}); left {persons - len(held)}")
    cold = demo._oracle_stage(cfg, env, held, False)
    print(cold.summary[:400], f"{time.perf_counter() - began:.0f} s")
    tok = demo._tokenizer_stage(cfg, env.world, cold.value.trajectories).value
    multi = [e.name for e in env.world.entities if len(tok.encode(" " + e.name, add_special_tokens=False)) != 1]
    print(f"tokenizer {len(tok)} ids; names not one id: {len(multi)} of {len(env.world.entities)} {multi[:10]}")
    print(f"held-out names not one id: {len(set(multi) & held)} of {len(held)}")

    def ids(text):
        return len(tok.encode(text, add_special_tokens=False))
    by_k = {}
    for t in cold.value.trajectories:
        by_k.setdefault(len(t.golds), []).append(t)
    for k, ts in sorted(by_k.items()):
        gen = sorted(ids(r.assistant) for t in ts for r in t.rounds)
        tool = [ids(r.tool_text) for t in ts for r in t.rounds if r.tool_text is not None]
        resp = [ids(t.response_text) for t in ts]
        full = [ids(t.prompt) + ids(t.response_text) for t in ts]
        rounds = [t.num_rounds for t in ts]
        print(f"k={k}: {len(ts)} traj; rounds mean {statistics.fmean(rounds):.1f} max {max(rounds)}; gen/round max "
              f"{gen[-1]} p99 {gen[int(.99 * len(gen))]}; tool/round max {max(tool, default=0)}; response max "
              f"{max(resp)} mean {statistics.fmean(resp):.0f}; prompt+response max {max(full)}")
    trajectories = cold.value.trajectories
    print(f"SFT trajectories {len(trajectories)}, rounds {sum(t.num_rounds for t in trajectories)}, ~tokens "
          f"(prompt+response) {sum(ids(t.prompt) + ids(t.response_text) for t in trajectories)}")
    print(f"{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
