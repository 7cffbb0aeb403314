"""`vllm` backend: `vllm.LLM` with one SamplingParams (and seed) per request.

Ascend NPUs use the same code through the vllm-ascend plugin (install it next to vllm; vLLM
picks the platform up itself). Behaviour log-probs are requested in vLLM's
`processed_logprobs` mode, i.e. after temperature / top-k / top-p, as in the hf backend.
"""

from __future__ import annotations

from typing import Any

from reasoner.config import ModelConfig, SamplingConfig, VLLMConfig
from reasoner.data.template import stop_token_ids
from reasoner.errors import DependencyError
from reasoner.infer.base import Completion, Request


def vllm_missing_message() -> str:
    return ("backend 'vllm' needs vLLM: pip install 'reasoner[vllm]' (on Ascend also "
            "vllm-ascend), or set backend=hf")


def finish_reason(vllm_reason: str | None) -> str:
    """vLLM's reason as ours: stop (an eos, stop token or stop string), length, and abort or
    error kept as they are (never passed off as a completed answer)."""
    if vllm_reason in ("length", "abort", "error"):
        return vllm_reason
    return "stop" if vllm_reason == "stop" else "error"


class VLLMGenerator:
    name = "vllm"

    def __init__(self, cfg: ModelConfig, engine: VLLMConfig, max_model_len: int | None,
                 seed: int, want_logprobs: bool):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise DependencyError(vllm_missing_message()) from exc
        kwargs: dict[str, Any] = {
            "model": cfg.name_or_path, "tensor_parallel_size": engine.tensor_parallel_size,
            "gpu_memory_utilization": engine.gpu_memory_utilization, "seed": seed,
            "trust_remote_code": cfg.trust_remote_code, "enforce_eager": engine.enforce_eager,
            "dtype": "auto" if cfg.dtype == "auto" else cfg.dtype,
        }
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        if engine.max_num_seqs:
            kwargs["max_num_seqs"] = engine.max_num_seqs
        if want_logprobs:
            kwargs["logprobs_mode"] = "processed_logprobs"
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.context_window = int(self.llm.llm_engine.model_config.max_model_len)
        self.preferred_batch = 4096  # continuous batching: hand vLLM plenty at once
        # vLLM stops on the generation config's eos; the chat template's end of turn is added
        # (a Qwen2.5 base checkpoint's config knows only <|endoftext|>)
        self.stop_ids = stop_token_ids(self.tokenizer)

    def generate(self, requests: list[Request], sampling: SamplingConfig) -> list[Completion]:
        from vllm import SamplingParams

        params = [SamplingParams(
            n=1, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1, max_tokens=r.max_tokens,
            stop=sampling.stop or None, stop_token_ids=self.stop_ids, seed=r.seed, logprobs=0 if sampling.logprobs else None,
            skip_special_tokens=True,
        ) for r in requests]
        prompts = [{"prompt_token_ids": r.prompt_ids} for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        completions = []
        for out in outputs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            logprobs = None
            if sampling.logprobs and c.logprobs is not None:
                logprobs = [step[t].logprob for step, t in zip(c.logprobs, ids, strict=True)]
            finish = finish_reason(c.finish_reason)
            completions.append(Completion(ids, c.text, finish, logprobs))
        return completions

    def close(self) -> None:
        del self.llm
