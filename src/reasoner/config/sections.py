"""The sections several stage configs share: the prompt template (and published prompts), the
model to load, where data comes from, the optimiser, the training run, a tiny model's shape.

Stage configs (config/stages.py) are built from these; the package re-exports them, so
`from reasoner.config import ModelConfig` works and users look in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from reasoner.config.files import Strict

# Published prompts, by name. `pcl_reasoner_v1_5`: the PCL-Reasoner-V1.5 README samples and
# evaluates with `--system_prompt_type amthinking` (the system prompt of a-m-team's llmeval,
# `llmeval/utils/prompts.py`), and its AIME files end each problem with the Qwen2.5-Math
# instruction below (so do the AIME 2024 JSONL files the tests read).
TEMPLATE_PRESETS: dict[str, dict[str, str]] = {
    "pcl_reasoner_v1_5": {
        "system_prompt": (
            "You are a helpful assistant. To answer the user's question, you first think about "
            "the reasoning process and then provide the user with the answer. The reasoning "
            "process and answer are enclosed within <think> </think> and <answer> </answer> "
            "tags, respectively, i.e., <think> reasoning process here </think> <answer> answer "
            "here </answer>."),
        "instruction": "Please reason step by step, and put your final answer within \\boxed{}.",
    },
}


class TemplateConfig(Strict):
    """How problems and answers are rendered into prompts and responses (see data/template.py)."""

    preset: str | None = Field(
        None, description=f"a published prompt ({', '.join(TEMPLATE_PRESETS)}): fills "
        "system_prompt and instruction unless they are set next to it")
    system_prompt: str | None = Field(
        None, description="system message put before the problem in every stage (a data row's own "
        "system message is used only when this is unset); unset sends none, and a chat template "
        "may then insert its default (Qwen2.5's does)")
    instruction: str = Field(
        "Reason step by step inside {think_open} {think_close}, then give the final answer "
        "inside {answer_open} {answer_close} as \\boxed{...}.",
        description="text appended to the problem (unless already in it); {think_open}, "
        "{think_close}, {answer_open}, {answer_close} are replaced by the tags, other braces stay",
    )
    think_open: str = Field("<think>", description="tag that opens the reasoning span")
    think_close: str = Field("</think>", description="tag that closes the reasoning span")
    answer_open: str = Field("<answer>", description="tag that opens the final answer")
    answer_close: str = Field("</answer>", description="tag that closes the final answer")
    use_chat_template: bool = Field(
        True, description="render with the tokenizer's chat template when it has one")

    @model_validator(mode="before")
    @classmethod
    def _fill_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            if data["preset"] not in TEMPLATE_PRESETS:
                raise ValueError(f"unknown template preset {data['preset']!r}; known: "
                                 f"{', '.join(TEMPLATE_PRESETS)}")
            return {**TEMPLATE_PRESETS[data["preset"]], **data}
        return data


class TinyModelConfig(Strict):
    """Shape of a tiny Qwen2-architecture model built from scratch (tests, CPU quickstart)."""

    hidden_size: int = Field(128, description="model width")
    num_hidden_layers: int = Field(4, description="number of transformer blocks")
    num_attention_heads: int = Field(4, description="query heads (head_dim = hidden/heads)")
    num_key_value_heads: int = Field(2, description="key/value heads (grouped-query attention)")
    intermediate_size: int = Field(384, description="MLP width")
    max_position_embeddings: int = Field(2048, description="longest sequence the model accepts")
    vocab_size: int = Field(512, description="BPE vocabulary size including special tokens")
    rope_theta: float = Field(10000.0, description="RoPE base frequency")
    tie_word_embeddings: bool = Field(True, description="share input and output embeddings")
    seed: int = Field(0, description="seed for the weight initialisation and tokenizer corpus")


class ModelConfig(Strict):
    """Which model to load: an HF hub id or a local folder."""

    name_or_path: str = Field(..., description="HF hub id (e.g. Qwen/Qwen2.5-32B) or local folder")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights dtype; auto = bf16 on GPU/NPU, fp32 on CPU")
    device: Literal["auto", "cpu", "cuda", "npu"] = Field(
        "auto", description="where to run; auto picks cuda, then npu, then cpu")
    trust_remote_code: bool = Field(False, description="allow model code from the hub")
    attn_implementation: str | None = Field(
        None, description="transformers attention backend (sdpa, flash_attention_2, eager)")


class LoraSettings(Strict):
    """LoRA adapters trained instead of the whole model (through PEFT): the base frozen in the
    training dtype, only the adapters in the optimiser; `final/` is the merged model."""

    r: int = Field(16, ge=1, description="adapter rank")
    alpha: float = Field(32.0, gt=0, description="scaling numerator: the update is alpha / r * B A")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapters' input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                 "down_proj"],
        min_length=1, description="names of the linear layers to adapt (the last component, "
        "e.g. q_proj); checked against the model at start")


class TrainedModelConfig(ModelConfig):
    """The model a trainer loads: a ModelConfig, optionally trained as LoRA adapters."""

    lora: LoraSettings | None = Field(None, description="train LoRA adapters (null: the whole "
                                      "model)")


class DataConfig(Strict):
    """Where rows come from: a shard folder, a .jsonl / .json / .parquet file, or an HF dataset id."""

    path: str = Field(..., description="shard folder, data file, or HF dataset id")
    split: str = Field("train", description="split to read when `path` is an HF dataset id")
    subset: str | None = Field(None, description="HF dataset configuration name, if any")
    fields: dict[str, str] = Field(
        default_factory=dict,
        description="our field name -> the data's field name, e.g. {problem: question}",
    )
    data_files: str | list[str] | dict[str, Any] | None = Field(
        None, description="files of an HF dataset (or local files with path json/parquet/csv) to "
        "read, e.g. the math file of a multi-domain set; null = all of them")
    streaming: bool = Field(False, description="stream an HF dataset instead of downloading it "
                            "whole (also used whenever `limit` is set)")
    limit: int | None = Field(None, ge=1, description="read at most this many rows (a pool's size; "
                              "smoke tests)")
    answer_from: str | None = Field(
        None, description="problems without an answer column: the reference answer is the last "
        "\\boxed{} of this (dotted) field, e.g. messages.1.content; rows without one are skipped "
        "and counted")
    shuffle_buffer: int | None = Field(
        None, ge=1, description="streamed hub sets: draw rows through a shuffle buffer of this "
        "many, so a limited pool is not the first rows of the first file")
    seed: int = Field(0, description="seed of that shuffle")


class OptimConfig(Strict):
    """AdamW with linear warmup and cosine decay to `min_lr`."""

    lr: float = Field(1e-5, gt=0, description="peak learning rate")
    min_lr: float = Field(0.0, ge=0, description="learning rate at the end of the cosine")
    warmup_ratio: float = Field(0.0, ge=0, le=1, description="share of steps in linear warmup")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    grad_clip: float | None = Field(1.0, description="clip the global grad norm; null = no clip")
    loss_scale: float = Field(
        2.0 ** 16, gt=0, description="fp16 (model.dtype=float16) only: initial dynamic loss scale; "
        "halved on a step whose gradient overflows (the step is skipped on every rank)")
    loss_scale_window: int = Field(
        1000, ge=1, description="fp16: steps without overflow before the loss scale doubles")
    max_skipped_steps: int = Field(
        10, ge=1, description="steps in a row whose gradient norm is not finite (inf / NaN) that "
        "are skipped, unapplied, before the run stops with an error (every precision)")


class RunConfig(Strict):
    """Steps, precision, checkpoints and logging shared by every trainer."""

    micro_batch: int = Field(1, ge=1, description="rows per forward/backward on one process")
    global_batch: int = Field(
        8, ge=1, description="rows per optimiser step = micro_batch x accumulation x world size")
    epochs: float = Field(1.0, gt=0, description="passes over the data (fractions allowed)")
    max_steps: int | None = Field(None, ge=1, description="stop after this many steps")
    seed: int = Field(0, description="seed for shuffling and initialisation")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward")
    logprob_chunk: int = Field(4096, ge=1, description="tokens per lm-head chunk (memory bound)")
    save_every: int | None = Field(None, ge=1, description="checkpoint every N steps (and at the end)")
    keep_last: int = Field(2, ge=1, description="checkpoints to keep")
    resume: Literal["auto", "never"] = Field(
        "auto", description="auto: continue from the newest complete checkpoint in output_dir")
    log_every: int = Field(1, ge=1, description="write metrics every N steps")
    tracking: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list, description="extra metric sinks (install reasoner[tracking])")
    project: str = Field("reasoner", description="wandb project of the run")
    run_name: str | None = Field(None, description="wandb run name; default: the output "
                                 "folder's name (sft, rl, eval-rl, ...)")
    progress: bool = Field(True, description="show a progress bar")
    term_grace_s: float = Field(
        60.0, gt=0, description="on SIGTERM / SIGHUP (a scheduler's stop, a closed terminal) the "
        "step in progress ends on every process, and a checkpoint is saved when run.save_every "
        "would save within the next 3 steps and the last save took less than this many seconds")
    save_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype of the weights in `final/` (what infer, eval and vLLM read); "
        "auto = the training dtype (model.dtype). Checkpoints keep fp32 master weights for an "
        "exact resume")
    dist_timeout_min: float = Field(
        60.0, gt=0, description="several processes: how long a collective or barrier may wait "
        "(NCCL's own default, 10, is shorter than one rank's tokenizing or checkpoint copy)")
    sequence_parallel: int = Field(
        1, ge=1, description="processes that share each packed row (Ulysses sequence "
        "parallelism: each holds 1/N of the row's tokens, attention sees the whole row): "
        "activations per process / N. Consecutive ranks, within a node; the model's query "
        "heads must divide by N, and its key/value heads too (or N by them); needs packing")
    vocab_layout: Literal["auto", "vocab-parallel", "fsdp"] = Field(
        "auto", description="several processes: how the embedding and lm-head are split. "
        "vocab-parallel: each process keeps its rows and activations travel (traffic grows "
        "with the processes); fsdp: each is an FSDP2 unit of its own, gathered while used "
        "(untied models only); auto: the one moving fewer bytes per step (`reasoner plan`)")


@dataclass(frozen=True)
class Input:
    """Something a stage reads from outside its own folder, as its config names it."""

    key: str  # the config key, e.g. `model.name_or_path` or `data.0.path`
    value: str
    kind: str  # "model folder", "file or folder", "shard folder" or "file"
