#!/usr/bin/env bash
# The GPU check in one command, from a fresh checkout on a stock CUDA image (Python 3.12, torch with CUDA,
# transformers; no gem-llm, tyro, reasoning-gym, math-verify): installs .whl/ (scripts/gpu/device_wheels.sh, run
# where pip reaches the index) beside the image's torch, then runs each step below, each appending JSON rows to
# $OUT_DIR/<bench>_<gpu>.jsonl (gpu: h100 for "NVIDIA H100 80GB HBM3"), stamped with the commit, the GPU's name and
# the torch and CUDA versions (scripts/gpu/device_rows.py). docs/gpu.md is the runbook.
#
#   bash scripts/gpu/device_check.sh                      # every step, on the GPU
#   bash scripts/gpu/device_check.sh rollout fused-head   # some steps: shaped-run oat-lora oat-learner tests
#                                                         #   rollout-ops rollout learner fused-head default-run
#   BUDGET=540 bash scripts/gpu/device_check.sh           # stop after 540 s: what is done keeps its rows
#   bash scripts/gpu/device_check.sh --smoke              # the same pipeline on the CPU at tiny sizes (minutes)
#
# Steps, in the order they run: shaped-run (the ~100M policy, --warm-start.shape qwen3-100m, warm-started on the GPU
# once, then short RL runs at the default --lr by shape, one per seed in SHAPED_SEEDS and lr in SHAPED_LRS:
# shaped_run, a row per run; on the CPU only when named, a 100M policy being slow there), oat-lora (the oat-learner
# step's bench with LoRA adapters of rank 16 on both learners, one timed pair: the learner's memory under LoRA beside
# oat-learner's without: oat_learner_step; on the CPU only when named), oat-learner
# (scripts/bench/oat_learner_step.py: oat's PPO learner and DPPO's on oat under DeepSpeed ZeRO-2 in bf16 at
# Qwen3-1.7B's shape, FusedAdam JIT-compiled by the device's nvcc, then DPPO's at micro-batch 4; its import
# stand-ins are in tests/oat/import_stand_ins: oat_learner_step; on the CPU only when named, with oat installed:
# make test-oat's environment), tests (pytest -m gpu: gpu_tests), rollout-ops (scripts/bench/rollout_ops.py: the operations one
# default-run rollout dispatches and where its host time goes: rollout_ops), rollout (scripts/bench/rollout.py: the
# generator against generate and the decode roofline, in CUDA graphs that sample at the ~100M policy and at Qwen3-1.7B's
# shape, then in graphs of the forward alone and eagerly: rollout), learner (scripts/bench/learner_mfu.py: tokens/s and
# MFU of the update: learner_mfu), fused-head (scripts/bench/learner_memory.py at V 151,936, H 2,048 / 4,096, 8k / 16k
# response tokens: learner_memory), default-run (python -m dppo_oat.train $RUN_FLAGS: wall time and held-out success
# before → after: default_run). A step that fails is reported in one line (its log has the rest) and the next one
# runs; the exit status is 1 when any failed, was stopped or skipped.
#
#   OUT_DIR      where the rows go (default docs/bench; with --smoke runs/device-check-smoke)
#   LOG_DIR      each step's full output and the default run's folder (default runs/device-check,
#                runs/device-check-smoke/logs)
#   WHEELS       the folder of wheels to install (default .whl, scripts/gpu/device_wheels.sh --steps ... fetches
#                what the steps named import)
#   SITE         where WHEELS is installed, first on PYTHONPATH (default /tmp/dppo-site); torch is never touched.
#                The install is skipped when the packages already import (FORCE_INSTALL=1 installs anyway)
#   PYTHON       the interpreter that holds torch (default python3)
#   DPPO_COMMIT  the commit the rows name, for a copy of the checkout without its .git
#   SMOKE=1      as --smoke
#   SHAPED_SEEDS the shaped-run step's RL seeds (default "0 1 2"; they share one warm-started policy)
#   SHAPED_LRS   its RL learning rates, each run at every seed (default "default": the rule by shape, no --lr)
#   BUDGET       seconds the steps may take, counted from the start (default 0: no limit), for a time-limited GPU
#                session: each step runs in what is left and is stopped (SIGTERM, then SIGKILL 30 s later) when it
#                runs out (a run of the local engine then checkpoints and still writes the row of a stopped run);
#                the steps after it are reported as skipped. The device and install checks are never stopped. A
#                budgeted step runs in a process group of its own: Ctrl-C stops the check and its step
set -uo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"  # for the budgeted steps' children, after the cd below
cd "$(dirname "$0")/../.."
ROOT=$PWD

