"""The configuration of every command: one typed tree of dataclasses (`mempo.config.schema`), loaded
from YAML plus dotted overrides (`mempo.config.loader`; values converted by `mempo.config.coerce`).

This package imports only the standard library, PyYAML, `mempo.utils` and the protocol constants it
uses as defaults (`mempo.protocol.memory`); no torch, no transformers.
"""
from mempo.config.coerce import ConfigError, coerce_value
from mempo.config.loader import (
    apply_overrides, config_from_dict, config_to_dict, dump_config, load_config, read_yaml_mapping, split_overrides,
)
from mempo.config.schema import (
    KL_ESTIMATORS, LOSS_AGG_MODES, ROLLOUT_IS_LEVELS, ActorConfig, AlgorithmConfig, DataConfig, SyntheticConfig,
    EnvConfig, EvalConfig, MempoConfig, ModelConfig, RolloutConfig, ScoringConfig, SFTConfig, TrainerConfig,
    flash_attention_requested,
)

__all__ = [
    "ConfigError", "ModelConfig", "DataConfig", "EnvConfig", "RolloutConfig", "ScoringConfig",
    "AlgorithmConfig", "ActorConfig", "TrainerConfig", "EvalConfig", "SFTConfig", "SyntheticConfig", "MempoConfig",
    "load_config", "read_yaml_mapping", "config_from_dict", "config_to_dict", "dump_config", "apply_overrides",
    "split_overrides", "coerce_value",
    "LOSS_AGG_MODES", "KL_ESTIMATORS", "ROLLOUT_IS_LEVELS", "flash_attention_requested",
]
