#!/usr/bin/env bash
# The CPU quickstart: the pipeline on a tiny model built from scratch, on synthetic data.
# Usage: bash scripts/quickstart.sh [RUN_DIR]   (default runs/quickstart; ~9 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/quickstart}
Q=configs/quickstart
reasoner data synth $Q/data_synth.yaml output_dir="$RUN/data"
reasoner model tiny $Q/tiny_model.yaml output_dir="$RUN/tiny-init" corpus="[$RUN/data/sft]"
reasoner sft $Q/sft.yaml model.name_or_path="$RUN/tiny-init" data.path="$RUN/data/sft" output_dir="$RUN/sft"
reasoner eval bench $Q/eval.yaml model.name_or_path="$RUN/sft/final" --data "$RUN/data/test_problems" --out "$RUN/eval/sft"
reasoner infer $Q/infer.yaml model.name_or_path="$RUN/sft/final" data.path="$RUN/data/train_problems" output_dir="$RUN/samples"
reasoner verify $Q/verify.yaml input_dir="$RUN/samples" output_dir="$RUN/verified"
reasoner train-offline $Q/train_offline.yaml model.name_or_path="$RUN/sft/final" input_dir="$RUN/verified" output_dir="$RUN/rl"
reasoner eval bench $Q/eval.yaml model.name_or_path="$RUN/rl/final" --data "$RUN/data/test_problems" --out "$RUN/eval/rl"
reasoner eval compare "$RUN/eval/sft" "$RUN/eval/rl" --out "$RUN/compare"
