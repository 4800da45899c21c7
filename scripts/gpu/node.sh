# Settings shared by the paper's oat runs on one node of 8 GPUs (sourced by the scripts beside it).
# Every oat flag can be overridden by passing it again after the script's own arguments.
#   PYTHON  the interpreter (default: python), with dppo_oat installed with its [oat] extra (README "On a GPU node")
set -euo pipefail

TRAIN=(${PYTHON:-python} -m dppo_oat.train --engine oat)
NODE_FLAGS=(
    --gpus 8 --collocate --vllm_sleep --vllm_gpu_ratio 0.45 --enable_prefix_caching
    --zero_stage 2 --gradient_checkpointing
    --learning_rate 0.000001 --lr_scheduler constant --lr_warmup_ratio 0
    --temperature 1.0 --top_p 1.0 --top_k -1
    --advantage_mode drgrpo --critic_type drgrpo
    --save_steps -1 --use_wb --wb_project dppo
)

# trust_region_flags NAME: the paper's Gem/math comparison runs DPPO-Binary-TV with δ = 0.2 (other presets: defaults)
trust_region_flags() {
    if [[ $1 == dppo_binary_tv ]]; then
        echo "--trust_region dppo_binary_tv --tr_delta 0.2"
    else
        echo "--trust_region $1"
    fi
}
