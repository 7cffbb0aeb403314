"""Typed stage configs: one pydantic model per stage, every field with a one-line description.

Built from the shared sections (sections.py) and the objectives' tagged union (objectives.py);
loading (YAML + `key.sub=value` overrides) is files.py. The package re-exports all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from reasoner.config import generation as gen
from reasoner.config.files import Strict, dump
from reasoner.config.generation import JudgeConfig, RayConfig, SamplingConfig, VLLMConfig
from reasoner.config.objectives import ObjectiveConfig, PCLObjective
from reasoner.config.sections import (
    DataConfig,
    Input,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TemplateConfig,
    TinyModelConfig,
    TrainedModelConfig,
)
from reasoner.outputs import without

# --------------------------------------------------------------------------------------------
# What every stage config answers

OVERWRITE = "redo the run: first remove what this stage wrote in output_dir (your files stay)"


class StageConfig(Strict):
    """A stage's config: what decides its output (`result_config`: the config less the settings
    listed in `outside_identity`, which change how fast or where it runs, never what it makes)
    and its inputs (`inputs()`, each stage's own)."""

    outside_identity: ClassVar[tuple[str, ...]] = ()

    def result_config(self) -> dict:
        """The config less `outside_identity` and less `output_dir` (a folder copied or moved
        elsewhere is the same output)."""
        return without(dump(self), ("output_dir", *self.outside_identity))

    def inputs(self) -> list[Input]:
        return []


TRAINING_SETTINGS = (  # how a trainer runs, not what it trains
    "run.progress", "run.tracking", "run.project", "run.run_name", "run.log_every",
    "run.save_every", "run.keep_last", "run.resume", "run.dist_timeout_min", "run.term_grace_s",
    "run.vocab_layout",
    "run.logprob_chunk", "run.sequence_parallel", "model.device", "model.attn_implementation",
    "overwrite")


class TrainerConfig(StageConfig):
    """What the training core reads of a stage config: `sft` and `train-offline` have it.

    Each declares the fields itself (their defaults differ); this base holds what follows from
    them: how many tokens one micro-batch holds, and that a packed row fits a sample."""

    if TYPE_CHECKING:  # declared by each trainer's config (pydantic sees none here)
        model: ModelConfig
        output_dir: Path
        max_tokens: int
        packing: bool
        seq_len: int
        optim: OptimConfig
        run: RunConfig

    @property
    def row_tokens(self) -> int:
        """Token slots of one row: a packed row's seq_len, else the longest sample allowed."""
        return self.seq_len if self.packing else self.max_tokens

    @property
    def micro_batch_tokens(self) -> int:
        """Token slots one process computes per micro-batch: `micro_batch` rows, its
        1/sequence_parallel of them (the memory plan's and the vocabulary layout's unit)."""
        return -(-self.run.micro_batch * self.row_tokens // self.run.sequence_parallel)

    @model_validator(mode="after")
    def _fits_packed_rows(self) -> TrainerConfig:
        """A sample longer than a packed row cannot be packed: caught here, not mid-run."""
        if self.packing and self.max_tokens > self.seq_len:
            raise ValueError(f"max_tokens ({self.max_tokens}) is larger than seq_len "
                             f"({self.seq_len}) with packing: set seq_len >= max_tokens, lower "
                             "max_tokens, or packing=false")
        if self.run.sequence_parallel > 1 and not self.packing:
            raise ValueError(f"run.sequence_parallel={self.run.sequence_parallel} splits packed "
                             "rows: set packing=true (or run.sequence_parallel=1)")
        return self


# --------------------------------------------------------------------------------------------
# Stage configs


class SynthConfig(StageConfig):
    """`reasoner data synth`: synthetic multi-step arithmetic word problems with exact answers."""

    outside_identity: ClassVar[tuple[str, ...]] = ("overwrite",)

    output_dir: Path = Field(..., description="folder that receives the problem and SFT shards")
    seed: int = Field(0, description="seed; the same seed gives byte-identical shards")
    num_train: int = Field(2000, ge=1, description="problems in the train split")
    num_test: int = Field(200, ge=1, description="problems in the test split (never in train)")
    levels: list[int] = Field(
        [0, 1, 2, 3], description="difficulty levels to mix; level L has L+1 operations")
    max_start: int = Field(12, ge=2, description="largest starting quantity")
    max_operand: int = Field(6, ge=2, description="largest number in an operation")
    max_value: int = Field(40, ge=4, description="largest quantity at any step")
    flawed_fraction: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="share of SFT demonstrations with one arithmetic slip (and the answer it leads to)",
    )
    verbose_fraction: float = Field(
        0.0, ge=0.0, le=1.0, description="share of SFT demonstrations made longer for the same "
        "answer (verbose_style)")
    verbose_style: Literal["detour", "recheck"] = Field(
        "detour", description="detour: content-free asides after the last step ('hmm, that "
        "seems fine.'), two per step; recheck: each step written again as 'check: ...' (which "
        "the tiny model uses as a second try)")
    template: TemplateConfig = Field(default_factory=TemplateConfig, description="tags and wording")
    overwrite: bool = Field(False, description=OVERWRITE)

    def inputs(self) -> list[Input]:
        return []


class SFTConfig(TrainerConfig):
    """`reasoner sft`: supervised fine-tuning on prompt/response pairs, loss on responses only."""

    outside_identity: ClassVar[tuple[str, ...]] = (*TRAINING_SETTINGS, "cache_dir")

    model: TrainedModelConfig = Field(..., description="base model to fine-tune")
    data: DataConfig = Field(..., description="SFT examples (prompt/response or messages)")
    output_dir: Path = Field(..., description="checkpoints, metrics and the final model go here")
    template: TemplateConfig = Field(default_factory=TemplateConfig, description="prompt rendering")
    max_tokens: int = Field(4096, ge=2, description="drop (and count) longer examples")
    packing: bool = Field(True, description="pack samples into seq_len rows; false = padded rows")
    seq_len: int = Field(4096, ge=2, description="tokens per packed row (packing capacity)")
    cache_dir: Path | None = Field(
        None, description="token cache folder; default output_dir/token_cache")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="optimiser and schedule")
    run: RunConfig = Field(default_factory=RunConfig, description="batching, checkpoints, logging")
    overwrite: bool = Field(False, description=OVERWRITE)

    def inputs(self) -> list[Input]:
        return [Input("model.name_or_path", self.model.name_or_path, "model folder"),
                Input("data.path", self.data.path, "file or folder")]


