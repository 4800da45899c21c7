#!/usr/bin/env bash
# The paper's math experiment (OctoThinker-3B-Hybrid-Base on MATH, one node of 8 GPUs), Avg@32 on AIME and AMC.
#
#   DPPO_MATH_DATA=/path/to/math bash scripts/gpu/math.sh            # DPPO-Binary-TV (δ = 0.2)
#   DPPO_MATH_DATA=/path/to/math bash scripts/gpu/math.sh ppo        # the PPO-ratio baseline
#
# DPPO_MATH_DATA holds save_to_disk sets or JSONL files (rows problem/answer or input/gt_answer), e.g.
# train/math_lvl3to5_8k and evaluation_suite/{aime,amc}; each becomes local-math:<name>.
source "$(dirname "$0")/node.sh"

: "${DPPO_MATH_DATA:?set DPPO_MATH_DATA to the folder of the math datasets}"
trust_region=dppo_binary_tv
if [[ $# -gt 0 && $1 != -* ]]; then trust_region=$1; shift; fi

exec "${TRAIN[@]}" "${NODE_FLAGS[@]}" $(trust_region_flags "$trust_region") \
    --pretrain "${MODEL:-OctoThinker/OctoThinker-3B-Hybrid-Base}" \
    --env_ids local-math:math_lvl3to5_8k --prompt_template qwen3_general --num_samples 8 \
    --eval_env_ids local-math:aime,local-math:amc --num_eval_seeds 32 --eval_n 32 \
    --rollout_batch_size 128 --rollout_batch_size_per_device 16 --pi_buffer_maxlen_per_device 16 \
    --train_batch_size 128 --train_batch_size_per_device 1 --num_ppo_epochs 2 \
    --prompt_max_length 1024 --generate_max_length 3000 --max_model_len 4096 \
    --eval_steps 16 --eval_generate_max_length 3000 \
    --max_train 65000 --wb_run_name "math-${trust_region//_/-}" "$@"
