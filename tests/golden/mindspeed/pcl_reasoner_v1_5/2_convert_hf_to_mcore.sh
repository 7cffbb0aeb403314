#!/usr/bin/env bash
# 2/4 HF -> Megatron-mcore weights (TP 8, PP 4)
# written by: reasoner export mindspeed configs/pcl_reasoner_v1_5/sft.yaml
# run from the root of a MindSpeed-LLM checkout, after sourcing the Ascend toolkit:
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh
set -euo pipefail
# the weights must be local: huggingface-cli download Qwen/Qwen2.5-32B --local-dir ./model_from_hf/Qwen2.5-32B
HF_DIR=${HF_DIR:-./model_from_hf/Qwen2.5-32B}
MCORE_DIR=${MCORE_DIR:-mindspeed/model_weights/mcore_tp8_pp4}
SAVE_DIR=${SAVE_DIR:-mindspeed/checkpoints}
DATA_PREFIX=${DATA_PREFIX:-mindspeed/data/sft}
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
