#!/usr/bin/env bash
# Regenerates requirements/gpu-node-py310.txt, the lock of a GPU node (Python 3.10, Linux x86_64, CUDA), from
# requirements/gpu-node.in (this package with its oat extra). Runs anywhere: uv resolves for the node's Python and
# platform without installing anything. `make lock-gpu-node` runs it.
#   UV=path/to/uv            the uv to use (default: `uv` on PATH, else uv 0.13.9 installed into .venv-uv with pip)
#   EXCLUDE_NEWER=YYYY-MM-DD resolve as of that date (default: the lock's date below, so a rerun reproduces the lock;
#                            set a later date to move the lock forward, and update the default)
set -euo pipefail
cd "$(dirname "$0")/.."
EXCLUDE_NEWER=${EXCLUDE_NEWER:-2026-11-23}
if [ -z "${UV:-}" ]; then
  if command -v uv >/dev/null; then UV=uv; else
    [ -x .venv-uv/bin/uv ] || { python3 -m venv .venv-uv && .venv-uv/bin/pip install --quiet "uv==0.13.9"; }
    UV=.venv-uv/bin/uv
  fi
fi
args=(requirements/gpu-node.in --python-version 3.10 --python-platform x86_64-unknown-linux-gnu
      --exclude-newer "$EXCLUDE_NEWER" --no-emit-package dppo-oat)
# The lock's header names the command: `make lock-gpu-node`, and the uv command it runs.
"$UV" pip compile "${args[@]}" --quiet -o requirements/gpu-node-py310.txt \
  --custom-compile-command "make lock-gpu-node  # = uv pip compile ${args[*]}"
