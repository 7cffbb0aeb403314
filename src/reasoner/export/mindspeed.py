"""`reasoner export mindspeed SFT_CONFIG`: the MindSpeed-LLM scripts for the same SFT run on Ascend.

Target release: MindSpeed-LLM 2.2.0 (with MindSpeed 2.2.0_core_r0.12.1, Megatron-LM
core_v0.12.1, PyTorch 2.7.1, torch_npu 7.2.0, CANN 8.3.RC1, Python 3.10: its own
compatibility table; CANN 8.3.RC1 is what PCL-Reasoner-V1.5 lists). Four scripts, run in
order from a MindSpeed-LLM checkout:
  1_preprocess_data.sh   `reasoner export mindspeed-data` writes the rows as role/content
                         messages asked exactly as `reasoner infer` asks (template system prompt
                         and instruction) and drops rows over the length limit; then
                         MindSpeed's preprocessing (ShareGPT handler, qwen = ChatML template,
                         `--pack --neat-pack` when the config packs)
  2_convert_hf_to_mcore.sh  HF weights -> Megatron-mcore with the chosen TP / PP
  3_train_sft.sh         posttrain_gpt.py with the config's schedule, batch and sequence length
  4_convert_mcore_to_hf.sh  the trained weights back to HF (bf16), ready for `reasoner infer`
Every flag and value is checked against that release's own argument definitions
(tests/fixtures/mindspeed/args-v2.2.0.json, extracted by scripts/extract_mindspeed_args.py).
A train-offline config goes to PCL's fork instead (mindspeed_opg.py, which shares the helpers
here: the model's shape, the layout check, the script header and command lines, conversions).
"""


from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasoner.config import OfflineConfig, SFTConfig
from reasoner.errors import ConfigError, InputError

RELEASE = "MindSpeed-LLM 2.2.0 (Megatron-LM core_v0.12.1, torch_npu 7.2.0, CANN 8.3.RC1)"

