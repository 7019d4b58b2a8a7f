"""What E8's exploratory probes share (name_probe, trained_subjects_probe, name_embeddings_probe): a run's
configuration, its synthetic world (no retriever), the subjects its evaluation holds out of training, the world's
people, and the SFT model a model directory holds."""
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from mempo.config import MempoConfig, load_config
from mempo.eval import held_out_of_training
from mempo.model.loading import load_model_dir
from mempo.synthetic.build import synthetic_world


class ProbeWorld(NamedTuple):
    cfg: MempoConfig
    world: Any
    held: frozenset[str]     # entity names no SFT or RL question asks about (`held_out_of_training`)
    people: frozenset[str]   # the names of the world's persons


def probe_world(config: Path, overrides: Sequence[str] = ()) -> ProbeWorld:
    """The run of `config` (a model directory's ``config.yaml``) with dotted `overrides`."""
    cfg = load_config(config, overrides)
    world = synthetic_world(cfg)
    people = frozenset(e.name for e in world.entities if e.kind == "person")
    return ProbeWorld(cfg, world, held_out_of_training(world, cfg), people)


def sft_model(model_dir: Path, cfg: MempoConfig) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) of `model_dir`/model_sft."""
    return load_model_dir(str(model_dir / "model_sft"), cfg.model.dtype)
