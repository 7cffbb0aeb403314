"""Which engine generates in this process: the `hf` decode loop or vLLM.

`reasoner infer`, `eval` and the judge build theirs through reasoner.infer.make_generator, which
puts them on Ray actors when asked; each actor builds its own engine here (this module imports
neither of them, so the actor and the stage do not import each other).
"""

from __future__ import annotations

from reasoner.config import ModelConfig, VLLMConfig
from reasoner.infer.base import Generator


def pick_backend(backend: str) -> str:
    """`auto` -> vllm when it is installed and a GPU or NPU is present, else hf."""
    if backend != "auto":
        return backend
    from importlib.util import find_spec

    from reasoner import device as dev

    return "vllm" if find_spec("vllm") and (dev.cuda_available() or dev.npu_available()) else "hf"


def local_generator(model: ModelConfig, backend: str, engine: VLLMConfig,
                    max_model_len: int | None = None, seed: int = 0, logprobs: bool = False,
                    batch_size: int = 64) -> Generator:
    """A generator for `model` on `backend` (auto resolved here, by this process's devices)."""
    if pick_backend(backend) == "vllm":
        from reasoner.infer.vllm import VLLMGenerator

        return VLLMGenerator(model, engine, max_model_len, seed, logprobs)
    from reasoner.infer.hf import HFGenerator

    return HFGenerator(model, batch_size)
