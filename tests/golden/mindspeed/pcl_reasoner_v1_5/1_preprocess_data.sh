#!/usr/bin/env bash
# 1/4 SFT data -> MindSpeed indexed instruction dataset
# written by: reasoner export mindspeed configs/pcl_reasoner_v1_5/sft.yaml
# run from the root of a MindSpeed-LLM checkout, after sourcing the Ascend toolkit:
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh
set -euo pipefail
# the weights must be local: huggingface-cli download Qwen/Qwen2.5-32B --local-dir ./model_from_hf/Qwen2.5-32B
HF_DIR=${HF_DIR:-./model_from_hf/Qwen2.5-32B}
MCORE_DIR=${MCORE_DIR:-mindspeed/model_weights/mcore_tp8_pp4}
SAVE_DIR=${SAVE_DIR:-mindspeed/checkpoints}
DATA_PREFIX=${DATA_PREFIX:-mindspeed/data/sft}
DATA_JSONL=${DATA_JSONL:-mindspeed/data/sft.jsonl}
mkdir -p "$(dirname "${DATA_PREFIX}")"
reasoner export mindspeed-data configs/pcl_reasoner_v1_5/sft.yaml model.name_or_path="${HF_DIR}" --out "${DATA_JSONL}"
python preprocess_data.py \
    --input "${DATA_JSONL}" \
    --tokenizer-name-or-path "${HF_DIR}" \
    --tokenizer-type PretrainedFromHF \
    --output-prefix "${DATA_PREFIX}" \
    --handler-name SharegptStyleInstructionHandler \
    --prompt-type qwen \
    --map-keys '{"messages": "messages", "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant", "system_tag": "system"}}' \
    --workers 16 \
    --log-interval 1000 \
    --pack \
    --neat-pack \
    --seq-length 32768