# The default run's flags (the GPU run; add e.g. --warm-start.shape qwen3-100m for a larger policy where the engine
# has it), and the smoke run's, which only use flags every version of the engine has.
RUN_FLAGS=(--device cuda --dtype bfloat16)
SMOKE_RUN_FLAGS=(--device cpu --steps 2 --groups-per-step 2 --group-size 2 --eval-episodes 4)
# The LLM-shaped runs: a ~100M Qwen3 over a 32,768-entry vocabulary, warm-started on the GPU once (its warm-start lr
# is a first guess for that size; at most 2,000 supervised steps to bound its time, and its log warns when it ends
# below --warm-start.target-success), cached under LOG_DIR; then 20 RL steps per seed, held-out success at steps 0 and
# 20. Their RL --lr is the default by shape (8.3e-6 for this policy) unless SHAPED_LRS names others: at 3e-4, the
# tiny policy's rate, it collapsed after one step on an H200 (docs/gpu.md). 510 s on an H200 for 3 seeds: the first
# run 205 s with the 55 s warm start, the others 135 s and 141 s.
SHAPED_RUN_FLAGS=(--device cuda --dtype bfloat16 --warm-start.shape qwen3-100m --warm-start.lr 3e-4
                  --warm-start.max-steps 2000 --warm-start.check-every 200 --steps 20 --eval-every 20)
SHAPED_SEEDS=${SHAPED_SEEDS:-0 1 2} SHAPED_LRS=${SHAPED_LRS:-default}  # strings, so a budgeted step's child sees them
export SHAPED_SEEDS SHAPED_LRS
SMOKE_SHAPED_RUN_FLAGS=(--device cpu --warm-start.shape qwen3-100m --warm-start.demo-episodes 8
                        --warm-start.max-steps 1 --warm-start.check-every 1 --warm-start.check-episodes 2
                        --warm-start.batch-size 4 --steps 1 --groups-per-step 1 --group-size 2 --eval-episodes 2)
# The benchmarks' sizes: full (CUDA) and smoke (CPU, seconds).
OAT_LEARNER_FLAGS=(--device cuda --hidden 2048 --layers 28 --gradient-checkpointing --prompt-tokens 512
                   --response-tokens 1536 --micro-batch 1 --reps 3 --profile --resume-check)
SMOKE_OAT_LEARNER_FLAGS=(--device cpu --vocab 1000 --hidden 128 --layers 1 --sequences 4 --group-size 2 --minibatch 2
                         --micro-batch 1 --prompt-tokens 4 --response-tokens 8 --reps 1 --threads 1 --profile
                         --resume-check)
ROLLOUT_OPS_FLAGS=(--repeats 3 -- --device cuda --dtype bfloat16)
SMOKE_ROLLOUT_OPS_FLAGS=(--repeats 1 -- --device cpu --groups-per-step 2 --group-size 2)
ROLLOUT_FLAGS=(--model qwen3-100m --device cuda --dtype bfloat16 --batch 64 --prompt-tokens 256 --new-tokens 128
               --turns 2 --repeats 5)
ROLLOUT_1_7B_FLAGS=(--model qwen3-1.7b --repeats 3)  # after ROLLOUT_FLAGS (the later flags win)
SMOKE_ROLLOUT_FLAGS=(--model smoke --device cpu --batch 4 --prompt-tokens 16 --new-tokens 4 --turns 2 --repeats 1
                     --copy-mib 32)
LEARNER_FLAGS=(--shape qwen3-100m --device cuda --dtype bfloat16)
SMOKE_LEARNER_FLAGS=(--shape smoke --device cpu --dtype float32 --sequences 4 --prompt-tokens 8 --response-tokens 24
                     --minibatch 2 --updates 1 --peak-size 128)
