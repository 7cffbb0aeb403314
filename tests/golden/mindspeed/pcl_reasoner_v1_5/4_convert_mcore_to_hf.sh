#!/usr/bin/env bash
# 4/4 trained Megatron-mcore weights -> HF (written to ${HF_DIR}/mg2hf)
# written by: reasoner export mindspeed configs/pcl_reasoner_v1_5/sft.yaml
# run from the root of a MindSpeed-LLM checkout, after sourcing the Ascend toolkit:
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh
set -euo pipefail
HF_DIR=${HF_DIR:-./model_from_hf/Qwen2.5-32B}
MCORE_DIR=${MCORE_DIR:-mindspeed/model_weights/mcore_tp8_pp4}
SAVE_DIR=${SAVE_DIR:-mindspeed/checkpoints}
DATA_PREFIX=${DATA_PREFIX:-mindspeed/data/sft}
python convert_ckpt.py \
    --use-mcore-models \
    --model-type GPT \
    --model-type-hf llama2 \
    --load-model-type mg \
    --save-model-type hf \
    --target-tensor-parallel-size 1 \
    --target-pipeline-parallel-size 1 \
    --add-qkv-bias \
    --params-dtype bf16 \
    --load-dir "${SAVE_DIR}" \
    --save-dir "${HF_DIR}"
# then, with reasoner: reasoner infer CONFIG model.name_or_path=${HF_DIR}/mg2hf
