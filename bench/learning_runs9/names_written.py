"""Which person names a recipe's SFT trajectories write (the assistant's text: searches, memories, answers), split by
whether an evaluation question may ask about them (held out) or not: what E9's one change to E8's recipe does to SFT
data, and the demo's for comparison (docs/experiments/E9-ablation-execution-9.md). No training, no evaluation; the
splits are read only to know which names are held out. E8's and E9's recipes side by side, then the demo's:

    export PYTHONPATH=.; W=bench/learning_runs9
    python $W/names_written.py configs/demo_k8_e8.yaml > $W/smoke/names_e8.txt &
    python $W/names_written.py configs/demo_k8_e9.yaml > $W/smoke/names_e9.txt; wait
    python $W/names_written.py configs/demo.yaml > $W/smoke/names_demo.txt
"""
import sys
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from mempo.apps.tasks import synthetic_task
from mempo.config import MempoConfig, load_config
from mempo.eval import held_out_of_training
from mempo.synthetic.rename import _name_pattern


class SftData(NamedTuple):
    cfg: MempoConfig
    env: Any                 # the world and the tools over its retriever: the oracle searches
    held: frozenset[str]     # entity names no SFT or RL question asks about (`held_out_of_training`)
    cold: Any                # the task's cold start: the oracle trajectories SFT trains on


def sft_data(config: Path) -> SftData:
    """The SFT data of the recipe `config`, built as training builds it (no training, no evaluation)."""
    cfg = load_config(config, [])
    task = synthetic_task(cfg)
    env = task.build(cfg)
    held = held_out_of_training(env.world, cfg)
    return SftData(cfg, env, held, task.cold_start(cfg, env, held))


def main(argv):
    cfg, env, held, cold = sft_data(Path(argv[0]))
    persons = {e.name for e in env.world.entities if e.kind == "person"}
    pattern = _name_pattern(persons)
    written = Counter(m.group(1) for t in cold.trajectories for r in t.rounds for m in pattern.finditer(r.assistant))
    held_persons = persons & held
    held_written = set(written) & held
    trained_written = set(written) - held
    print(f"{argv[0]} (oracle_rename_pool {cfg.synthetic.oracle_rename_pool}): {len(cold.trajectories)} trajectories; "
          f"{len(persons)} persons, {len(held_persons)} held out.\n"
          f"  held-out persons SFT writes: {len(held_written)} of {len(held_persons)}, "
          f"{sum(written[n] for n in held_written)} occurrences\n"
          f"  other persons SFT writes: {len(trained_written)} of {len(persons - held_persons)}, "
          f"{sum(written[n] for n in trained_written)} occurrences", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
