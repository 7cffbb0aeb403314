"""The sizes of a decoder-only transformer (Llama / Qwen2 / Qwen3 layout), read from a model's
config.json or, for the models the shipped recipes name, known here without a download:
what the memory plan and the vocabulary layout count from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from reasoner.errors import ConfigError

# Shapes of the models the shipped recipes name, for planning without downloading them
# (each model's config.json on the hub).
KNOWN = {
    "Qwen/Qwen2.5-32B": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                             num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                             tie_word_embeddings=False, attention_bias=True),
    "Qwen/Qwen3-32B": dict(model_type="qwen3", hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                           num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                           vocab_size=151936, tie_word_embeddings=False),
    "internlm/OREAL-32B-SFT": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                                   num_attention_heads=40, num_key_value_heads=8,
                                   vocab_size=152064, tie_word_embeddings=False,
                                   attention_bias=True),
    "Qwen/Qwen2.5-7B-Instruct": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                     num_attention_heads=28, num_key_value_heads=4,
                                     vocab_size=152064, tie_word_embeddings=False,
                                     attention_bias=True),
    "Qwen/Qwen2.5-0.5B-Instruct": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                       num_attention_heads=14, num_key_value_heads=2,
                                       vocab_size=151936, tie_word_embeddings=True,
                                       attention_bias=True),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                       num_attention_heads=12, num_key_value_heads=2,
                                       vocab_size=151936, tie_word_embeddings=True,
                                       attention_bias=True),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=False, attention_bias=True),
}

@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's sizes (Llama / Qwen2 / Qwen3 layout)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm on each head's queries and keys

    @property
    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden + (q + 2 * kv if self.bias else 0)
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return attn + 3 * self.hidden * self.intermediate + norms

    @property
    def root_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def _linear_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of a decoder layer, by name."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q_proj": (self.hidden, q), "k_proj": (self.hidden, kv),
                "v_proj": (self.hidden, kv), "o_proj": (q, self.hidden),
                "gate_proj": (self.hidden, self.intermediate),
                "up_proj": (self.hidden, self.intermediate),
                "down_proj": (self.intermediate, self.hidden)}

    def lora_params(self, r: int, targets: list[str]) -> int:
        """Parameters of rank-`r` LoRA adapters (A: r x in, B: out x r) on the linear layers
        named `targets` of every decoder layer."""
        dims = self._linear_dims()
        return self.layers * sum(r * sum(dims[t]) for t in targets if t in dims)

    def lora_inputs(self, targets: list[str]) -> int:
        """Input features of the linear layers named `targets` of one decoder layer, added up:
        PEFT casts each one's input to its fp32 adapters (a copy a target, saved)."""
        dims = self._linear_dims()
        return sum(dims[t][0] for t in targets if t in dims)

    def activation_bytes_per_token(self, dtype_bytes: int) -> int:
        """Saved activations of one layer per token (flash / sdpa attention: no T^2 term)."""
        kv = self.kv_heads * self.head_dim
        return dtype_bytes * (7 * self.hidden + 2 * kv + 4 * self.intermediate)

    def kv_cache_bytes_per_token(self, dtype_bytes: int, tp: int) -> float:
        kv_local = max(1.0, self.kv_heads / tp)
        return 2 * self.layers * kv_local * self.head_dim * dtype_bytes


def shape_from_config(c: dict) -> Shape:
    heads = c["num_attention_heads"]
    return Shape(c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], heads,
                 c.get("num_key_value_heads") or heads,
                 c.get("head_dim") or c["hidden_size"] // heads, c["vocab_size"],
                 bool(c.get("tie_word_embeddings", False)),
                 bool(c.get("attention_bias", c.get("model_type") == "qwen2")),
                 c.get("model_type") == "qwen3")


def shape_of(name_or_path: str) -> Shape:
    """From a local folder's config.json, the hub cache, or the shapes above."""
    path = Path(name_or_path) / "config.json"
    if path.exists():
        return shape_from_config(json.loads(path.read_text()))
    if name_or_path in KNOWN:
        return shape_from_config(KNOWN[name_or_path])
    try:
        from huggingface_hub import hf_hub_download

        cached = hf_hub_download(name_or_path, "config.json", local_files_only=True)
        return shape_from_config(json.loads(Path(cached).read_text()))
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"{name_or_path}: no config.json to plan from (not a local folder, "
                          f"not in the hub cache, not one of {', '.join(KNOWN)})") from exc


def count_parameters(name_or_path: str | Path) -> int:
    return shape_of(str(name_or_path)).params
