"""`reasoner export mindspeed OFFLINE_CONFIG`: the train-offline (PCL) stage in PCL's MindSpeed-LLM fork.

Target: the `MindSpeed-LLM/` folder of github.com/PCL-Reasoner/V1.5 at commit f0626fd (upstream
MindSpeed-LLM commit 887c2d868 plus PCL's `--stage opg` trainer, Megatron vendored beside it;
CANN 8.3.RC1), the code PCL-Reasoner-V1.5's RL stage ran with (`scripts/opg_qwen25_32b.sh`).
Upstream MindSpeed-LLM has no such stage. Four scripts, run in order from that folder:
  1_preprocess_data.sh   `reasoner export mindspeed-data` writes the Verified shard as
                         prompt / response / reward rows: the prompt exactly as `reasoner infer`
                         asked it (the row's rendered prompt), the response with the template's
                         end of turn when it stopped, reward 1 for R = +1 and 0 for R = -1; then
                         the fork's AlpacaStyleInstructionHandler with the empty prompt type
                         (the prompt is already rendered) and `reward` in its map keys
  2_convert_hf_to_mcore.sh  the policy's HF weights -> Megatron-mcore at TP x PP
  3_train_opg.sh         posttrain_gpt.py --stage opg: micro-batch 1 (the fork's loss reads the
                         first sample of a micro-batch only), unpacked rows, the published
                         memory flags, TRAIN_ITERS = ceil(rows x epochs / global batch)
  4_convert_mcore_to_hf.sh  the trained weights back to HF (fp16, as trained) for `reasoner eval`

The fork's loss per sample is r (1 - p) + (1 - r) p with p the geometric-mean probability of the
response and r in {0, 1}: for R = 2r - 1 it is -R p + r, the native `pcl_loss` plus a constant,
so both give the same gradient (tests/unit/export/test_mindspeed_opg.py). Every flag and value
is checked against the fork's own argument definitions
(tests/fixtures/mindspeed/args-pcl-f0626fd.json, from scripts/extract_mindspeed_args.py).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from reasoner.config import OfflineConfig
from reasoner.errors import ConfigError, DataError
from reasoner.export.mindspeed import (
    Parallel,
    Paths,
    architecture,
    check_layout,
    command_lines,
    header,
    model_flags,
    paths,
    to_hf,
    to_mcore,
)

FORK = "PCL-Reasoner/V1.5 f0626fd, MindSpeed-LLM/ (upstream 887c2d868 + --stage opg)"
CHECKOUT = "the MindSpeed-LLM/ folder of a PCL-Reasoner/V1.5 checkout at commit f0626fd"
MAP_KEYS = {"prompt": "prompt", "query": "", "response": "response", "reward": "reward"}


def fork_reward(reward: float) -> int:
    """The fork's reward for a verified sample: R = +1 -> 1, R = -1 -> 0 (its loss takes {0, 1})."""
    if reward == 1:
        return 1
    if reward == -1:
        return 0
    raise DataError(f"reward {reward!r}: the fork's loss takes R = +1 or -1 only (a Verified "
                    "shard from `reasoner verify` has nothing else)")


def _check(cfg: OfflineConfig, arch: dict, par: Parallel) -> None:
    if cfg.objective.name != "pcl":
        raise ConfigError(f"export mindspeed: objective {cfg.objective.name!r}; the fork's "
                          "`--stage opg` trains the pcl objective only (objective.name=pcl)")
    published = type(cfg.objective)()
    changed = [f"objective.{k}={v}" for k, v in cfg.objective.model_dump().items()
               if v != getattr(published, k)]
    if changed:
        raise ConfigError(f"export mindspeed: {', '.join(changed)}: the fork's loss is pcl's "
                          "published form only (every option off); drop these keys to export, "
                          "or train them with `reasoner train-offline`")
    check_layout(arch, par, cfg.run.global_batch, 1)


def scripts(cfg: OfflineConfig, source: str, par: Parallel, train_iters: int | None = None,
            workdir: str = "mindspeed", shape: str | None = None) -> dict[str, str]:
    """The four scripts (file name -> text) for this train-offline config; `shape`: where to
    read the policy's shape when its folder (the SFT stage's output) is not written yet."""
    arch = architecture(shape or cfg.model.name_or_path)
    _check(cfg, arch, par)
    where = paths(cfg.model.name_or_path, par, workdir, data="opg")
    dtype = "fp16" if cfg.model.dtype == "float16" else "bf16"
    return {"1_preprocess_data.sh": _preprocess(source, where),
            "2_convert_hf_to_mcore.sh": to_mcore(source, par, where, CHECKOUT),
            "3_train_opg.sh": _training(cfg, source, par, arch, where, train_iters),
            "4_convert_mcore_to_hf.sh": to_hf(source, where, dtype, CHECKOUT,
                                              "reasoner eval aime EVAL_CONFIG")}


