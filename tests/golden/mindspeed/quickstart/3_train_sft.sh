#!/usr/bin/env bash
# 3/4 SFT on 1 NPUs: TP 1 x PP 1 x DP 1; run on every node with its NODE_RANK
# written by: reasoner export mindspeed configs/quickstart/sft.yaml
# run from the root of a MindSpeed-LLM checkout, after sourcing the Ascend toolkit:
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh
set -euo pipefail
HF_DIR=${HF_DIR:-runs/quickstart/tiny-init}
MCORE_DIR=${MCORE_DIR:-mindspeed/model_weights/mcore_tp1_pp1}
SAVE_DIR=${SAVE_DIR:-mindspeed/checkpoints}
DATA_PREFIX=${DATA_PREFIX:-mindspeed/data/sft}
TRAIN_ITERS=${TRAIN_ITERS:-1075}
NPUS_PER_NODE=${NPUS_PER_NODE:-1}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nproc_per_node "${NPUS_PER_NODE}" --nnodes "${NNODES}" --node_rank "${NODE_RANK}" --master_addr "${MASTER_ADDR}" --master_port "${MASTER_PORT}" posttrain_gpt.py \
    --use-mcore-models \
    --num-layers 4 \
    --hidden-size 128 \
    --ffn-hidden-size 384 \
    --num-attention-heads 4 \
    --group-query-attention \
    --num-query-groups 2 \
    --padded-vocab-size 489 \
    --make-vocab-size-divisible-by 1 \
    --rotary-base 10000 \
    --position-embedding-type rope \
    --use-rotary-position-embeddings \
    --normalization RMSNorm \
    --norm-epsilon 1e-06 \
    --swiglu \
    --add-qkv-bias \
    --disable-bias-linear \
    --attention-dropout 0.0 \
    --hidden-dropout 0.0 \
    --tokenizer-type PretrainedFromHF \
    --tokenizer-name-or-path "${HF_DIR}" \
    --tensor-model-parallel-size 1 \
    --pipeline-model-parallel-size 1 \
    --use-distributed-optimizer \
    --seq-length 256 \
    --max-position-embeddings 256 \
    --micro-batch-size 8 \
    --global-batch-size 8 \
    --train-iters "${TRAIN_ITERS}" \
    --lr 0.002 \
    --min-lr 0.0001 \
    --lr-decay-style cosine \
    --lr-warmup-fraction 0.05 \
    --weight-decay 0.0 \
    --adam-beta1 0.9 \
    --adam-beta2 0.95 \
    --adam-eps 1e-08 \
    --clip-grad 1.0 \
    --bf16 \
    --use-flash-attn \
    --attention-softmax-in-fp32 \
    --no-masked-softmax-fusion \
    --seed 0 \
    --finetune \
    --stage sft \
    --is-instruction-dataset \
    --prompt-type qwen \
    --reset-position-ids \
    --neat-pack \
    --padded-samples \
    --data-path "${DATA_PREFIX}" \
    --split 100,0,0 \
    --load "${MCORE_DIR}" \
    --save "${SAVE_DIR}" \
    --save-interval 200 \
    --no-load-optim \
    --no-load-rng \
    --log-interval 1 \
    --log-throughput \
    --eval-iters 0