class InferConfig(StageConfig):
    """`reasoner infer`: n candidate answers per problem, written as a Sample shard."""

    outside_identity: ClassVar[tuple[str, ...]] = (  # speed and which worker, never which samples
        "batch_size", "vllm", "ray", "progress", "shard", "num_shards", "overwrite",
        "model.device", *(f"server.{k}" for k in gen.SERVER_TRANSPORT))

    model: ModelConfig = Field(..., description="policy to sample from")
    data: DataConfig = Field(..., description="problems (fields: id, problem, answer; mappable)")
    output_dir: Path = Field(..., description="Sample shard folder")
    template: TemplateConfig = Field(default_factory=TemplateConfig, description="prompt rendering")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="sampling")
    backend: Literal["auto", "hf", "vllm", "openai"] = Field(
        "auto", description="auto: vllm when installed and a GPU is present, else hf; openai: "
        "a model server (`server`)")
    batch_size: int = Field(64, ge=1, description="sequences per generate call (hf backend)")
    max_model_len: int | None = Field(
        None, ge=2, description="context window; default: the model's max_position_embeddings")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="vLLM engine settings")
    ray: RayConfig = Field(default_factory=RayConfig, description="run the engines on Ray actors")
    server: gen.ServerConfig = Field(default_factory=gen.ServerConfig, description="backend openai's")
    overwrite: bool = Field(False, description=OVERWRITE)
    progress: bool = Field(True, description="show a progress bar")
    shard: int = Field(0, ge=0, description="this worker's part of the problems (`--shard R`); "
                       "not part of the folder's identity")
    num_shards: int = Field(1, ge=1, description="workers sharing the folder, each writing its "
                            "own part (`--num-shards N`); not part of the folder's identity")

    @model_validator(mode="after")
    def _shard_in_range(self) -> InferConfig:
        if self.shard >= self.num_shards:
            raise ValueError(f"shard {self.shard} is not below num_shards {self.num_shards}")
        gen.check_backend(self.backend, self.server, self.sampling.logprobs)
        return self

    def inputs(self) -> list[Input]:
        return [Input("model.name_or_path", self.model.name_or_path, "model folder"),
                Input("data.path", self.data.path, "file or folder")]


class FilterConfig(Strict):
    """Sample and group filters, applied in this order (each reports what it removed)."""

    truncated: Literal["negative", "drop"] = Field(
        "negative", description="responses cut at max_tokens: keep as negatives, or drop")
    dedupe: bool = Field(True, description="drop exact duplicate responses within a group")
    min_group_mean_tokens: int | None = Field(
        None, ge=0, description="difficulty: keep groups whose mean response tokens reach this "
        "and that are not all correct (recipe: 32K); null = off"
    )
    drop_zero_variance: bool = Field(True, description="drop groups all correct or all wrong")
    max_positive_tokens: int | None = Field(
        None, ge=1, description="drop correct responses longer than this (recipe: 48K)")


