#!/usr/bin/env bash
# 1/4 SFT data -> MindSpeed indexed instruction dataset
# written by: reasoner export mindspeed configs/pcl_reasoner_v1_5/sft.yaml
# run from the root of a MindSpeed-LLM checkout, after sourcing the Ascend toolkit:
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh
set -euo pipefail
# the weights must be local: huggingface-cli download Qwen/Qwen2.5-32B --local-dir ./model_from_hf/Qwen2.5-32B
# the data must be local: huggingface-cli download --repo-type dataset a-m-team/AM-DeepSeek-R1-0528-Distilled --local-dir ./dataset/AM-DeepSeek-R1-0528-Distilled
# note: MindSpeed renders prompts with its qwen template; reasoner's instruction ('Please reason step by step, and put your'...) must already be part of each prompt.
HF_DIR=${HF_DIR:-./model_from_hf/Qwen2.5-32B}
MCORE_DIR=${MCORE_DIR:-mindspeed/model_weights/mcore_tp8_pp4}
SAVE_DIR=${SAVE_DIR:-mindspeed/checkpoints}
DATA_PREFIX=${DATA_PREFIX:-mindspeed/data/sft}
mkdir -p "$(dirname "${DATA_PREFIX}")"
python preprocess_data.py \
    --input ./dataset/AM-DeepSeek-R1-0528-Distilled \
    --tokenizer-name-or-path ${HF_DIR} \
    --tokenizer-type PretrainedFromHF \
    --output-prefix ${DATA_PREFIX} \
    --handler-name SharegptStyleInstructionHandler \
    --prompt-type qwen \
    --map-keys '{"messages": "conversations", "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant", "system_tag": "system"}}' \
    --workers 16 \
    --log-interval 1000 \
    --pack \
    --neat-pack \
    --seq-length 32768 \
    --append-eod
