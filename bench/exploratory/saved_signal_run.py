"""The shared setup of the exploratory signal scripts: a `bench/bench_signal.py` run's saved rollouts at one k,
the SFT model they came from, and `retrieved_min_c10`'s per-round details on them
(`bench_signal.definition_rewards`)."""
import sys
from pathlib import Path
from typing import Any, NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_signal as b  # noqa: E402
from mempo.config import load_config  # noqa: E402
from mempo.model.loading import pretrained_causal_lm, pretrained_tokenizer  # noqa: E402
from mempo.records.trajectory import read_trajectories_jsonl  # noqa: E402


class SavedSignalRun(NamedTuple):
    cfg: Any          # the demo output's configuration with `retrieved_min_c10`'s scoring
    tokenizer: Any
    model: Any        # <demo_out>/model_sft, eval mode
    trajectories: list
    details: list     # per trajectory, per scored round: `RoundMemoryReward`


def load_saved_signal_run(demo_out: Path, run: Path, threads: int = 2, k: int = 2) -> SavedSignalRun:
    torch.set_num_threads(threads)
    cfg = b.definition_config(load_config(demo_out / "config.yaml", []), b.DEFINITIONS["retrieved_min_c10"])
    tokenizer = pretrained_tokenizer(demo_out / "model_sft")
    model = pretrained_causal_lm(demo_out / "model_sft").eval()
    trajectories = read_trajectories_jsonl(run / f"rollouts_k{k}.jsonl")
    _, details = b.definition_rewards(model, tokenizer, trajectories, cfg)
    return SavedSignalRun(cfg, tokenizer, model, trajectories, details)