class DecontamConfig(Strict):
    """Drop problems too close to benchmark problems."""

    benchmarks: list[DataConfig] = Field(
        default_factory=list, description="benchmark problem files / ids (fields mappable)")
    method: Literal["ngram", "embedding"] = Field(
        "ngram", description="word n-gram overlap, or all-MiniLM-L6-v2 cosine (extra: decontam)")
    ngram: int = Field(8, ge=1, description="words per n-gram")
    threshold: float = Field(
        0.3, gt=0, le=1, description="ngram: share of a problem's n-grams found in one benchmark "
        "problem; embedding: cosine similarity"
    )


class VerifyConfig(StageConfig):
    """`reasoner verify`: Sample shard -> Verified shard (verdicts, rewards, filters)."""

    outside_identity: ClassVar[tuple[str, ...]] = (
        "workers", "memory_mb", "progress", "overwrite", "judge.batch_size", "judge.vllm",
        "judge.ray", *(f"judge.server.{k}" for k in gen.SERVER_TRANSPORT))

    input_dir: Path = Field(..., description="Sample shard written by `reasoner infer`")
    output_dir: Path = Field(..., description="Verified shard folder")
    mode: Literal["rule", "judge", "rule_then_judge", "both"] = Field(
        "rule", description="rule: math-verify; judge: LLM; rule_then_judge: judge what the rule "
        "rejects; both: run both (final verdict: judge) and report their agreement"
    )
    template: TemplateConfig = Field(default_factory=TemplateConfig, description="tag names")
    workers: int = Field(2, ge=1, description="rule-verifier worker processes")
    timeout_s: float = Field(5.0, gt=0, description="hard wall-clock limit per rule check")
    memory_mb: int = Field(2048, ge=64, description="address-space cap per rule worker")
    invalid: Literal["negative", "drop"] = Field(
        "negative", description="unparseable judge replies: reward -1, or drop the sample")
    timeout: Literal["negative", "drop"] = Field(
        "negative", description="rule checks past their limit: reward -1, or drop the sample")
    extraction: Literal["strict", "flexible"] = Field(
        "strict", description="strict: the final answer (answer tags, \\boxed{}); flexible: the "
        "last number of the response when strict finds no answer at all (lm-eval's GSM8K "
        "flexible-extract), never overriding a strict answer")
    tokenizer: str | None = Field(
        None, description="tokenizer that counts reasoning tokens; default: the samples' model")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="LLM judge")
    filters: FilterConfig = Field(default_factory=FilterConfig, description="filters")
    decontam: DecontamConfig = Field(default_factory=DecontamConfig, description="decontamination")
    progress: bool = Field(True, description="show a progress bar")
    overwrite: bool = Field(False, description=OVERWRITE)

    def inputs(self) -> list[Input]:
        found = [Input("input_dir", str(self.input_dir), "shard folder")]
        if self.mode != "rule":
            found += self.judge.inputs()
        return found + [Input(f"decontam.benchmarks.{i}.path", d.path, "file or folder")
                        for i, d in enumerate(self.decontam.benchmarks)]


class EvalConfig(StageConfig):
    """`reasoner eval aime` / `eval bench`: k samples per problem, rule-verified, with a report."""

    outside_identity: ClassVar[tuple[str, ...]] = (
        "batch_size", "vllm", "ray", "workers", "progress", "tracking", "project", "run_name",
        "overwrite", "model.device", "judge.batch_size", "judge.vllm", "judge.ray",
        *(f"{w}server.{k}" for w in ("", "judge.") for k in gen.SERVER_TRANSPORT))

    model: ModelConfig = Field(..., description="model to evaluate")
    benchmark: str = Field("bench", description="name shown in reports (aime24, gsm8k, ...)")
    data: list[DataConfig] = Field(
        default_factory=list, description="problem sources, read in order (fields mappable)")
    output_dir: Path = Field(..., description="folder for samples, verdicts and the report")
    template: TemplateConfig = Field(default_factory=TemplateConfig, description="prompt rendering")
    sampling: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(n=32, max_tokens=32768),
        description="k = sampling.n samples per problem (the recipe: avg@32)",
    )
    backend: Literal["auto", "hf", "vllm", "openai"] = Field(
        "auto", description="generation backend (openai: a model server, `server`)")
    batch_size: int = Field(64, ge=1, description="sequences per generate call (hf)")
    max_model_len: int | None = Field(None, ge=2, description="context window")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="vLLM engine settings")
    ray: RayConfig = Field(default_factory=RayConfig, description="run the engines on Ray actors")
    server: gen.ServerConfig = Field(default_factory=gen.ServerConfig, description="backend openai's")
    mode: Literal["rule", "judge", "rule_then_judge", "both"] = Field(
        "rule", description="verifier (see reasoner verify)")
    extraction: Literal["strict", "flexible"] = Field(
        "strict", description="answer extraction (see reasoner verify); with flexible the report "
        "also gives every number under strict extraction")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="optional LLM judge")
    workers: int = Field(2, ge=1, description="rule-verifier worker processes")
    timeout_s: float = Field(5.0, gt=0, description="hard limit per rule check")
    length_buckets: list[int] | None = Field(
        None, description="response-token bucket edges for accuracy by length; null: the "
        "quartiles of the response lengths (buckets that follow the data)")
    bootstrap: int = Field(1000, ge=100, description="bootstrap resamples for the 95% interval")
    seed: int = Field(0, description="bootstrap seed")
    tracking: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list, description="also log the report's numbers there "
        "(install reasoner[tracking])")
    project: str = Field("reasoner", description="wandb project of the eval run")
    run_name: str | None = Field(None, description="wandb run name; default: the output "
                                 "folder's name")
    progress: bool = Field(True, description="show progress bars")
    overwrite: bool = Field(False, description=OVERWRITE)

    @model_validator(mode="after")
    def _server(self) -> EvalConfig:
        gen.check_backend(self.backend, self.server, self.sampling.logprobs)
        return self

    def inputs(self) -> list[Input]:
        found = [Input("model.name_or_path", self.model.name_or_path, "model folder")]
        found += [Input(f"data.{i}.path", d.path, "file or folder")
                  for i, d in enumerate(self.data)]
        return found + (self.judge.inputs() if self.mode != "rule" else [])


