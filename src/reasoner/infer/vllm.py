"""`vllm` backend: a vLLM engine with one SamplingParams (and seed) per request.

Requests go to the engine all at once and come back as each finishes (its step loop), so the
caller writes every sample as soon as it exists and no request waits for a slower neighbour.
Ascend NPUs use the same code through the vllm-ascend plugin; CPUs through the `vllm-cpu`
package (`scripts/install_vllm_cpu.sh`).

What a completion means is the same on both backends (tests/integration/test_vllm.py checks it
against `hf` on the same prompts and seeds):
- token_ids: the generated tokens, up to and including the one that stopped the sample (eos,
  end of turn, or the token that completed a stop string);
- text: those tokens decoded without special tokens, so it keeps a stop string, and a sample
  cut inside a multi-byte character ends in U+FFFD, as its tokens do;
- logprobs: under the distribution the token was drawn from (temperature, top-k, top-p;
  vLLM's `processed_logprobs` mode); greedy decoding draws from a point mass, so 0.0;
- finish reasons: stop, length, and vLLM's abort / error kept as they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from reasoner.config import ModelConfig, SamplingConfig, VLLMConfig
from reasoner.data.template import stop_token_ids
from reasoner.errors import DependencyError
from reasoner.infer.base import Completion, Request, Streaming

GIB = 1 << 30


def vllm_missing_message() -> str:
    return ("backend 'vllm' needs vLLM: on a GPU pip install 'reasoner[vllm]' (on Ascend also "
            "vllm-ascend); on a CPU run scripts/install_vllm_cpu.sh; or set backend=hf")


def finish_reason(vllm_reason: str | None) -> str:
    """vLLM's reason as ours: stop (an eos, stop token or stop string), length, and abort or
    error kept as they are (never passed off as a completed answer)."""
    if vllm_reason in ("length", "abort", "error"):
        return vllm_reason
    return "stop" if vllm_reason == "stop" else "error"


def engine_args(cfg: ModelConfig, engine: VLLMConfig, max_model_len: int | None, seed: int,
                want_logprobs: bool, on_cpu: bool) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments for our settings.

    On a CPU: fp32 for dtype auto (as the hf backend; vLLM's own auto is bf16 there), a KV
    cache of `engine.cpu_kv_cache_gib` (vLLM's default takes 90% of RAM and a minute to
    zero it), and no chunked prefill: with it, vLLM 0.32's CPU runner crashes on seeded
    requests whose prefill is split across steps ("CPU Generator does not use offset")."""
    dtype = cfg.dtype
    if dtype == "auto" and on_cpu:
        dtype = "float32"
    kwargs: dict[str, Any] = {
        "model": cfg.name_or_path, "tensor_parallel_size": engine.tensor_parallel_size,
        "seed": seed, "trust_remote_code": cfg.trust_remote_code,
        "enforce_eager": engine.enforce_eager, "dtype": dtype,
    }
    if max_model_len:
        kwargs["max_model_len"] = max_model_len
    if engine.max_num_seqs:
        kwargs["max_num_seqs"] = engine.max_num_seqs
    if want_logprobs:
        kwargs["logprobs_mode"] = "processed_logprobs"
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = int(engine.cpu_kv_cache_gib * GIB)
        kwargs["enable_chunked_prefill"] = False
        # without chunking one step must hold a whole prompt
        kwargs["max_num_batched_tokens"] = max(8192, max_model_len or _model_window(cfg))
    else:
        kwargs["gpu_memory_utilization"] = engine.gpu_memory_utilization
    return kwargs


def engine_env(engine: VLLMConfig, on_cpu: bool) -> dict[str, str]:
    """Environment for the engine. On a CPU with one worker, the engine core and its worker
    run in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`; vLLM's CPU platform then keeps its
    one-process executor): by default each would be a new process that imports torch and vLLM
    again. Measured on a slow 2-core Xeon: engine start 6.3 -> 2.2 minutes, a whole stage
    764 -> 327 s, the same 96 samples token for token (docs/testing.md). On a GPU vLLM's separate
    engine process overlaps scheduling with the model's steps: left as it is."""
    if on_cpu and engine.tensor_parallel_size == 1:
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return {}