def _preprocess(source: str, where: Paths) -> str:
    """1/4: the rows (see the top), then the fork's preprocessing. No --seq-length: rows over
    the limit are dropped by reasoner, as train-offline drops them."""
    pre = [("--input", "${DATA_JSONL}"), ("--tokenizer-name-or-path", "${HF_DIR}"),
           ("--tokenizer-type", "PretrainedFromHF"), ("--output-prefix", "${DATA_PREFIX}"),
           ("--handler-name", "AlpacaStyleInstructionHandler"), ("--prompt-type", "empty"),
           ("--map-keys", shlex.quote(json.dumps(MAP_KEYS))), ("--workers", 16),
           ("--log-interval", 1000)]
    prepare = (f"reasoner export mindspeed-data {shlex.quote(source)} "
               'model.name_or_path="${HF_DIR}" --out "${DATA_JSONL}"\n')
    return (header("1/4 Verified shard -> the fork's prompt / response / reward dataset", source,
                   CHECKOUT)
            + where.download + where.env + _data_jsonl(where)
            + 'mkdir -p "$(dirname "${DATA_PREFIX}")"\n' + prepare
            + command_lines(["python", "preprocess_data.py"], pre))


def _data_jsonl(where: Paths) -> str:
    return f"DATA_JSONL=${{DATA_JSONL:-{where.data_prefix}.jsonl}}\n"


def _iterations(cfg: OfflineConfig, train_iters: int | None, where: Paths) -> str:
    """TRAIN_ITERS: given, or ceil(rows x epochs / global batch) from the rows written by 1/4
    (PCL's script: 27,174 rows x 5 / 128 -> 1,062). Megatron's sampler runs on across epoch
    ends; the native trainer rounds each epoch up instead (at most epochs - 1 steps more)."""
    if train_iters:
        return f"TRAIN_ITERS=${{TRAIN_ITERS:-{train_iters}}}\n"
    epochs, gbs = cfg.run.epochs, cfg.run.global_batch
    if epochs != int(epochs):
        raise ConfigError(f"export mindspeed: run.epochs={epochs:g}; give --train-iters for a "
                          "fractional number of epochs")
    return (_data_jsonl(where) + 'ROWS=$(wc -l < "${DATA_JSONL}")\n'
            f"# optimiser steps: ceil(ROWS x {int(epochs)} epochs / global batch {gbs})\n"
            f"TRAIN_ITERS=${{TRAIN_ITERS:-$(( (ROWS * {int(epochs)} + {gbs - 1}) / {gbs} ))}}\n")


