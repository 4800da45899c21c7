#!/usr/bin/env bash
# The paper's Gem experiments (app:extended_models_tasks): Qwen3-1.7B-Base trained with Gem's own oat example
# scripts (examples/train_oat in the Gem repository), flag for flag, with only the trust region changed:
# DPPO-Binary-TV (δ = 0.2) or the PPO-ratio baseline (ε = 0.2). docs/engines/oat.md lists every deviation.
#
#   bash scripts/gpu/gem.sh sudoku                        # DPPO-Binary-TV on game:Sudoku-v0-easy, 8 GPUs
#   bash scripts/gpu/gem.sh arc1d ppo --gpus 1            # the PPO-ratio baseline on rg:arc_1d, one GPU
#   bash scripts/gpu/gem.sh sudoku --gpus 1 --dry-run     # print the plan, launch nothing
#   bash scripts/gpu/gem.sh sudoku --grpo-groups          # variant: GRPO groups of 8 episodes per seed
#
# Tasks: sudoku (game:Sudoku-v0-easy: Gem's game recipe, concat wrapper, γ = 0.9), arc1d (rg:arc_1d) and acre
# (rg:acre) (Gem's reasoning-gym recipe, γ = 1). Both recipes normalise returns over the learning batch (rebn, Gem's
# norm_return) with one episode per seed (num_samples 1). --grpo-groups instead plays 8 episodes per seed and uses
# the paper's Dr.GRPO group baseline, per turn index (for comparison; not the paper's setting).
source "$(dirname "$0")/node.sh"

task=${1:?usage: gem.sh sudoku|arc1d|acre [TRUST_REGION] [--gpus N] [--grpo-groups] [oat flags]}
shift
trust_region=dppo_binary_tv
if [[ $# -gt 0 && $1 != -* ]]; then trust_region=$1; shift; fi
variant=gem
args=()
for arg in "$@"; do
    if [[ $arg == --grpo-groups ]]; then variant=grpo-groups; else args+=("$arg"); fi
done
set -- "${args[@]+"${args[@]}"}"

# Gem plays 2 episodes at a time (num_envs 2). For multi-turn Sudoku that decides which turns a step's samples come
# from, so it is kept. A single-turn task's episodes are independent draws however many are played together, so
# there every episode of an actor step goes to vLLM in one batch (the default of --groups_per_step): only throughput
# changes (2 prompts per generate call would serialise vLLM into 64 calls per step on 1 GPU).
case $task in
    sudoku) task_flags=(--env_ids game:Sudoku-v0-easy --prompt_template qwen3_game --wrappers concat --gamma 0.9
                        --groups_per_step 2) ;;
    arc1d) task_flags=(--env_ids rg:arc_1d --prompt_template qwen3_general --gamma 1.0) ;;
    acre) task_flags=(--env_ids rg:acre --prompt_template qwen3_general --gamma 1.0) ;;
    *) echo "gem.sh: unknown task '$task' (sudoku, arc1d or acre)" >&2; exit 2 ;;
esac

gpus=$(gpus_of "$@")
batch=128  # Gem's GRADIENT_BATCH_SIZE: turn samples per learning round, and per optimizer step
per_gpu=$(per_device $batch "$gpus")  # an assignment: a refusal stops the script (set -e)
if [[ $variant == gem ]]; then
    group_flags=(--num_samples 1 --advantage_mode rebn)  # Gem: norm_return
else
    group_flags=(--num_samples 8 --advantage_mode drgrpo --turn_baseline)
fi

exec "${TRAIN[@]}" "${NODE_FLAGS[@]}" $(trust_region_flags "$trust_region") \
    --pretrain "${MODEL:-Qwen/Qwen3-1.7B-Base}" --gpus "$gpus" "${task_flags[@]}" "${group_flags[@]}" \
    --rollout_batch_size "$batch" --rollout_batch_size_per_device "$per_gpu" \
    --pi_buffer_maxlen_per_device "$per_gpu" \
    --train_batch_size "$batch" --train_batch_size_per_device 1 --num_ppo_epochs 2 \
    --max_model_len 12800 --prompt_max_length 8704 --generate_max_length 4096 \
    --eval_steps 20 --num_eval_seeds 64 --eval_n 1 --eval_temperature 0.6 --eval_top_p 0.95 \
    --eval_generate_max_length 4096 \
    --max_train 65000 --wb_run_name "$task-${trust_region//_/-}$([[ $variant == gem ]] || echo -grpo-groups)" "$@"
