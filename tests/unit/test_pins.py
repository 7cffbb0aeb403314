"""The version pins in pyproject.toml admit only versions that have the APIs the code calls."""

import inspect
import re
from pathlib import Path

import tomllib
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

# (package, the API the code calls, where, the first release that has it). Every private or
# recent torch, transformers and vLLM API the code calls; each release read from that version's
# own source (torch: the x.0 wheels' Python files and libtorch_cpu symbols).
NEEDS = [
    ("torch", "FSDPModule.set_force_sum_reduction_for_comms", "models/fsdp.py", "2.8"),
    ("torch", "fully_shard(..., ignored_params=...)", "models/fsdp.py", "2.7"),
    ("torch", "torch.distributed.fsdp.fully_shard (public)", "models/fsdp.py", "2.6"),
    ("torch", "_functional_collectives.all_gather_tensor_autograd / all_to_all_single_autograd",
     "models/sequence_parallel.py", "2.4"),
    ("torch", "F.rms_norm", "infer/decode_step.py", "2.4"),
    ("torch", "F.scaled_dot_product_attention(..., enable_gqa=...)", "infer/decode_step.py", "2.5"),
    ("torch", "torch.ops.mkldnn._reorder_linear_weight / _linear_pointwise",
     "infer/decode_step.py", "2.1"),
    ("torch", "torch.ops.mkldnn._is_mkldnn_bf16_supported", "cpu.py", "2.1"),
    ("torch", "torch.cpu._is_avx512_bf16_supported / _is_amx_tile_supported", "cpu.py", "2.5"),
    ("torch", "torch.backends.cpu.get_cpu_capability", "cpu.py", "2.1"),
    ("torch", "torch.distributed.tensor (public DTensor, Shard)", "models/vocab_parallel.py",
     "2.5"),
    ("torch", "DTensor.from_local(..., shape=..., stride=...)", "models/vocab_parallel.py", "2.2"),
    ("torch", "distributed.checkpoint.state_dict (get/set_model_state_dict, StateDictOptions)",
     "training/checkpoints.py", "2.2"),
    ("torch", "TORCH_DEVICE_BACKEND_AUTOLOAD (torch_npu loaded by `import torch`)", "hccl.py",
     "2.5"),
    ("transformers", "AutoModel.from_pretrained(dtype=...)", "models/load.py", "5.0"),
    ("transformers", "AttentionInterface.register", "models/sequence_parallel.py", "4.51"),
    ("vllm", "LLM(logprobs_mode='processed_logprobs')", "infer/vllm.py", "0.10.2"),
]

# Names newer than the floor that the code must not call (each raises ImportError or lacks a
# backward on an older torch inside the range): name -> (its first release, what to call).
TOO_NEW = {
    "all_gather_single": ("2.13", "all_gather_tensor_autograd"),  # the 2026 rename
}

def bounds(package: str) -> tuple[Version | None, Version | None]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    deps = project["dependencies"] + [d for extra in project["optional-dependencies"].values()
                                      for d in extra]
    spec = next(d for d in deps if re.match(rf"{package}\b", d))
    low = re.search(r">=\s*([\d.]+)", spec)
    high = re.search(r"<\s*([\d.]+)", spec)
    return (Version(low.group(1)) if low else None, Version(high.group(1)) if high else None)


def test_lower_bounds_are_the_versions_whose_apis_the_code_calls():
    for package, api, where, first in NEEDS:
        low, _ = bounds(package)
        assert low is not None and low >= Version(first), \
            f"{package}>={low} admits versions without {api} ({where}, new in {first})"


def test_the_code_calls_no_api_newer_than_the_floor():
    """A name first released above the torch floor fails only where an older torch is installed:
    the first sequence-parallel micro-batch of a 32B run, after the load (issue #50)."""
    low, _ = bounds("torch")
    src = PYPROJECT.parent / "src" / "reasoner"
    for path in src.rglob("*.py"):
        text = path.read_text()
        for name, (first, instead) in TOO_NEW.items():
            if Version(first) > low:
                assert not re.search(rf"\b{name}\b", text), \
                    f"{path.relative_to(src)} calls {name} (torch {first}); call {instead}"


def test_the_installed_versions_have_those_apis_and_sit_inside_the_pins():
    import torch
    import torch.nn.functional as F
    import transformers
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.checkpoint.state_dict import StateDictOptions  # noqa: F401
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor, Shard  # noqa: F401
    from transformers import AttentionInterface

    assert "ignored_params" in inspect.signature(fully_shard).parameters
    assert hasattr(FSDPModule, "set_force_sum_reduction_for_comms")
    assert hasattr(funcol, "all_gather_tensor_autograd") and hasattr(funcol,
                                                                     "all_to_all_single_autograd")
    assert hasattr(F, "rms_norm") and hasattr(AttentionInterface, "register")
    assert {"shape", "stride"} <= set(inspect.signature(DTensor.from_local).parameters)
    for op in ("_reorder_linear_weight", "_linear_pointwise", "_is_mkldnn_bf16_supported"):
        assert hasattr(torch.ops.mkldnn, op), op
    assert hasattr(torch.cpu, "_is_avx512_bf16_supported") and hasattr(torch.cpu,
                                                                       "_is_amx_tile_supported")
    assert callable(torch.backends.cpu.get_cpu_capability)
    for package, module in (("torch", torch), ("transformers", transformers)):
        low, high = bounds(package)
        installed = Version(Version(module.__version__).base_version)
        assert low <= installed and (high is None or installed < high), (package, installed)
