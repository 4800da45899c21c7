#!/usr/bin/env bash
# The paper's Gem experiments (Qwen3-1.7B-Base on one node of 8 GPUs): DPPO-Binary-TV (δ = 0.2) vs PPO-ratio (ε = 0.2).
#
#   bash scripts/gpu/gem.sh sudoku                 # DPPO-Binary-TV on game:Sudoku-v0-easy (multi-turn)
#   bash scripts/gpu/gem.sh arc1d ppo              # the PPO-ratio baseline on rg:arc_1d
#   bash scripts/gpu/gem.sh acre dppo_binary_tv --gpus 4 --rollout_batch_size_per_device 32   # overrides
#
# Tasks: sudoku (game:Sudoku-v0-easy), arc1d (rg:arc_1d), acre (rg:acre). Methods: any trust-region preset.
# GRPO groups of 8 episodes from one seed, Dr.GRPO advantages and loss aggregation, per-turn returns with γ = 1.
source "$(dirname "$0")/node.sh"

task=${1:?usage: gem.sh sudoku|arc1d|acre [TRUST_REGION] [oat flags]}
shift
trust_region=dppo_binary_tv
if [[ $# -gt 0 && $1 != -* ]]; then trust_region=$1; shift; fi
case $task in
    sudoku) env_id=game:Sudoku-v0-easy template=qwen3_game ;;
    arc1d) env_id=rg:arc_1d template=qwen3_general ;;
    acre) env_id=rg:acre template=qwen3_general ;;
    *) echo "gem.sh: unknown task '$task' (sudoku, arc1d or acre)" >&2; exit 2 ;;
esac

exec "${TRAIN[@]}" "${NODE_FLAGS[@]}" $(trust_region_flags "$trust_region") \
    --pretrain "${MODEL:-Qwen/Qwen3-1.7B-Base}" \
    --env_ids "$env_id" --prompt_template "$template" --gamma 1.0 --num_samples 8 \
    --rollout_batch_size 128 --rollout_batch_size_per_device 16 --pi_buffer_maxlen_per_device 16 \
    --train_batch_size 128 --train_batch_size_per_device 1 --num_ppo_epochs 2 \
    --prompt_max_length 2048 --generate_max_length 4096 --max_model_len 12800 \
    --eval_steps 20 --num_eval_seeds 64 --eval_n 4 --eval_generate_max_length 4096 \
    --max_train 65000 --wb_run_name "$task-${trust_region//_/-}" "$@"