FUSED_HEAD_SIZES=("2048 8192" "2048 16384" "4096 8192" "4096 16384")  # hidden, response tokens (V 151,936)
FUSED_HEAD_FLAGS=(--device cuda --dtype bfloat16 --rounds 2)
SMOKE_FUSED_HEAD_SIZES=("64 128")
SMOKE_FUSED_HEAD_FLAGS=(--device cpu --vocab 2048 --prompt 8 --rounds 1)
OAT_MICRO_BATCH_FLAGS=(--dppo-micro-batch 4 --reps 2)  # after OAT_LEARNER_FLAGS, without its profile and resume
OAT_LORA_FLAGS=(--lora-rank 16 --reps 1)  # after OAT_LEARNER_FLAGS (the later --reps wins); no profile, the
                                          # resume check kept (the learner's resume under LoRA)
STEPS=(shaped-run oat-lora oat-learner tests rollout-ops rollout learner fused-head default-run)
SMOKE_SKIPS=(oat-lora oat-learner shaped-run)  # steps --smoke runs only when named
# What the installed wheels must import: the local engine's steps, and oat's learner steps (OAT_LEARNER_STEPS in
# scripts/gpu/device_wheels.py, whose --steps fetches only what the named steps import)
LOCAL_IMPORTS="gem, tyro, reasoning_gym, math_verify, datasets, pylatexenc"
OAT_IMPORTS="tyro, datasets, deepspeed, tree, Levenshtein, msgspec, openai"

SMOKE=${SMOKE:-0}
BUDGET=${BUDGET:-0}
RUN_TAG=""  # train_run's folder names: the bench, this tag, the time
ONLY=""  # --only STEP: run that step's function alone (the budgeted child of run())
chosen=()
while [[ $# -gt 0 ]]; do
    arg=$1
    shift
    case $arg in
        --smoke) SMOKE=1 ;;
        --only) ONLY=${1:-}; shift
                [[ " ${STEPS[*]} " == *" $ONLY "* ]] || { echo "device_check: unknown step '$ONLY'" >&2; exit 2; } ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) [[ " ${STEPS[*]} " == *" $arg "* ]] || { echo "device_check: unknown step '$arg' (${STEPS[*]})" >&2; exit 2; }
           chosen+=("$arg") ;;
    esac