# Published Qwen2.5 shapes (config.json of each hub model), for when the weights are not local.
KNOWN_ARCHITECTURES: dict[str, dict] = {
    "Qwen/Qwen2.5-7B": dict(num_hidden_layers=28, hidden_size=3584, intermediate_size=18944,
                            num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                            rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "Qwen/Qwen2.5-14B": dict(num_hidden_layers=48, hidden_size=5120, intermediate_size=13824,
                             num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                             rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "Qwen/Qwen2.5-32B": dict(num_hidden_layers=64, hidden_size=5120, intermediate_size=27648,
                             num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                             rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                             max_position_embeddings=131072),  # as PCL's RL script passes it
    "Qwen/Qwen2.5-72B": dict(num_hidden_layers=80, hidden_size=8192, intermediate_size=29568,
                             num_attention_heads=64, num_key_value_heads=8, vocab_size=152064,
                             rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
}


@dataclass
class Parallel:
    tp: int = 8
    pp: int = 4
    nodes: int = 4
    npus_per_node: int = 8


def architecture(name_or_path: str) -> dict:
    """The model's shape: from a local config.json, or the published Qwen2.5 table."""
    local = Path(name_or_path) / "config.json"
    if local.is_file():
        cfg = json.loads(local.read_text())
        if cfg.get("model_type") not in ("qwen2", None):
            raise InputError(f"{local}: model_type {cfg.get('model_type')!r}; the export writes "
                             "Qwen2-architecture flags only")
        return cfg
    if name_or_path in KNOWN_ARCHITECTURES:
        return KNOWN_ARCHITECTURES[name_or_path]
    raise InputError(f"cannot read the shape of {name_or_path!r}: give a local HF folder (with "
                     f"config.json) or one of {', '.join(KNOWN_ARCHITECTURES)}; for a folder "
                     "an earlier stage has not written yet, name its shape with --shape")


def hub_id(path: str) -> bool:
    """`owner/name` that is not a local path: what the scripts must download first. Decided by
    the text, so the scripts are the same on every machine."""
    return (not Path(path).exists() and re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", path) is not None
            and Path(path).suffix not in (".jsonl", ".json", ".parquet"))


def check_layout(arch: dict, par: Parallel, global_batch: int, micro_batch: int) -> None:
    """Refuse a TP / PP / node layout that cannot run this model and batch."""
    heads, groups, layers = (arch["num_attention_heads"], arch["num_key_value_heads"],
                             arch["num_hidden_layers"])
    problems = []
    if heads % par.tp or groups % par.tp:
        problems.append(f"TP {par.tp} must divide the {heads} attention heads and {groups} KV heads")
    if layers % par.pp:
        problems.append(f"PP {par.pp} must divide the {layers} layers")
    world = par.nodes * par.npus_per_node
    if world % (par.tp * par.pp):
        problems.append(f"{world} NPUs are not a multiple of TP x PP = {par.tp * par.pp}")
    else:
        dp = world // (par.tp * par.pp)
        if global_batch % (dp * micro_batch):
            problems.append(f"global batch {global_batch} is not a multiple of data-parallel "
                            f"size {dp} x micro batch {micro_batch}")
    if problems:
        raise ConfigError("export mindspeed: " + "; ".join(problems))


def _word(value: object) -> str:
    """A shell word: a value holding a shell variable in double quotes (a path with spaces
    stays one argument; shellcheck SC2086)."""
    text = str(value)
    return f'"{text}"' if "${" in text and not text.startswith('"') else text


def command_lines(command: list[str], flags: list[tuple[str, object]]) -> str:
    """`command \\` then one `--flag value \\` per line (value None = a switch)."""
    out = [" ".join(_word(w) for w in command) + " \\"]
    for i, (flag, value) in enumerate(flags):
        text = flag if value is None else f"{flag} {_word(value)}"
        out.append(f"    {text}" + (" \\" if i < len(flags) - 1 else ""))
    return "\n".join(out) + "\n"


CHECKOUT = "the root of a MindSpeed-LLM checkout"


def header(title: str, source: str, checkout: str = CHECKOUT) -> str:
    """A script's first lines: what it does, what wrote it, where it runs; strict mode."""
    return (f"#!/usr/bin/env bash\n# {title}\n# written by: reasoner export mindspeed {source}\n"
            f"# run from {checkout}, after sourcing the Ascend toolkit:\n"
            "#   source /usr/local/Ascend/ascend-toolkit/set_env.sh\nset -euo pipefail\n")


@dataclass(frozen=True)
class Paths:
    """Where the four scripts read and write, as shell defaults the user may override."""

    hf_dir: str
    env: str  # the HF_DIR / MCORE_DIR / SAVE_DIR / DATA_PREFIX lines
    download: str  # the download hint for a hub id ("" for a local folder)
    data_prefix: str


def paths(name: str, par: Parallel, workdir: str, data: str = "sft") -> Paths:
    local = not hub_id(name)
    hf_dir = name if local else f"./model_from_hf/{name.rstrip('/').split('/')[-1]}"
    mcore = f"{workdir}/model_weights/mcore_tp{par.tp}_pp{par.pp}"
    data_prefix = f"{workdir}/data/{data}"
    env = (f'HF_DIR=${{HF_DIR:-{hf_dir}}}\nMCORE_DIR=${{MCORE_DIR:-{mcore}}}\n'
           f'SAVE_DIR=${{SAVE_DIR:-{workdir}/checkpoints}}\n'
           f'DATA_PREFIX=${{DATA_PREFIX:-{data_prefix}}}\n')
    download = ("" if local else
                f"# the weights must be local: huggingface-cli download {name} --local-dir {hf_dir}\n")
    return Paths(hf_dir, env, download, data_prefix)


def scripts(cfg: SFTConfig, source: str, par: Parallel, train_iters: int | None = None,
            workdir: str = "mindspeed", shape: str | None = None) -> dict[str, str]:
    """The four scripts (file name -> text) for this SFT config; `shape`: where to read the
    model's shape instead of model.name_or_path."""
    arch = architecture(shape or cfg.model.name_or_path)
    check_layout(arch, par, cfg.run.global_batch, cfg.run.micro_batch)
    where = paths(cfg.model.name_or_path, par, workdir)
    return {"1_preprocess_data.sh": _preprocess(cfg, source, where),
            "2_convert_hf_to_mcore.sh": to_mcore(source, par, where),
            "3_train_sft.sh": _training(cfg, source, par, arch, where, train_iters),
            "4_convert_mcore_to_hf.sh": to_hf(source, where)}


def _preprocess(cfg: SFTConfig, source: str, where: Paths) -> str:
    """1/4: reasoner reads the data as `reasoner sft` does (hub id, data_files, ShareGPT or
    OpenAI rows), asks each row as infer will, drops rows over the limit, writes role/content
    rows; MindSpeed's preprocessing packs them."""
    keys = {"messages": "messages",
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                     "assistant_tag": "assistant", "system_tag": "system"}}
    pre = [("--input", "${DATA_JSONL}"), ("--tokenizer-name-or-path", "${HF_DIR}"),
           ("--tokenizer-type", "PretrainedFromHF"), ("--output-prefix", "${DATA_PREFIX}"),
           ("--handler-name", "SharegptStyleInstructionHandler"), ("--prompt-type", "qwen"),
           ("--map-keys", shlex.quote(json.dumps(keys))), ("--workers", 16),
           ("--log-interval", 1000)]
    if cfg.packing:  # no --append-eod: a turn already ends with <|im_end|>
        pre += [("--pack", None), ("--neat-pack", None), ("--seq-length", cfg.seq_len)]
    prepare = (f"reasoner export mindspeed-data {shlex.quote(source)} "
               'model.name_or_path="${HF_DIR}" --out "${DATA_JSONL}"\n')
    return (header("1/4 SFT data -> MindSpeed indexed instruction dataset", source)
            + where.download + where.env + 'DATA_JSONL=${DATA_JSONL:-'
            + f'{where.data_prefix}.jsonl}}\n' + 'mkdir -p "$(dirname "${DATA_PREFIX}")"\n'
            + prepare + command_lines(["python", "preprocess_data.py"], pre))


def to_mcore(source: str, par: Parallel, where: Paths, checkout: str = CHECKOUT) -> str:
    """2/4: HF weights to Megatron-mcore at the run's TP / PP (bf16, as MindSpeed's examples
    and PCL's README convert)."""
    conv = [("--use-mcore-models", None), ("--model-type", "GPT"), ("--model-type-hf", "llama2"),
            ("--load-model-type", "hf"), ("--save-model-type", "mg"),
            ("--target-tensor-parallel-size", par.tp), ("--target-pipeline-parallel-size", par.pp),
            ("--add-qkv-bias", None), ("--params-dtype", "bf16"),
            ("--load-dir", "${HF_DIR}"), ("--save-dir", "${MCORE_DIR}"),
            ("--tokenizer-model", "${HF_DIR}/tokenizer.json")]
    return (header(f"2/4 HF -> Megatron-mcore weights (TP {par.tp}, PP {par.pp})", source, checkout)
            + where.download + where.env + command_lines(["python", "convert_ckpt.py"], conv))


def model_flags(arch: dict) -> list[tuple[str, Any]]:
    """The architecture as Megatron's arguments (Qwen2 / Llama layout)."""
    flags = [
        ("--use-mcore-models", None), ("--num-layers", arch["num_hidden_layers"]),
        ("--hidden-size", arch["hidden_size"]), ("--ffn-hidden-size", arch["intermediate_size"]),
        ("--num-attention-heads", arch["num_attention_heads"]), ("--group-query-attention", None),
        ("--num-query-groups", arch["num_key_value_heads"]),
        ("--padded-vocab-size", arch["vocab_size"]), ("--make-vocab-size-divisible-by", 1),
        ("--rotary-base", int(arch.get("rope_theta", 10000.0))),
        ("--position-embedding-type", "rope"), ("--use-rotary-position-embeddings", None),
        ("--normalization", "RMSNorm"), ("--norm-epsilon", arch.get("rms_norm_eps", 1e-6)),
        ("--swiglu", None), ("--add-qkv-bias", None), ("--disable-bias-linear", None),
        ("--attention-dropout", 0.0), ("--hidden-dropout", 0.0),
    ]
    if not arch.get("tie_word_embeddings", False):
        flags.append(("--untie-embeddings-and-output-weights", None))
    return flags


def _training(cfg: SFTConfig, source: str, par: Parallel, arch: dict, where: Paths,
              train_iters: int | None) -> str:
    """3/4: the SFT run itself, the same command on every node."""
    o, r = cfg.optim, cfg.run
    iters = (f"TRAIN_ITERS=${{TRAIN_ITERS:-{train_iters}}}\n" if train_iters else
             "# optimiser steps = ceil(packed rows / global batch) x epochs "
             f"(epochs = {r.epochs:g}); reasoner sft prints its packed rows\n"
             'TRAIN_ITERS=${TRAIN_ITERS:?set TRAIN_ITERS (see above)}\n')
    train = [
        *model_flags(arch),
        ("--tokenizer-type", "PretrainedFromHF"), ("--tokenizer-name-or-path", "${HF_DIR}"),
        ("--tensor-model-parallel-size", par.tp), ("--pipeline-model-parallel-size", par.pp),
        *([("--sequence-parallel", None)] if par.tp > 1 else []),
        ("--use-distributed-optimizer", None),
        ("--seq-length", cfg.seq_len), ("--max-position-embeddings", cfg.seq_len),
        ("--micro-batch-size", r.micro_batch), ("--global-batch-size", r.global_batch),
        ("--train-iters", "${TRAIN_ITERS}"),
        ("--lr", o.lr), ("--min-lr", o.min_lr), ("--lr-decay-style", "cosine"),
        ("--lr-warmup-fraction", o.warmup_ratio), ("--weight-decay", o.weight_decay),
        ("--adam-beta1", o.betas[0]), ("--adam-beta2", o.betas[1]), ("--adam-eps", o.eps),
        *([("--clip-grad", o.grad_clip)] if o.grad_clip else []),
        ("--bf16", None), ("--use-flash-attn", None), ("--attention-softmax-in-fp32", None),
        ("--no-masked-softmax-fusion", None), ("--seed", r.seed),
        *([("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
           ("--recompute-num-layers", 1)] if r.gradient_checkpointing else []),
        ("--finetune", None), ("--stage", "sft"), ("--is-instruction-dataset", None),
        ("--prompt-type", "qwen"),
        *([("--reset-position-ids", None), ("--neat-pack", None), ("--padded-samples", None)]
          if cfg.packing else []),
        ("--data-path", "${DATA_PREFIX}"), ("--split", "100,0,0"),
        ("--load", "${MCORE_DIR}"), ("--save", "${SAVE_DIR}"),
        ("--save-interval", r.save_every or "${TRAIN_ITERS}"), ("--no-load-optim", None),
        ("--no-load-rng", None), ("--log-interval", r.log_every), ("--log-throughput", None),
        ("--eval-iters", 0),  # the backend: Megatron's default nccl, which torch_npu maps to HCCL
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
    return (header(f"3/4 SFT on {world} NPUs: TP {par.tp} x PP {par.pp} x DP {dp}; run on "
                    "every node with its NODE_RANK", source)
            + where.env + iters + launch + command_lines(torchrun, train))


def to_hf(source: str, where: Paths, dtype: str = "bf16", checkout: str = CHECKOUT,
          then: str = "reasoner infer CONFIG") -> str:
    """4/4: the trained weights back to an HF folder `reasoner infer` (or eval) reads."""
    back = [("--use-mcore-models", None), ("--model-type", "GPT"), ("--model-type-hf", "llama2"),
            ("--load-model-type", "mg"), ("--save-model-type", "hf"),
            ("--target-tensor-parallel-size", 1), ("--target-pipeline-parallel-size", 1),
            ("--add-qkv-bias", None), ("--params-dtype", dtype),
            ("--load-dir", "${SAVE_DIR}"), ("--save-dir", "${HF_DIR}")]
    return (header("4/4 trained Megatron-mcore weights -> HF (written to ${HF_DIR}/mg2hf)", source,
                   checkout)
            + where.env + command_lines(["python", "convert_ckpt.py"], back)
            + f"# then, with reasoner: {then} model.name_or_path=${{HF_DIR}}/mg2hf\n")


def prepare_data(cfg: SFTConfig, out: Path) -> dict[str, int]:
    """Write the SFT rows as MindSpeed reads them (see the top); returns the counts."""
    import os

    from reasoner import models
    from reasoner.data import sources
    from reasoner.data.template import render_sft, sft_messages
    from reasoner.records import SFTExample

    tok = models.load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    limit = min(cfg.max_tokens, cfg.seq_len) if cfg.packing else cfg.max_tokens
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    kept = dropped = 0
    with open(tmp, "w") as fh:
        for row in sources.iter_rows(cfg.data, SFTExample):
            prompt, response = render_sft(row, cfg.template, tok)
            n = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in (prompt, response))
            if n > limit:  # MindSpeed would cut it to seq_length; reasoner sft drops it
                dropped += 1
                continue
            fh.write(json.dumps({"messages": sft_messages(row, cfg.template)},
                                ensure_ascii=False) + "\n")
            kept += 1
    os.replace(tmp, out)
    return {"rows": kept, f"dropped_over_{limit}_tokens": dropped}


def export(make: Callable[..., dict[str, str]], cfg: SFTConfig | OfflineConfig, source: str,
           out: Path, par: Parallel, train_iters: int | None = None,
           shape: str | None = None) -> list[Path]:
    """Write the scripts `make` gives for `cfg` into `out`, executable: `make` is this module's
    `scripts` for an SFT config, `mindspeed_opg.scripts` for a train-offline one."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in make(cfg, source, par, train_iters or cfg.run.max_steps,
                           shape=shape).items():
        path = out / name
        path.write_text(text)
        path.chmod(0o755)
        written.append(path)
    return written

