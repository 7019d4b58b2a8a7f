"""mempo.train: the training infrastructure of MemPO.

Configuration (`mempo.config`, standard library + PyYAML only): `MempoConfig` and its
sections, `load_config`, `dump_config`, `ConfigError`.
Losses (`mempo.train.losses`): `policy_loss`, `kl_penalty`, `agg_loss`, `entropy_from_logits`.
Actor (`mempo.train.actor`): `Actor` (FSDP2 when distributed), `init_distributed`.
Checkpoints (`mempo.train.checkpoint`): `save_checkpoint`, `load_checkpoint`, `latest_checkpoint`,
`verify_checkpoint`, `resume_checkpoint`, `CheckpointError`.
Logging (`mempo.train.logging`): `MetricsLogger`, `StageTimer`, `progress`.

Names load on first use, so ``import mempo.train`` and ``import mempo.config`` stay light
(no torch, no transformers).
"""
from __future__ import annotations

from mempo._lazy import lazy_exports

_EXPORTS = {
    "ConfigError": "config", "MempoConfig": "config", "ModelConfig": "config", "DataConfig": "config",
    "EnvConfig": "config", "RolloutConfig": "config", "ScoringConfig": "config", "AlgorithmConfig": "config",
    "ActorConfig": "config", "TrainerConfig": "config", "EvalConfig": "config", "SFTConfig": "config",
    "DemoConfig": "config", "load_config": "config",
    "config_from_dict": "config", "config_to_dict": "config", "dump_config": "config",
    "policy_loss": "losses", "kl_penalty": "losses", "agg_loss": "losses", "masked_mean": "losses",
    "entropy_from_logits": "losses",
    "Actor": "actor", "LogProbs": "actor", "DistInfo": "actor", "init_distributed": "actor",
    "shutdown_distributed": "actor",
    "save_checkpoint": "checkpoint", "load_checkpoint": "checkpoint", "latest_checkpoint": "checkpoint",
    "list_checkpoints": "checkpoint", "prune_checkpoints": "checkpoint", "capture_rng_state": "checkpoint",
    "restore_rng_state": "checkpoint", "CheckpointState": "checkpoint", "CheckpointError": "checkpoint",
    "verify_checkpoint": "checkpoint", "resume_checkpoint": "checkpoint",
    "MetricsLogger": "logging", "StageTimer": "logging", "progress": "logging", "read_metrics": "logging",
}

__all__, __getattr__, __dir__ = lazy_exports('mempo.train', _EXPORTS, globals())
