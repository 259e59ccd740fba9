#!/usr/bin/env bash
# mcadvantage's credit (VinePPO by default) in verl's V1 trainer on GSM8K, one GPU node (not run in CI: needs CUDA,
# vLLM and Ray).
#   pip install 'mcadvantage[verl]' 'verl[vllm]'      # verl's GPU stack, on the GPU machine
#   GSM8K as verl's parquet files (verl's examples/data_preprocess/gsm8k.py writes them) in $DATA
# Usage: bash examples/verl/run_mc_v1_gsm8k.sh [extra hydra overrides, e.g. mcadvantage.advantage_estimator=anchor]
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA="${DATA:-$HOME/data/gsm8k}"
MODEL="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"
python examples/verl/mc_trainer_v1.py \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
  data.train_batch_size=64 data.max_prompt_length=512 data.max_response_length=512 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.use_kl_loss=false \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
  actor_rollout_ref.rollout.prompt_length=1024 \
  trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_training_steps="${STEPS:-2}" \
  trainer.logger='["console"]' trainer.val_before_train=false \
  "$@"
