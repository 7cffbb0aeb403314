#!/usr/bin/env bash
# The CPU quickstart: the whole pipeline on a tiny model built from scratch, on synthetic data.
# Usage: bash scripts/quickstart.sh [RUN_DIR]   (default runs/quickstart)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/quickstart}
reasoner data synth configs/quickstart/data_synth.yaml output_dir="$RUN/data"
reasoner model tiny configs/quickstart/tiny_model.yaml output_dir="$RUN/tiny-init" corpus="[$RUN/data/sft]"
