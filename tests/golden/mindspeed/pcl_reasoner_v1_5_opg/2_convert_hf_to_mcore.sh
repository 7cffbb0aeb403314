#!/usr/bin/env bash
# 2/4 HF -> Megatron-mcore weights (TP 8, PP 4)
# written by: reasoner export mindspeed configs/pcl_reasoner_v1_5/train_offline.yaml
# run from the MindSpeed-LLM/ folder of a PCL-Reasoner/V1.5 checkout at commit f0626fd, after sourcing the Ascend toolkit:
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh
set -euo pipefail
HF_DIR=${HF_DIR:-runs/pcl_reasoner_v1_5/sft/final}
MCORE_DIR=${MCORE_DIR:-mindspeed/model_weights/mcore_tp8_pp4}
SAVE_DIR=${SAVE_DIR:-mindspeed/checkpoints}
DATA_PREFIX=${DATA_PREFIX:-mindspeed/data/opg}
python convert_ckpt.py \
    --use-mcore-models \
    --model-type GPT \
    --model-type-hf llama2 \
    --load-model-type hf \
    --save-model-type mg \
    --target-tensor-parallel-size 8 \
    --target-pipeline-parallel-size 4 \
    --add-qkv-bias \
    --params-dtype bf16 \
    --load-dir "${HF_DIR}" \
    --save-dir "${MCORE_DIR}" \
    --tokenizer-model "${HF_DIR}/tokenizer.json"
