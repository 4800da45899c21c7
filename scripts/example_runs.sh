#!/usr/bin/env bash
# The example runs the notebooks read when neither DPPO_RUNS nor runs/ has any (notebooks/example_runs): real
# local-engine runs on Sudoku (the default `make train` settings with half the episodes per step and 24 steps, each
# rollout batch split into 4 minibatches so that the trust regions differ), DPPO-Binary-TV, GRPO-ClipHigher and
# CISPO with seeds 0 and 1, all from one shared warm start (--warm-start.seed 0), each with its tokens.jsonl.
# Checkpoints are deleted: the folder holds only what the notebooks read (a few MB).
#   usage: bash scripts/example_runs.sh            (or: make example-runs; STEPS=60 for longer runs)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=notebooks/example_runs
STEPS=${STEPS:-24}
for algo in dppo_binary_tv grpo_clip_higher cispo; do
  for seed in 0 1; do
    name="$algo-s$seed"
    rm -rf "${OUT:?}/$name"
    "$PY" -m dppo_oat.train --trust-region "$algo" --seed "$seed" --warm-start.seed 0 --steps "$STEPS" \
      --groups-per-step 8 --minibatches-per-rollout 4 --eval-every 8 --eval-episodes 64 --token-samples 32 --runs-dir "$OUT" --run-name "$name"
    rm -f "$OUT/$name/checkpoint.pt"
  done
done
