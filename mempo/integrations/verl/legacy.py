"""The legacy trainer's path (``trainer.use_v1=false``): ``ray_trainer.compute_advantage`` replaced by
`mempo.integrations.verl.estimator.compute_advantage`, which hands the memory fields of the batch
(the ``mempo_mem_*`` lists a mempo agent loop writes into ``non_tensor_batch``, or padded tensors)
to the "mempo" estimator and forwards every other estimator to verl's own function unchanged.

`RayPPOTrainer.fit` looks ``compute_advantage`` up in its module at call time, so replacing the
module attribute is enough; the plugin does it on import (`install`), in every process that imports
verl, the TaskRunner actor included. The legacy trainer takes one row per trajectory: no memory
context rows (the V1 trainer's ``mempo_sync`` does those). verl's V1 trainer imported
``compute_advantage`` by name before this runs, so V1 is not affected.
"""
from __future__ import annotations

from verl.trainer.ppo import ray_trainer

from mempo.integrations.verl.estimator import compute_advantage

__all__ = ["install", "is_installed", "patch_ray_trainer"]


def patch_ray_trainer() -> None:
    """Make `RayPPOTrainer.fit` use mempo's `compute_advantage` (idempotent; verl's own function is
    kept as ``ray_trainer._verl_compute_advantage``)."""
    if not hasattr(ray_trainer, "_verl_compute_advantage"):
        ray_trainer._verl_compute_advantage = ray_trainer.compute_advantage
        ray_trainer.compute_advantage = compute_advantage


def is_installed() -> bool:
    """Whether ``ray_trainer.compute_advantage`` is mempo's."""
    return ray_trainer.compute_advantage is compute_advantage


install = patch_ray_trainer
