# Settings shared by the paper's oat runs on one GPU node (sourced by the scripts beside it).
#
#   PYTHON  the interpreter (default: python), with dppo_oat installed with its [oat] extra (docs/engines/oat.md)
#   MODEL   the model (each script has the paper's)
#   SEED    the run's seed (default 42)
#   WANDB   1 to also log to wandb, project dppo (default 0: the run directory only; wandb needs `wandb login` or
#           WANDB_API_KEY first)
#
# Every script takes --gpus N (default: as many as CUDA_VISIBLE_DEVICES lists, else 8) and sizes the per-device batches
# from it, as Gem's and oat's example scripts do (GRADIENT_BATCH_SIZE / N_GPU). Any oat or DPPO flag given after a
# script's own arguments overrides the script's; --dry-run prints the resolved plan and launches nothing.
set -euo pipefail

TRAIN=(${PYTHON:-python} -m dppo_oat.train --engine oat)
NODE_FLAGS=(
    --collocate --vllm_sleep --vllm_gpu_ratio 0.45 --enable_prefix_caching
    --zero_stage 2 --gradient_checkpointing
    --learning_rate 0.000001 --lr_scheduler constant --lr_warmup_ratio 0
    --temperature 1.0 --top_p 1.0 --top_k -1 --critic_type drgrpo
    --seed "${SEED:-42}" --save_steps 100 --max_save_num 30
)
if [[ ${WANDB:-0} != 0 ]]; then NODE_FLAGS+=(--use_wb --wb_project dppo); fi

# gpus_of ARGS...: the value of the last --gpus in ARGS; default: as many as CUDA_VISIBLE_DEVICES lists, else 8
# (oat starts an actor and a learner on every GPU that CUDA_VISIBLE_DEVICES lists)
gpus_of() {
    local gpus=8 visible
    if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
        IFS=, read -ra visible <<< "$CUDA_VISIBLE_DEVICES"
        gpus=${#visible[@]}
    fi
    while [[ $# -gt 0 ]]; do
        case $1 in
            --gpus) gpus=${2:?--gpus needs a value}; shift ;;
            --gpus=*) gpus=${1#--gpus=} ;;
        esac
        shift
    done
    if ! [[ $gpus =~ ^[1-9][0-9]*$ ]]; then echo "--gpus must be a positive integer, got '$gpus'" >&2; exit 2; fi
    echo "$gpus"
}

# per_device TOTAL GPUS: TOTAL split over GPUS devices (refused unless it divides evenly)
per_device() {
    if (( $1 % $2 )); then echo "$1 does not split evenly over --gpus $2 (use 1, 2, 4 or 8)" >&2; exit 2; fi
    echo $(( $1 / $2 ))
}

# sanity_test_flags GPUS: the paper's sanity-test setting (app:sanity_test: DeepSeek-R1-Distill-Qwen-1.5B on MATH,
# 64 prompts × 8 samples per rollout in minibatches of 128, so 4 gradient steps per rollout; 8k context; AIME
# evaluation) as oat flags in the array SANITY_FLAGS, sized for GPUS devices; a rollout that does not split over
# them stops the script in one line (the assignment, not an argument, runs per_device, so set -e sees it fail)
sanity_test_flags() {
    local samples=512 per_gpu
    per_gpu=$(per_device $samples "$1")
    SANITY_FLAGS=(
        --pretrain "${MODEL:-deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B}" --gpus "$1"
        --env_ids "local-math:${SANITY_SET:-math_lvl3to5_8k:train}" --prompt_template chat --num_samples 8
        --advantage_mode drgrpo
        --rollout_batch_size $samples --rollout_batch_size_per_device "$per_gpu"
        --pi_buffer_maxlen_per_device "$per_gpu"
        --train_batch_size 128 --train_batch_size_per_device 1 --num_ppo_epochs 1
        --prompt_max_length 1024 --generate_max_length 8000 --max_model_len 9024
        --eval_env_ids local-math:evaluation_suite:aime --num_eval_seeds 0 --eval_n 32
        --eval_temperature 0.6 --eval_top_p 0.95
        --eval_steps 10 --eval_generate_max_length 8000
        --max_train 200000
    )
}

# trust_region_flags NAME: the paper's Gem/math comparison runs DPPO-Binary-TV with δ = 0.2 (other presets: defaults)
trust_region_flags() {
    if [[ $1 == dppo_binary_tv ]]; then
        echo "--trust_region dppo_binary_tv --tr_delta 0.2"
    else
        echo "--trust_region $1"
    fi
}
