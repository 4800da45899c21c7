#!/usr/bin/env bash
# Fetches into .whl/ (ignored by git) the wheels a stock CUDA image (Python 3.12, torch 2.11 with CUDA, transformers,
# no gem-llm) lacks for the local engine and its tests, one version each, pinned to the GPU node's lock; prints the
# list and the total size (at most 64 MiB). Run it where pip reaches the package index, then take .whl/ along to the
# GPU machine: scripts/gpu/device_check.sh installs it there beside the image's torch. docs/gpu.md has the runbook.
#
#   bash scripts/gpu/device_wheels.sh            # or: make gpu-wheels
#   PYTHON=python3.11 bash scripts/gpu/device_wheels.sh --dest /tmp/wheels
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python3}" scripts/gpu/device_wheels.py "$@"
