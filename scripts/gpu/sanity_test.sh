#!/usr/bin/env bash
# The paper's sanity test (sec:stability, fig:sanity_test, app:sanity_test): DeepSeek-R1-Distill-Qwen-1.5B on MATH
# problems, 64 prompts × 8 samples per rollout, 4 gradient steps per rollout, lr 1e-6, bf16 training, 8k context,
# one run per method of the figure (the presets' defaults are the paper's: app:sanity_test_details).
#
#   DPPO_MATH_DATA=/path/to/math bash scripts/gpu/sanity_test.sh                        # every method, in turn
#   DPPO_MATH_DATA=/path/to/math bash scripts/gpu/sanity_test.sh pg_is dppo_binary_tv   # some of them
#   DPPO_MATH_DATA=/path/to/math bash scripts/gpu/sanity_test.sh pg_is --gpus 4        # methods, then oat flags
#
# The paper trains on 1,460 MATH problems the initial model is known to solve; point SANITY_SET at such a set
# (the local-math name of a set under DPPO_MATH_DATA, <folder>:<split> for a split of a DatasetDict, or a path).
# Default: math_lvl3to5_8k:train, unfiltered. Evaluation: evaluation_suite:aime (envs/README.md has the names).
source "$(dirname "$0")/node.sh"

: "${DPPO_MATH_DATA:?set DPPO_MATH_DATA to the folder of the math datasets}"
methods=()
while [[ $# -gt 0 && $1 != -* ]]; do methods+=("$1"); shift; done
if [[ ${#methods[@]} -eq 0 ]]; then
    methods=(pg_is cispo grpo_clip_higher minirl minirl_tis dppo_binary_tv dppo_binary_kl)
fi
gpus=$(gpus_of "$@")
sanity_test_flags "$gpus"  # SANITY_FLAGS; refuses a rollout that does not split over the GPUs

for method in "${methods[@]}"; do
    "${TRAIN[@]}" "${NODE_FLAGS[@]}" "${SANITY_FLAGS[@]}" --trust_region "$method" \
        --wb_run_name "sanity-${method//_/-}" "$@"
done
