#!/usr/bin/env bash
# 3/4 SFT on 32 NPUs: TP 8 x PP 4 x DP 1; run on every node with its NODE_RANK
# written by: reasoner export mindspeed configs/pcl_reasoner_v1_5/sft.yaml
# run from the root of a MindSpeed-LLM checkout, after sourcing the Ascend toolkit:
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh
set -euo pipefail
HF_DIR=${HF_DIR:-./model_from_hf/Qwen2.5-32B}
MCORE_DIR=${MCORE_DIR:-mindspeed/model_weights/mcore_tp8_pp4}
SAVE_DIR=${SAVE_DIR:-mindspeed/checkpoints}
DATA_PREFIX=${DATA_PREFIX:-mindspeed/data/sft}
# optimiser steps = ceil(packed rows / global batch) x epochs (epochs = 4); reasoner sft prints its packed rows
TRAIN_ITERS=${TRAIN_ITERS:?set TRAIN_ITERS (see above)}
NPUS_PER_NODE=${NPUS_PER_NODE:-8}
NNODES=${NNODES:-4}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nproc_per_node "${NPUS_PER_NODE}" --nnodes "${NNODES}" --node_rank "${NODE_RANK}" --master_addr "${MASTER_ADDR}" --master_port "${MASTER_PORT}" posttrain_gpt.py \
    --use-mcore-models \
    --num-layers 64 \
    --hidden-size 5120 \
    --ffn-hidden-size 27648 \
    --num-attention-heads 40 \
    --group-query-attention \
    --num-query-groups 8 \
    --padded-vocab-size 152064 \
    --make-vocab-size-divisible-by 1 \
    --rotary-base 1000000 \
    --position-embedding-type rope \
    --use-rotary-position-embeddings \
    --normalization RMSNorm \
    --norm-epsilon 1e-05 \
    --swiglu \
    --add-qkv-bias \
    --disable-bias-linear \
    --attention-dropout 0.0 \
    --hidden-dropout 0.0 \
    --untie-embeddings-and-output-weights \
    --tokenizer-type PretrainedFromHF \
    --tokenizer-name-or-path "${HF_DIR}" \
    --tensor-model-parallel-size 8 \
    --pipeline-model-parallel-size 4 \
    --sequence-parallel \
    --use-distributed-optimizer \
    --seq-length 32768 \
    --max-position-embeddings 32768 \
    --micro-batch-size 1 \
    --global-batch-size 128 \
    --train-iters "${TRAIN_ITERS}" \
    --lr 6e-05 \
    --min-lr 1e-07 \
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
    --recompute-granularity full \
    --recompute-method uniform \
    --recompute-num-layers 1 \
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