def _memory_flags(cfg: OfflineConfig, arch: dict, par: Parallel) -> list[tuple[str, Any]]:
    """PCL's MEMORY_ARGS: attention and optimizer state swapped to host, every layer of a
    pipeline stage recomputed by block (64 layers / PP 4 = 16)."""
    if not cfg.run.gradient_checkpointing:
        return [("--swap-optimizer", None)]
    return [("--swap-attention", None), ("--recompute-granularity", "full"),
            ("--recompute-method", "block"),
            ("--recompute-num-layers", arch["num_hidden_layers"] // par.pp),
            ("--recompute-norm", None), ("--recompute-activation-function", None),
            ("--swap-optimizer", None)]


def _precision(cfg: OfflineConfig) -> list[tuple[str, Any]]:
    if cfg.model.dtype == "float16":  # PCL: fp16, initial loss scale 4096
        return [("--fp16", None), ("--initial-loss-scale", f"{cfg.optim.loss_scale:g}")]
    return [("--bf16", None)]


def _training(cfg: OfflineConfig, source: str, par: Parallel, arch: dict, where: Paths,
              train_iters: int | None) -> str:
    """3/4: the RL run itself, the same command on every node."""
    o, r = cfg.optim, cfg.run
    train = [
        *model_flags(arch), ("--init-method-std", 0.01),
        ("--use-fused-rmsnorm", None), ("--use-fused-swiglu", None),
        ("--use-fused-rotary-pos-emb", None),
        ("--tokenizer-type", "PretrainedFromHF"), ("--tokenizer-name-or-path", "${HF_DIR}"),
        ("--tensor-model-parallel-size", par.tp), ("--pipeline-model-parallel-size", par.pp),
        *([("--sequence-parallel", None)] if par.tp > 1 else []),
        ("--use-distributed-optimizer", None), ("--overlap-grad-reduce", None),
        ("--overlap-param-gather", None),
        ("--seq-length", cfg.seq_len),
        ("--max-position-embeddings", max(cfg.seq_len, arch.get("max_position_embeddings", 0))),
        ("--micro-batch-size", 1), ("--global-batch-size", r.global_batch),
        ("--train-iters", "${TRAIN_ITERS}"),
        ("--lr", o.lr), ("--min-lr", o.min_lr), ("--lr-decay-style", "cosine"),
        ("--lr-warmup-fraction", o.warmup_ratio), ("--weight-decay", o.weight_decay),
        ("--adam-beta1", o.betas[0]), ("--adam-beta2", o.betas[1]), ("--adam-eps", o.eps),
        *([("--clip-grad", o.grad_clip)] if o.grad_clip else []),
        *_precision(cfg), ("--use-flash-attn", None), ("--attention-softmax-in-fp32", None),
        ("--no-masked-softmax-fusion", None), ("--no-gradient-accumulation-fusion", None),
        ("--seed", r.seed), *_memory_flags(cfg, arch, par),
        ("--finetune", None), ("--stage", "opg"), ("--is-instruction-dataset", None),
        ("--prompt-type", "empty"), ("--no-pad-to-seq-lengths", None),
        ("--data-path", "${DATA_PREFIX}"), ("--split", "100,0,0"),
        ("--load", "${MCORE_DIR}"), ("--save", "${SAVE_DIR}"),
        ("--save-interval", r.save_every or "${TRAIN_ITERS}"), ("--no-load-optim", None),
        ("--no-load-rng", None), ("--log-interval", r.log_every), ("--log-throughput", None),
        ("--eval-interval", "${TRAIN_ITERS}"), ("--eval-iters", 0),
    ]
    launch = (f"NPUS_PER_NODE=${{NPUS_PER_NODE:-{par.npus_per_node}}}\n"
              f"NNODES=${{NNODES:-{par.nodes}}}\nNODE_RANK=${{NODE_RANK:-0}}\n"
              "MASTER_ADDR=${MASTER_ADDR:-localhost}\nMASTER_PORT=${MASTER_PORT:-6000}\n"
              "export CUDA_DEVICE_MAX_CONNECTIONS=1\n")
    torchrun = ["torchrun", "--nproc_per_node", "${NPUS_PER_NODE}", "--nnodes", "${NNODES}",
                "--node_rank", "${NODE_RANK}", "--master_addr", "${MASTER_ADDR}",
                "--master_port", "${MASTER_PORT}", "posttrain_gpt.py"]
    world = par.nodes * par.npus_per_node
    dp = world // (par.tp * par.pp)
    return (header(f"3/4 offline RL (--stage opg) on {world} NPUs: TP {par.tp} x PP {par.pp} x "
                   f"DP {dp}; run on every node with its NODE_RANK", source, CHECKOUT)
            + where.env + _iterations(cfg, train_iters, where) + launch
            + command_lines(torchrun, train))


def prepare_data(cfg: OfflineConfig, out: Path) -> dict[str, int]:
    """Write the Verified shard as the fork's rows (see the top); returns the counts. Rows are
    dropped as train-offline drops them (empty, or longer than min(max_tokens, seq_len)
    tokens: the fork would cut them); `retokenized` counts rows whose stored sampled token ids
    differ from their text's tokens (the fork tokenizes text; the native trainer uses the ids)."""
    limit = min(cfg.max_tokens, cfg.seq_len)
    counts = {"rows": 0, "positive": 0, "negative": 0, f"dropped_over_{limit}_tokens": 0,
              "dropped_empty": 0, "retokenized": 0}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        _write_rows(cfg, tmp, counts, limit)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a bad row: no half-written file left beside the output
        raise
    os.replace(tmp, out)
    return counts


def _write_rows(cfg: OfflineConfig, tmp: Path, counts: dict[str, int], limit: int) -> None:
    from reasoner import models, shards
    from reasoner.data.template import end_of_turn
    from reasoner.records import Verified

    tok = models.load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    end = end_of_turn(tok)  # the token a stopped response ended with, as train-offline adds it
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt_len: dict[str, int] = {}
    with open(tmp, "w") as fh:
        for r in shards.iter_rows(cfg.input_dir, Verified):
            response = r["response"] + (end if r["finish_reason"] == "stop" else "")
            ids = encode(response)
            if not ids:
                counts["dropped_empty"] += 1
                continue
            if r["prompt"] not in prompt_len:
                prompt_len[r["prompt"]] = len(encode(r["prompt"]))
            if prompt_len[r["prompt"]] + len(ids) > limit:
                counts[f"dropped_over_{limit}_tokens"] += 1
                continue
            if r.get("token_ids") is not None and list(r["token_ids"]) != ids:
                counts["retokenized"] += 1
            reward = fork_reward(r["reward"])
            fh.write(json.dumps({"prompt": r["prompt"], "response": response, "reward": reward},
                                ensure_ascii=False) + "\n")
            counts["rows"] += 1
            counts["positive" if reward else "negative"] += 1