done
for list in SHAPED_SEEDS SHAPED_LRS; do
    [[ -n ${!list// /} ]] || { echo "device_check: $list names no value (unset it for the default)" >&2; exit 2; }
done
if [[ ${#chosen[@]} -eq 0 ]]; then
    for step in "${STEPS[@]}"; do
        [[ $SMOKE != 0 && " ${SMOKE_SKIPS[*]} " == *" $step "* ]] || chosen+=("$step")
    done
fi
PY=${PYTHON:-python3}
imports=()
for step in "${chosen[@]}"; do
    case $step in
        oat-lora|oat-learner) imports+=("$OAT_IMPORTS") ;;
        *) imports+=("$LOCAL_IMPORTS") ;;
    esac
done
IMPORTS="import $(printf '%s, ' "${imports[@]}" | tr -s ', ' '\n' | sort -u | paste -sd, - | sed 's/,/, /g')"
if [[ $SMOKE != 0 ]]; then
    ROLLOUT_OPS_FLAGS=("${SMOKE_ROLLOUT_OPS_FLAGS[@]}") OAT_LEARNER_FLAGS=("${SMOKE_OAT_LEARNER_FLAGS[@]}")
    DEVICE=cpu RUN_FLAGS=("${SMOKE_RUN_FLAGS[@]}") SHAPED_RUN_FLAGS=("${SMOKE_SHAPED_RUN_FLAGS[@]}") ROLLOUT_FLAGS=("${SMOKE_ROLLOUT_FLAGS[@]}")
    LEARNER_FLAGS=("${SMOKE_LEARNER_FLAGS[@]}") FUSED_HEAD_SIZES=("${SMOKE_FUSED_HEAD_SIZES[@]}")
    FUSED_HEAD_FLAGS=("${SMOKE_FUSED_HEAD_FLAGS[@]}")
    OUT_DIR=${OUT_DIR:-runs/device-check-smoke} LOG_DIR=${LOG_DIR:-runs/device-check-smoke/logs}
else
    DEVICE=cuda OUT_DIR=${OUT_DIR:-docs/bench} LOG_DIR=${LOG_DIR:-runs/device-check}
fi
export DPPO_SMOKE=$SMOKE
SITE=${SITE:-/tmp/dppo-site}
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export OUT_DIR LOG_DIR
mkdir -p "$OUT_DIR" "$LOG_DIR"
failed=() skipped=()

# report STEP RC SECONDS: one line per step; a failure names its log's last line and the log
report() {
    local log="$LOG_DIR/$1.log" last
    last=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-200)
    if [[ $2 == 0 ]]; then
        echo "device_check: $1 ok (${3}s): $last"
    elif [[ $BUDGET -gt 0 && ( $2 == 124 || $2 == 137 ) && $SECONDS -ge $BUDGET ]]; then
        failed+=("$1")
        echo "device_check: $1 STOPPED at the budget of ${BUDGET}s (${3}s): $last [log: $log]"
    else
        failed+=("$1")
        echo "device_check: $1 FAILED (exit $2, ${3}s): $last [log: $log]"
    fi
}

# run STEP FUNCTION: the function's output into the step's log, then its one-line report; under a BUDGET the step
# runs as a child of its own (--only STEP) that timeout stops when the budget runs out, with all its processes
run() {
    local start=$SECONDS left rc
    if [[ $BUDGET -le 0 || " ${STEPS[*]} " != *" $1 "* ]]; then  # the device and install checks: never stopped
        "$2" >"$LOG_DIR/$1.log" 2>&1
        rc=$?
    else
        left=$((BUDGET - SECONDS))
        if [[ $left -lt 5 ]]; then
            skipped+=("$1")
            echo "device_check: $1 skipped: the budget of ${BUDGET}s is spent"
            return
        fi
        timeout -k 30 "$left" bash "$SELF" --only "$1" $([[ $SMOKE != 0 ]] && echo --smoke) >"$LOG_DIR/$1.log" 2>&1 &
        CHILD=$!
        trap 'kill -TERM "$CHILD" 2>/dev/null; exit 130' INT TERM  # timeout's group does not get the terminal's ^C
        wait "$CHILD"
        rc=$?
        trap - INT TERM
    fi
    report "$1" $rc $((SECONDS - start))
}

# stamp BENCH FILE: the JSON rows of FILE, stamped, appended to $OUT_DIR/BENCH_<gpu>.jsonl
stamp() {
    "$PY" scripts/gpu/device_rows.py stamp --bench "$1" --device "$DEVICE" --out-dir "$OUT_DIR" <"$2"
}

install_wheels() {
    if [[ ${FORCE_INSTALL:-0} == 0 ]] && "$PY" -c "$IMPORTS" 2>/dev/null; then
        echo "the packages import already; install skipped"
        return 0
    fi
    shopt -s nullglob
    local wheels=${WHEELS:-.whl}
    local files=("$wheels"/*.whl "$wheels"/*.tar.gz) banned=("$wheels"/torch-* "$wheels"/nvidia_* "$wheels"/triton-*)
    shopt -u nullglob
    [[ ${#files[@]} -gt 0 ]] || { echo "no $wheels/: run scripts/gpu/device_wheels.sh where pip reaches the index"; return 1; }
    [[ ${#banned[@]} -eq 0 ]] || { echo "refused: $wheels/ holds ${banned[*]} (the image's torch stays)"; return 1; }
    local torch_before torch_after
    torch_before=$("$PY" -c "import torch; print(torch.__file__, torch.__version__)") || return 1
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --no-build-isolation --upgrade --ignore-requires-python \
        --target "$SITE" "${files[@]}" || return 1
    torch_after=$("$PY" -c "import torch; print(torch.__file__, torch.__version__)") || return 1
    [[ $torch_before == "$torch_after" ]] || { echo "torch moved: $torch_before → $torch_after"; return 1; }
    local missing
    missing=$("$PY" -c "$IMPORTS" 2>&1 >/dev/null) || { echo "the wheels in $wheels/ lack what these steps import:" \
        "run scripts/gpu/device_wheels.sh --steps ${chosen[*]} where pip reaches the index ($(tail -n 1 <<<"$missing"))"
        return 1; }
    echo "installed ${#files[@]} packages into $SITE beside $torch_after"
}

check_device() {
    "$PY" - "$DEVICE" <<'EOF'
import sys, torch
device = sys.argv[1]
if device == "cuda" and not torch.cuda.is_available():
    sys.exit("no CUDA device: run with --smoke on a machine without one")
name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
print(f"{name}; torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF
}

gpu_tests() {
    local files start=$SECONDS rc
    mapfile -t files < <(grep -rl --include='test_*.py' "pytest.mark.gpu" tests)
    [[ ${#files[@]} -gt 0 ]] || { echo "no test is marked gpu"; return 1; }
    "$PY" -m pytest -q -m gpu -p no:cacheprovider --junitxml "$LOG_DIR/gpu-tests.xml" "${files[@]}"
    rc=$?
    "$PY" scripts/gpu/device_rows.py junit --xml "$LOG_DIR/gpu-tests.xml" --seconds $((SECONDS - start)) \
        >"$LOG_DIR/gpu-tests.json" && stamp gpu_tests "$LOG_DIR/gpu-tests.json" || return 1
    return $rc
}

# train_run BENCH FLAGS...: a local-engine run with FLAGS, in a folder of its own under LOG_DIR; its row (wall time,
# held-out success before → after) stamped as BENCH. A run the budget stops (SIGTERM: the run checkpoints and ends)
# still leaves a row, of a stopped run (the step it reached, its seconds per step), before the step reports STOPPED
train_run() {
    local bench=$1 name start=$SECONDS rc stopped=""
    shift
    name=$bench$RUN_TAG-$(date -u +%Y%m%dT%H%M%S)
    echo "python -m dppo_oat.train $*"
    trap 'stopped="by the check'"'"'s budget of ${BUDGET} s"' TERM  # handled once the run has ended
    "$PY" -m dppo_oat.train "$@" --runs-dir "$LOG_DIR" --run-name "$name"
    rc=$?
    trap - TERM
    [[ $rc == 0 || -n $stopped ]] || return $rc
    "$PY" scripts/gpu/device_rows.py default-run --run-dir "$LOG_DIR/$name" --seconds $((SECONDS - start)) \
        ${stopped:+--stopped "$stopped"} -- "$@" >"$LOG_DIR/$bench.json" && stamp "$bench" "$LOG_DIR/$bench.json"
    [[ -z $stopped ]] || return 124
}

default_run() { train_run default_run "${RUN_FLAGS[@]}"; }

# shaped_run: one run of SHAPED_RUN_FLAGS per learning rate and seed (a row each), the lrs outermost; a run the
# budget stops ends the step, one that fails is reported and the next one runs
shaped_run() {
    local lr seed rc=0 flags seeds lrs
    read -r -a seeds <<<"$SHAPED_SEEDS"
    read -r -a lrs <<<"$SHAPED_LRS"
    for lr in "${lrs[@]}"; do
        for seed in "${seeds[@]}"; do
            flags=("${SHAPED_RUN_FLAGS[@]}" --seed "$seed")
            [[ $lr == default ]] || flags+=(--lr "$lr")
            RUN_TAG="-lr$lr-s$seed" train_run shaped_run "${flags[@]}" --cache-dir "$LOG_DIR/policy-cache"
            case $? in
                0) ;;
                124) return 124 ;;
                *) echo "shaped-run: the run at lr $lr, seed $seed failed"; rc=1 ;;
            esac
        done
    done
    return $rc
}

rollout_ops() {
    "$PY" scripts/bench/rollout_ops.py "${ROLLOUT_OPS_FLAGS[@]}" >"$LOG_DIR/rollout-ops.json" \
        && stamp rollout_ops "$LOG_DIR/rollout-ops.json"
}

rollout_row() {  # NAME FLAGS...: one rollout row, stamped as soon as it is measured
    local name=$1
    shift
    "$PY" scripts/bench/rollout.py "$@" >"$LOG_DIR/$name.json" && stamp rollout "$LOG_DIR/$name.json"
}

# on a GPU, new rows first: graphs that sample (the ~100M policy, then Qwen3-1.7B's shape), graphs of the forward
# alone, the eager decode
rollout() {
    [[ $SMOKE == 1 ]] && { rollout_row rollout "${ROLLOUT_FLAGS[@]}"; return; }
    local rc=0
    rollout_row rollout-graphs "${ROLLOUT_FLAGS[@]}" --cuda-graphs || rc=1
    rollout_row rollout-1.7b "${ROLLOUT_FLAGS[@]}" "${ROLLOUT_1_7B_FLAGS[@]}" --cuda-graphs || rc=1
    rollout_row rollout-forward-graphs "${ROLLOUT_FLAGS[@]}" --cuda-graphs --graph-forward-only || rc=1
    rollout_row rollout "${ROLLOUT_FLAGS[@]}" || rc=1
    return $rc
}

# oat's learner step against DPPO's (profiled, with the resume check), then DPPO's at its own larger micro-batch
# (OAT_MICRO_BATCH_FLAGS: the memory its fused head saves, spent on fewer, larger micro-batches); DeepSpeed's JIT
# builds (FusedAdam) cached under LOG_DIR
oat_learner() {
    local flag flags=()
    export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$LOG_DIR/torch_extensions}
    "$PY" scripts/bench/oat_learner_step.py "${OAT_LEARNER_FLAGS[@]}" >"$LOG_DIR/oat-learner.json" \
        && stamp oat_learner_step "$LOG_DIR/oat-learner.json" || return 1
    [[ $SMOKE == 1 ]] && return 0
    for flag in "${OAT_LEARNER_FLAGS[@]}"; do [[ $flag == --profile || $flag == --resume-check ]] || flags+=("$flag"); done
    "$PY" scripts/bench/oat_learner_step.py "${flags[@]}" "${OAT_MICRO_BATCH_FLAGS[@]}" \
        >"$LOG_DIR/oat-learner-micro-batch.json" && stamp oat_learner_step "$LOG_DIR/oat-learner-micro-batch.json"
}

oat_lora() {
    local flag flags=()
    for flag in "${OAT_LEARNER_FLAGS[@]}"; do [[ $flag == --profile ]] || flags+=("$flag"); done
    TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$LOG_DIR/torch_extensions} \
        "$PY" scripts/bench/oat_learner_step.py "${flags[@]}" "${OAT_LORA_FLAGS[@]}" >"$LOG_DIR/oat-lora.json" \
        && stamp oat_learner_step "$LOG_DIR/oat-lora.json"
}

learner() {
    "$PY" scripts/bench/learner_mfu.py "${LEARNER_FLAGS[@]}" >"$LOG_DIR/learner.json" \
        && stamp learner_mfu "$LOG_DIR/learner.json"
}

fused_head() {
    local size hidden response rc=0
    : >"$LOG_DIR/fused-head.json"
    for size in "${FUSED_HEAD_SIZES[@]}"; do
        read -r hidden response <<<"$size"
        echo "hidden $hidden, $response response tokens"
        "$PY" scripts/bench/learner_memory.py "${FUSED_HEAD_FLAGS[@]}" --hidden "$hidden" --response-tokens "$response" \
            >>"$LOG_DIR/fused-head.json" || rc=1
    done
    stamp learner_memory "$LOG_DIR/fused-head.json" || rc=1
    return $rc
}

# step_function STEP: the function that runs STEP
step_function() {
    case $1 in
        oat-lora) echo oat_lora ;;
        oat-learner) echo oat_learner ;;
        tests) echo gpu_tests ;;
        default-run) echo default_run ;;
        shaped-run) echo shaped_run ;;
        rollout-ops) echo rollout_ops ;;
        rollout) echo rollout ;;
        learner) echo learner ;;
        fused-head) echo fused_head ;;
    esac
}

if [[ -n $ONLY ]]; then
    "$(step_function "$ONLY")"
    exit $?
fi
echo "device_check ($([[ $SMOKE != 0 ]] && echo "smoke, CPU" || echo "CUDA")): rows → $OUT_DIR, logs → $LOG_DIR$([[ $BUDGET -gt 0 ]] && echo ", budget ${BUDGET}s")"
run device check_device
run install install_wheels
for step in "${chosen[@]}"; do
    run "$step" "$(step_function "$step")"
done
if [[ ${#failed[@]} -gt 0 || ${#skipped[@]} -gt 0 ]]; then
    summary=()
    [[ ${#failed[@]} -gt 0 ]] && summary+=("${#failed[@]} step(s) failed: ${failed[*]}")
    [[ ${#skipped[@]} -gt 0 ]] && summary+=("skipped: ${skipped[*]}")
    echo "device_check: $(IFS=';'; echo "${summary[*]}" | sed 's/;/; /g')"
    exit 1
fi
echo "device_check: every step ok; rows in $OUT_DIR"
