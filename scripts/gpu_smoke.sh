#!/usr/bin/env bash
# GPU smoke test (one short run on a CUDA machine with vllm installed: pip install -e '.[dev,vllm]').
# Runs the vLLM backend test on the tiny model, the hf-vs-vLLM generation benchmark and one
# packed SFT step with flash-attention varlen when flash_attn is present. Prints what it skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv || { echo "no GPU visible"; exit 1; }
python -c "import vllm; print('vllm', vllm.__version__)" || echo "vllm missing: the vLLM checks will skip"
python -m pytest -q -rs tests/unit/test_infer.py -k "vllm or behaviour"
python scripts/bench_infer.py --samples 256 --max-tokens 64 --vllm --out /tmp/reasoner_bench_infer \
  || python scripts/bench_infer.py --samples 256 --max-tokens 64 --out /tmp/reasoner_bench_infer
python -m pytest -q tests/unit/test_sft.py tests/unit/data/test_packing.py