class OfflineConfig(TrainerConfig):
    """`reasoner train-offline`: train on a fixed, verified rollout set."""

    outside_identity: ClassVar[tuple[str, ...]] = (*TRAINING_SETTINGS, "objective.diagnostics")

    model: TrainedModelConfig = Field(..., description="policy to train (usually the SFT model)")
    input_dir: Path = Field(..., description="Verified shard from `reasoner verify`")
    output_dir: Path = Field(..., description="checkpoints, metrics and the final model")
    template: TemplateConfig = Field(default_factory=TemplateConfig, description="tag names")
    objective: ObjectiveConfig = Field(
        default_factory=PCLObjective, description="objective, chosen by `name`; each has its own keys"
    )
    reference: str | None = Field(
        None, description="the KL term's reference model (HF id or folder); default the starting "
        "model. Set it to round 1's start to anchor every round to it (ProRL without resets)")
    max_tokens: int = Field(51200, ge=2, description="drop samples longer than this (recipe: 51,200)")
    packing: bool = Field(True, description="pack samples into seq_len rows; false = padded")
    seq_len: int = Field(51200, ge=2, description="tokens per packed row (>= max_tokens)")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="optimiser and schedule")
    run: RunConfig = Field(
        default_factory=lambda: RunConfig(global_batch=128),
        description="global_batch counts samples here; micro_batch counts rows",
    )
    overwrite: bool = Field(False, description=OVERWRITE)

    @model_validator(mode="after")
    def _reference_is_used(self) -> OfflineConfig:
        obj = self.objective
        if self.reference is None:
            return self
        if not obj.needs_reference:
            raise ValueError(f"reference is only used by a KL term: objective {obj.name} has "
                             "none here (set objective.kl_coef > 0, or drop reference)")
        if obj.moves_reference:
            raise ValueError(f"reference and objective.{obj.reference_moved_by} disagree: a moving "
                             "or reset reference starts from the policy; drop one of them")
        return self

    @field_validator("objective", mode="before")
    @classmethod
    def _default_objective(cls, value: Any) -> Any:
        """An objective section without `name` is the default objective (pcl)."""
        if isinstance(value, dict) and "name" not in value:
            return {"name": "pcl", **value}
        return value

    def inputs(self) -> list[Input]:
        found = [Input("model.name_or_path", self.model.name_or_path, "model folder"),
                 Input("input_dir", str(self.input_dir), "shard folder")]
        if self.reference is not None:
            found.append(Input("reference", self.reference, "model folder"))
        return found


class TinyConfig(StageConfig):
    """`reasoner model tiny`: build a tiny Qwen2 model and BPE tokenizer from scratch."""

    outside_identity: ClassVar[tuple[str, ...]] = ("overwrite",)

    output_dir: Path = Field(..., description="HF folder to write (config, safetensors, tokenizer)")
    corpus: list[Path] = Field(
        default_factory=list,
        description="shard folders or JSONL files whose text trains the tokenizer; empty = synthetic text",
    )
    model: TinyModelConfig = Field(default_factory=TinyModelConfig, description="model shape")
    template: TemplateConfig = Field(default_factory=TemplateConfig, description="tags to keep whole")
    overwrite: bool = Field(False, description="replace an existing output folder")

    def inputs(self) -> list[Input]:
        return [Input(f"corpus.{i}", str(p), "file or folder") for i, p in enumerate(self.corpus)]
