#!/usr/bin/env bash
# 2/4 HF -> Megatron-mcore weights (TP 1, PP 1)
# written by: reasoner export mindspeed configs/quickstart/sft.yaml
# run from the root of a MindSpeed-LLM checkout, after sourcing the Ascend toolkit:
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh
set -euo pipefail
HF_DIR=${HF_DIR:-runs/quickstart/tiny-init}
MCORE_DIR=${MCORE_DIR:-mindspeed/model_weights/mcore_tp1_pp1}
SAVE_DIR=${SAVE_DIR:-mindspeed/checkpoints}
DATA_PREFIX=${DATA_PREFIX:-mindspeed/data/sft}
python convert_ckpt.py \
    --use-mcore-models \
    --model-type GPT \
    --model-type-hf llama2 \
    --load-model-type hf \
    --save-model-type mg \
    --target-tensor-parallel-size 1 \
    --target-pipeline-parallel-size 1 \
    --add-qkv-bias \
    --params-dtype bf16 \
    --load-dir "${HF_DIR}" \
    --save-dir "${MCORE_DIR}" \
    --tokenizer-model "${HF_DIR}/tokenizer.json"
