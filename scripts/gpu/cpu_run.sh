#!/usr/bin/env bash
# A short oat run on this machine's CPU (`make oat-cpu-run`; docs/engines/oat.md, "On a laptop"): the GPU node's
# program (oat's actor and learner, DeepSpeed, vLLM, launchpad) on the shipped tiny Sudoku policy, one actor and one
# learner (--on_cpu), multi-turn compact Sudoku, DPPO-Binary-TV, 6 learning rounds of 8 turn samples, a resumable
# checkpoint every round; about a minute on 2 cores. Any flag after the script's own overrides it.
#
#   PYTHON=.venv-oat/bin/python bash scripts/gpu/cpu_run.sh                 # runs, writes oat-output-cpu/<run>_<time>
#   PYTHON=.venv-oat/bin/python bash scripts/gpu/cpu_run.sh --max_train 96  # longer
#
# Ctrl-C or SIGTERM ends it with one line: after a checkpoint, the command that resumes the run.
#   PYTHON  the interpreter (default: python), in the oat engine's environment (make setup-oat)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
policy=$(ls -d "$root"/dppo_oat/policies/tiny-game_Sudoku-v0-easy-compact-wrong-*/ | head -1)
exec "${PYTHON:-python}" -m dppo_oat.train --engine oat --on_cpu --gpus 1 --collocate --zero_stage 2 \
    --pretrain "${policy%/}" --env_ids game:Sudoku-v0-easy-compact-wrong --prompt_template plain --max_turns 3 \
    --gamma 1.0 --num_samples 4 --groups_per_step 6 --trust_region dppo_binary_tv \
    --rollout_batch_size 8 --rollout_batch_size_per_device 8 --pi_buffer_maxlen_per_device 8 \
    --train_batch_size 4 --train_batch_size_per_device 2 --max_train 48 --num_ppo_epochs 1 \
    --learning_rate 1e-3 --lr_scheduler constant --lr_warmup_ratio 0 \
    --prompt_max_length 1600 --generate_max_length 12 --max_model_len 2048 \
    --eval_steps 1000 --num_eval_seeds 4 --eval_n 2 --eval_generate_max_length 12 \
    --save_path oat-output-cpu --save_steps 1000 --checkpoint_every 1 --shm_size_mb 256 --seed 42 \
    --no-bf16 --no-flash_attn --seeded_sampling --wb_run_name sudoku-cpu "$@"
