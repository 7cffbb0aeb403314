"""The version pins in pyproject.toml admit only versions that have the APIs the code calls."""

import inspect
import re
from pathlib import Path

import tomllib
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

# (package, the API the code calls, where, the first release that has it)
NEEDS = [
    ("torch", "FSDPModule.set_force_sum_reduction_for_comms", "models/fsdp.py", "2.8"),
    ("torch", "fully_shard(..., ignored_params=...)", "models/fsdp.py", "2.7"),
    ("torch", "torch.distributed.fsdp.fully_shard (public)", "models/fsdp.py", "2.6"),
    ("transformers", "AutoModel.from_pretrained(dtype=...)", "models/load.py", "5.0"),
    ("vllm", "LLM(logprobs_mode='processed_logprobs')", "infer/vllm.py", "0.10.2"),
]


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


def test_the_installed_versions_have_those_apis_and_sit_inside_the_pins():
    import torch
    import transformers
    from torch.distributed.fsdp import FSDPModule, fully_shard

    assert "ignored_params" in inspect.signature(fully_shard).parameters
    assert hasattr(FSDPModule, "set_force_sum_reduction_for_comms")
    for package, module in (("torch", torch), ("transformers", transformers)):
        low, high = bounds(package)
        installed = Version(Version(module.__version__).base_version)
        assert low <= installed and (high is None or installed < high), (package, installed)
