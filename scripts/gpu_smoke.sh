#!/usr/bin/env bash
# One short call on a lent GPU (no internet, torch only assumed): the hardware contracts of
# docs/hardware.md checked on the device (scripts/gpu_smoke.py), one JSON report in $OUT (the
# device tool's folder that comes back) or ./gpu_smoke.json.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv || echo "nvidia-smi absent"
python scripts/gpu_smoke.py --device "${DEVICE:-cuda}" --out "${OUT:-.}/gpu_smoke.json"
