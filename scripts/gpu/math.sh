#!/usr/bin/env bash
# The paper's math experiment (app:extended_models_tasks): OctoThinker-3B-Hybrid-Base on MATH with oat's own math
# RL example (examples/math_rl.sh in the oat repository: 128 prompts × 8 samples per round, minibatches of 128
# samples, lr 1e-6 constant), with only the trust region changed; Avg@32 on every AIME and AMC problem.
#
#   DPPO_MATH_DATA=/path/to/math bash scripts/gpu/math.sh                # DPPO-Binary-TV (δ = 0.2), 8 GPUs
#   DPPO_MATH_DATA=/path/to/math bash scripts/gpu/math.sh ppo --gpus 4   # the PPO-ratio baseline on 4 GPUs
#
# DPPO_MATH_DATA holds save_to_disk sets or JSONL files (rows problem/answer or input/gt_answer) as oat lays them out:
# the DatasetDicts train/math_lvl3to5_8k (splits train, eval) and evaluation_suite (aime, amc, ...). Each split of a
# DatasetDict becomes local-math:<folder>:<split> (envs/README.md): training reads local-math:math_lvl3to5_8k:train.
source "$(dirname "$0")/node.sh"

: "${DPPO_MATH_DATA:?set DPPO_MATH_DATA to the folder of the math datasets}"
trust_region=dppo_binary_tv
if [[ $# -gt 0 && $1 != -* ]]; then trust_region=$1; shift; fi
gpus=$(gpus_of "$@")
samples=1024  # oat: 128 prompts × 8 samples per learning round
per_gpu=$(per_device $samples "$gpus")  # an assignment: a refusal stops the script (set -e)

exec "${TRAIN[@]}" "${NODE_FLAGS[@]}" $(trust_region_flags "$trust_region") \
    --pretrain "${MODEL:-OctoThinker/OctoThinker-3B-Hybrid-Base}" --gpus "$gpus" \
    --env_ids local-math:math_lvl3to5_8k:train --prompt_template qwen3_general --num_samples 8 --advantage_mode drgrpo \
    --rollout_batch_size $samples --rollout_batch_size_per_device "$per_gpu" \
    --pi_buffer_maxlen_per_device "$per_gpu" \
    --train_batch_size 128 --train_batch_size_per_device 1 --num_ppo_epochs 1 \
    --prompt_max_length 1024 --generate_max_length 4096 --max_model_len 5120 \
    --eval_env_ids local-math:evaluation_suite:aime local-math:evaluation_suite:amc --num_eval_seeds 0 --eval_n 32 \
    --eval_steps 16 --eval_temperature 0.6 --eval_top_p 0.95 --eval_generate_max_length 4096 \
    --max_train 1000000 --wb_run_name "math-${trust_region//_/-}" "$@"
