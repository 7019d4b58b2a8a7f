"""mempo.train: the training infrastructure of MemPO. Import from the modules (this package imports
none of them, so ``import mempo.train`` stays without torch):

* `mempo.train.trainer`: `train` (the RL loop), `build_run`, the run directory.
* `mempo.train.step`: one MemPO step (`train_step`).
* `mempo.train.actor`: `Actor` (FSDP2 when distributed), `init_distributed`, `shutdown_distributed`.
* `mempo.train.losses`: `policy_loss`, `kl_penalty`, `agg_loss`, `entropy_from_logits`.
* `mempo.train.sft`: the SFT cold start.
* `mempo.train.checkpoint`: `save_checkpoint`, `load_checkpoint`, `latest_checkpoint`,
  `verify_checkpoint`, `resume_checkpoint`, `CheckpointError`.
* `mempo.train.logging`: `MetricsLogger`, `StageTimer`, `progress`; `metric_names`: the metric keys.

The configuration is `mempo.config` (standard library + PyYAML only).
"""
