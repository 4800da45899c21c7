#!/usr/bin/env bash
# A core trust region on verl across GPU nodes: the paper's "Dense Base" scaling run (app:scaling_details,
# tab:detailed_experimental_settings: Qwen3-8B-Base, prompts ≤ 1024 and responses ≤ 8000 tokens, 128 prompts × 8
# samples per step, minibatches of 32 prompts, lr 1e-6, temperature 1.0, C = 5; Avg@32 at temperature 0.7 and top-p
# 0.95 every 10 steps) on math, with any preset of dppo_oat.trust_region.PRESETS as verl's policy loss.
#
#  1. Every node: the same environment with verl's GPU stack and this package: pip install -e '.[verl]' (see
#     docs/engines/verl.md). The workers import dppo_oat.engines.verl through model.external_lib.
#  2. Data (once): python scripts/verl/prepare_math.py --out "$DATA" --train MATH_SET --test AIME_SET ...
#  3. Ray: `ray start --head` on the first node, `ray start --address=<first node>:6379` on the others.
#  4. On the first node:
#       DATA=/path/to/parquet NNODES=2 bash scripts/verl/math.sh                  # DPPO-Binary-TV, δ = 0.2, C = 5
#       DATA=... NNODES=2 bash scripts/verl/math.sh grpo_clip_higher              # the GRPO-ClipHigher baseline
#       DATA=... TR="delta=0.15 is_cap=inf" bash scripts/verl/math.sh dppo_binary_tv trainer.total_epochs=3
#
# The first argument is a preset (default dppo_binary_tv); the rest are Hydra overrides of verl's ppo_trainer config.
# TR (FIELD=VALUE ...) sets the trust region's numbers that verl's config carries (δ, ε_low, ε_high, C); by default
# the paper's scaling values for its presets, each preset's own otherwise. DRY_RUN=1 composes verl's config with every
# override and checks it (any machine: no GPU, no Ray), prints the command and launches nothing.
#
#   PYTHON         the interpreter with verl and dppo_oat (default: python)
#   MODEL          the model (default: Qwen/Qwen3-8B-Base)
#   NNODES         nodes in the Ray cluster (default 1); GPUS_PER_NODE (default 8)
#   WANDB          0: console logging only (default 1: also wandb, project dppo)
set -euo pipefail

PYTHON=${PYTHON:-python}
preset=dppo_binary_tv
if [[ $# -gt 0 && $1 != *=* ]]; then preset=$1; shift; fi
: "${DATA:?set DATA to the folder of train.parquet and test.parquet (scripts/verl/prepare_math.py)}"

# paper_fields PRESET: the scaling runs' numbers (δ_TV 0.2, δ_KL 0.05, ε_high 0.27, C = 5 for every method)
paper_fields() {
    case $1 in
        dppo_binary_tv) echo "delta=0.2 is_cap=5" ;;
        dppo_binary_kl) echo "delta=0.05 is_cap=5" ;;
        grpo_clip_higher) echo "eps_high=0.27 is_cap=5" ;;
        cispo) echo "is_cap=5" ;;
    esac
}

# The trust region's overrides: loss, δ/ε/C, bypass or decoupled mode, the adapter import (refused presets stop here)
read -r -a fields <<< "${TR-$(paper_fields "$preset")}"
trust_region=$("$PYTHON" -m dppo_oat.engines.verl overrides "$preset" "${fields[@]}")
mapfile -t TRUST_REGION <<< "$trust_region"

logger='["console","wandb"]'
if [[ ${WANDB:-1} == 0 ]]; then logger='["console"]'; fi

ARGS=(
    "${TRUST_REGION[@]}"
    trainer.use_v1=true
    algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=false algorithm.use_kl_in_reward=false
    data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet"
    data.train_batch_size=128 data.max_prompt_length=1024 data.max_response_length=8000
    data.filter_overlong_prompts=true data.truncation=error
    actor_rollout_ref.model.path="${MODEL:-Qwen/Qwen3-8B-Base}"
    actor_rollout_ref.model.use_remove_padding=true actor_rollout_ref.model.enable_gradient_checkpointing=true
    actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=32
    actor_rollout_ref.actor.ppo_epochs=1 actor_rollout_ref.actor.loss_agg_mode=token-mean
    actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=18432
    actor_rollout_ref.actor.use_kl_loss=false actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.actor.fsdp_config.param_offload=false actor_rollout_ref.actor.fsdp_config.optimizer_offload=false
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8
    actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 actor_rollout_ref.rollout.top_k=-1
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    actor_rollout_ref.rollout.val_kwargs.do_sample=true actor_rollout_ref.rollout.val_kwargs.n=32
    actor_rollout_ref.rollout.val_kwargs.temperature=0.7 actor_rollout_ref.rollout.val_kwargs.top_p=0.95
    trainer.nnodes="${NNODES:-1}" trainer.n_gpus_per_node="${GPUS_PER_NODE:-8}"
    trainer.logger="$logger" trainer.project_name=dppo trainer.experiment_name="math-dense-${preset//_/-}"
    trainer.test_freq=10 trainer.save_freq=50 trainer.total_epochs=20 trainer.val_before_train=true
    "$@"
)

# Compose verl's config with exactly these overrides and check the loss, its numbers and its anchor (CPU, no Ray)
"$PYTHON" -m dppo_oat.engines.verl check "${ARGS[@]}"
if [[ ${DRY_RUN:-0} != 0 ]]; then
    printf '%q ' "$PYTHON" -m verl.trainer.main_ppo "${ARGS[@]}"
    echo
    exit 0
fi
exec "$PYTHON" -m verl.trainer.main_ppo "${ARGS[@]}"
