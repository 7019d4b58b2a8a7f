#!/usr/bin/env bash
# MemPO with verl 0.9.1 (no fork): Qwen2.5-3B-Instruct, 8 GPUs on one node, SGLang rollout, V1 trainer.
#
#   pip install 'verl[sglang]==0.9.1' 'mempo[verl]'   # verl's own SGLang pins (sglang 0.5.12, torch 2.11)
#   python -m mempo.integrations.verl           # lists the registered estimator / loops / trainer
#   mempo serve-retriever --corpus wiki.jsonl --index-dir wiki-index/ --port 8000 &
#   python -m mempo.integrations.verl.data --train nq_train.jsonl --val nq_dev.jsonl --out data/
#   bash examples/verl/run_qwen2.5-3b_sglang.sh [more hydra overrides]
#
# What mempo adds: the agent loops (agents.yaml next to this script: <mem> protocol, search/access,
# teacher scoring through the SGLang servers' prompt_logprobs), the trainer "mempo_sync" (verl's GRPO +
# the pooled memory advantage on <mem> spans). Lengths: a trajectory of 8 rounds x 512 new tokens plus
# tool results must fit rollout.response_length; the loop stops at it (finish reason token_budget).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATA="${DATA:-data}"
MODEL="${MODEL:-Qwen/Qwen2.5-3B-Instruct}"
AGENTS="${AGENTS:-$HERE/agents.yaml}"

python -m mempo.integrations.verl   # fails (exit 1) when a part did not register

python -m verl.trainer.main_ppo \
    trainer.use_v1=true \
    trainer.v1.trainer_mode=mempo_sync \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=false \
    +algorithm.mempo.memory_weight=1.0 \
    +algorithm.mempo.epsilon=1e-6 \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/val.parquet" \
    data.train_batch_size=128 \
    data.max_prompt_length=1024 \
    data.max_response_length=6144 \
    data.return_raw_chat=true \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=true \
    actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.fsdp_config.param_offload=false \
    actor_rollout_ref.rollout.name=sglang \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.prompt_length=1024 \
    actor_rollout_ref.rollout.response_length=6144 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$AGENTS" \
    actor_rollout_ref.rollout.agent.default_agent_loop=mempo_agent \
    actor_rollout_ref.rollout.val_kwargs.temperature=0 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.project_name=mempo \
    trainer.experiment_name=qwen2.5-3b-mempo-sglang \
    trainer.logger='[console]' \
    trainer.save_freq=50 \
    trainer.test_freq=25 \
    trainer.total_epochs=1 \
    "$@"
