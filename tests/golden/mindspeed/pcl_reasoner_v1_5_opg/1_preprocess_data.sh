#!/usr/bin/env bash
# 1/4 Verified shard -> the fork's prompt / response / reward dataset
# written by: reasoner export mindspeed configs/pcl_reasoner_v1_5/train_offline.yaml
# run from the MindSpeed-LLM/ folder of a PCL-Reasoner/V1.5 checkout at commit f0626fd, after sourcing the Ascend toolkit:
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh
set -euo pipefail
HF_DIR=${HF_DIR:-runs/pcl_reasoner_v1_5/sft/final}
MCORE_DIR=${MCORE_DIR:-mindspeed/model_weights/mcore_tp8_pp4}
SAVE_DIR=${SAVE_DIR:-mindspeed/checkpoints}
DATA_PREFIX=${DATA_PREFIX:-mindspeed/data/opg}
DATA_JSONL=${DATA_JSONL:-mindspeed/data/opg.jsonl}
mkdir -p "$(dirname "${DATA_PREFIX}")"
reasoner export mindspeed-data configs/pcl_reasoner_v1_5/train_offline.yaml model.name_or_path="${HF_DIR}" --out "${DATA_JSONL}"
python preprocess_data.py \
    --input "${DATA_JSONL}" \
    --tokenizer-name-or-path "${HF_DIR}" \
    --tokenizer-type PretrainedFromHF \
    --output-prefix "${DATA_PREFIX}" \
    --handler-name AlpacaStyleInstructionHandler \
    --prompt-type empty \
    --map-keys '{"prompt": "prompt", "query": "", "response": "response", "reward": "reward"}' \
    --workers 16 \
    --log-interval 1000
