#!/usr/bin/env bash
# The CPU quickstart: the whole pipeline on a tiny model built from scratch, on synthetic data.
# Usage: bash quickstart.sh [RUN_DIR] [recipe overrides...]
#   (default runs/quickstart, in the folder it is run from: a clone or any other; about 6 minutes
#   on 2 cores, the time left printed after each stage; rerun to skip finished stages)
# The recipe is the one shipped in the package (configs/quickstart/recipe.yaml in a clone), so
# this runs from an installed package too; `reasoner cp quickstart DIR` copies it out to edit.
set -euo pipefail
RUN=${1:-runs/quickstart}
shift || true
reasoner run quickstart run_dir="$RUN" "$@"
