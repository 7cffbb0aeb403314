#!/usr/bin/env bash
# The CPU quickstart: the whole pipeline on a tiny model built from scratch, on synthetic data.
# Usage: bash scripts/quickstart.sh [RUN_DIR] [recipe overrides...]
#   (default runs/quickstart; about 6 minutes on 2 cores, the time left printed after each stage;
#   rerun to skip finished stages)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/quickstart}
shift || true
reasoner run configs/quickstart/recipe.yaml run_dir="$RUN" "$@"