def _model_window(cfg: ModelConfig) -> int:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(cfg.name_or_path, trust_remote_code=cfg.trust_remote_code)
    return int(getattr(config, "max_position_embeddings", 0) or 0)


def sampling_params(sampling: SamplingConfig, r: Request, stop_ids: list[int]) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        n=1, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
        max_tokens=r.max_tokens, stop=sampling.stop or None, stop_token_ids=stop_ids,
        include_stop_str_in_output=True, seed=r.seed,
        logprobs=0 if sampling.logprobs else None, output_kind=RequestOutputKind.FINAL_ONLY)


class VLLMGenerator(Streaming):
    name = "vllm"

    def __init__(self, cfg: ModelConfig, engine: VLLMConfig, max_model_len: int | None,
                 seed: int, want_logprobs: bool):
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as exc:
            raise DependencyError(vllm_missing_message()) from exc
        on_cpu = current_platform.is_cpu()
        for key, value in engine_env(engine, on_cpu).items():
            os.environ.setdefault(key, value)  # a value the user set wins
        self.llm = LLM(**engine_args(cfg, engine, max_model_len, seed, want_logprobs,
                                     on_cpu=on_cpu))
        self.tokenizer = self.llm.get_tokenizer()
        self.context_window = int(self.llm.llm_engine.model_config.max_model_len)
        self.preferred_batch = engine.max_pending
        self.calls = 0  # stream calls so far: request ids are "call:index"
        # vLLM stops on the generation config's eos; the chat template's end of turn is added
        # (a Qwen2.5 base checkpoint's config knows only <|endoftext|>)
        self.stop_ids = stop_token_ids(self.tokenizer)
        self.device = "cpu" if on_cpu else str(current_platform.device_type)

    def engine_info(self) -> dict[str, str]:
        import vllm

        dtype = self.llm.llm_engine.model_config.dtype
        return {"backend": "vllm", "engine": f"vllm {vllm.__version__}",
                "dtype": str(dtype).removeprefix("torch."), "device": self.device}

    def stream(self, requests: list[Request], sampling: SamplingConfig
               ) -> Iterator[tuple[int, Completion]]:
        """Keeps up to `preferred_batch` requests in the engine, topping it up as each
        finishes; yields every request as it finishes. Request ids carry this call's number,
        and a call left early (an exception, a closed generator) aborts what it left behind."""
        engine = self.llm.llm_engine
        self.calls += 1
        tag = f"{self.calls}:"
        pending = iter(enumerate(requests))
        in_engine: set[str] = set()

        def top_up() -> None:
            for i, r in pending:
                rid = f"{tag}{i}"
                engine.add_request(rid, {"prompt_token_ids": list(r.prompt_ids)},
                                   sampling_params(sampling, r, self.stop_ids))
                in_engine.add(rid)
                if len(in_engine) >= self.preferred_batch:
                    break

        try:
            top_up()
            while in_engine:
                for out in engine.step():
                    if not out.finished or out.request_id not in in_engine:
                        continue
                    in_engine.discard(out.request_id)
                    yield int(out.request_id[len(tag):]), self._completion(out.outputs[0], sampling)
                top_up()
        finally:
            if in_engine:
                engine.abort_request(sorted(in_engine))

    def _completion(self, c: Any, sampling: SamplingConfig) -> Completion:
        ids = list(c.token_ids)
        logprobs = None
        if sampling.logprobs:
            if sampling.temperature == 0:
                logprobs = [0.0] * len(ids)  # greedy: a point mass, as in the hf backend
            elif c.logprobs is not None:
                logprobs = [step[t].logprob for step, t in zip(c.logprobs, ids, strict=True)]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(ids, text, finish_reason(c.finish_reason), logprobs)

    def close(self) -> None:
        del self.llm
