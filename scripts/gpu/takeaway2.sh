#!/usr/bin/env bash
# Takeaway 2 where the CPU study cannot play it (docs/cpu-study.md): the paper's sanity-test setting (sec:stability,
# app:sanity_test: DeepSeek-R1-Distill-Qwen-1.5B on MATH, 64 prompts × 8 samples per rollout, 4 gradient steps per
# rollout, lr 1e-6, bf16 training beside a vLLM rollout engine, whose kernels give the real engine mismatch), with
# each μ-anchored DPPO mask against its recomputed-anchor twin, MiniRL and PG-IS, on several seeds, so the anchors'
# contrast is paired by seed as the CPU study's is. With the mask's halves as methods
# (dppo_binary_kl_neg dppo_binary_kl_pos) it asks the CPU mechanism's question at scale.
#
#   DPPO_MATH_DATA=/path/to/math bash scripts/gpu/takeaway2.sh                                   # 6 methods × 3 seeds
#   DPPO_MATH_DATA=/path/to/math SEEDS="1 2" bash scripts/gpu/takeaway2.sh dppo_binary_kl dppo_binary_kl_recompute
#   DPPO_MATH_DATA=/path/to/math bash scripts/gpu/takeaway2.sh dppo_binary_kl_neg dppo_binary_kl_pos --gpus 4
#   DPPO_MATH_DATA=/path/to/math bash scripts/gpu/takeaway2.sh pg_is --dry-run                  # the plan only
#
# SEEDS: the seeds each method runs with (default "1 2 3"); every other setting is scripts/gpu/sanity_test.sh's.
source "$(dirname "$0")/node.sh"

: "${DPPO_MATH_DATA:?set DPPO_MATH_DATA to the folder of the math datasets}"
methods=()
while [[ $# -gt 0 && $1 != -* ]]; do methods+=("$1"); shift; done
if [[ ${#methods[@]} -eq 0 ]]; then
    methods=(dppo_binary_kl dppo_binary_kl_recompute dppo_binary_tv dppo_binary_tv_recompute minirl pg_is)
fi
read -ra seeds <<< "${SEEDS:-1 2 3}"
gpus=$(gpus_of "$@")
sanity_test_flags "$gpus"  # SANITY_FLAGS, sanity_test.sh's setting; refuses a rollout that does not split

for seed in "${seeds[@]}"; do
    for method in "${methods[@]}"; do
        "${TRAIN[@]}" "${NODE_FLAGS[@]}" "${SANITY_FLAGS[@]}" --seed "$seed" --trust_region "$method" \
            --wb_run_name "takeaway2-${method//_/-}-s${seed}" "$@"
    done
done
