"""reasoner: offline-RL pipeline for math reasoning LLMs (SFT, infer, verify, train-offline, eval)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("reasoner")  # the installed metadata: pyproject.toml's `version`
except PackageNotFoundError:  # a source tree put on PYTHONPATH without installing it
    __version__ = "0+unknown"
