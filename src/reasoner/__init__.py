"""reasoner: offline-RL pipeline for math reasoning LLMs (SFT, infer, verify, train-offline, eval)."""

__version__ = "0.1.0"
