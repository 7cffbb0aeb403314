"""The hf backend's decode step (one new token per row) for Llama-family models, without the
layers of transformers' generic forward around it.

A decode step of a 135M model at batch 64 is some 200 small matmuls and a few thousand other
small ops; transformers' forward adds, per layer, its decorators, keyword plumbing, attention
dispatch and output bookkeeping. This step calls the model's own modules (embedding, MLP
activation, rotary embedding, the model file's own `apply_rotary_pos_emb`, for q and k at once;
RMSNorm as torch's fused `F.rms_norm`, the module's numbers bit for bit) in the order the
model's forward calls them, with q, k and v as one matmul and gate and up as one, and
scaled-dot-product attention with the arguments transformers' `sdpa` attention passes for one
query token (query heads packed per key/value head, the padding mask as booleans, no mask when
no row is padded). In fp32 the logits are therefore `model(...)`'s bit for bit (tested). In
bf16 on a CPU it takes faster kernels where they exist: weights prepacked once for oneDNN (the
same numbers bit for bit) and grouped-query sdpa with the mask (one bf16 rounding apart). The
prefill, one large forward per group of prompts, still goes through `model(...)`.

Supported: the architectures whose decoder layer is Llama's (`SUPPORTED`: pre-norm RMSNorm,
q/k/v/o projections with optional bias, rotary embedding, gated SiLU MLP) with sdpa attention
and full attention in every layer. Anything else decodes through `model(...)`.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from reasoner import cpu

SUPPORTED = ("llama", "qwen2", "mistral")
NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm")


class DecodeStep:
    """`step(ids (B, 1), mask (B, T), positions (B, 1), cache)` -> (B, V) float logits of the
    new token, `cache` (a `kv_cache.new_cache`) taking its keys and values."""

    def __init__(self, model):
        inner = model.model
        self.embed, self.rotary = inner.embed_tokens, inner.rotary_emb
        layers = list(inner.layers[:model.config.num_hidden_layers])
        param = next(model.parameters())
        # oneDNN's prepack where its bf16 kernels run (it refuses an AVX2-only CPU: reasoner.cpu)
        pack = param.dtype == torch.bfloat16 and param.device.type == "cpu" \
            and cpu.features().prepacks_bf16
        # one matmul for q, k and v, one for gate and up: the modules' weights become views of
        # the joined ones (no second copy of the model)
        # (q and k come out side by side: their rotary embedding is one call)
        self.qkv = [_Linear(pack, a.q_proj, a.k_proj, a.v_proj, split=[
            a.q_proj.out_features + a.k_proj.out_features, a.v_proj.out_features])
            for a in (layer.self_attn for layer in layers)]
        self.o = [_Linear(pack, layer.self_attn.o_proj) for layer in layers]
        self.gate_up = [_Linear(pack, layer.mlp.gate_proj, layer.mlp.up_proj)
                        for layer in layers]
        self.down = [_Linear(pack, layer.mlp.down_proj) for layer in layers]
        self.lm_head = _Linear(pack, model.lm_head)
        attn = layers[0].self_attn
        self.rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        self.head_dim = attn.head_dim
        self.groups = attn.num_key_value_groups
        self.scaling = attn.scaling
        self.q_heads = attn.q_proj.out_features // attn.head_dim
        # RMSNorm as torch's fused op: the same numbers as the module's own (tested), in four
        # ops instead of eight (bf16: casts, squares, mean, rsqrt, products); another norm class
        # runs as itself
        self.norms = [[_norm(layer.input_layernorm), _norm(layer.post_attention_layernorm)]
                      for layer in layers]
        self.final_norm = _norm(inner.norm)
        # below fp32, grouped-query attention with the padding mask runs on the CPU's sdpa kernel
        # in about 3/4 of the time of transformers' packed query heads (one bf16 rounding
        # apart); fp32 keeps transformers' call, and with it its logits bit for bit
        self.half_gqa = param.dtype != torch.float32 and param.device.type == "cpu"

    @classmethod
    def for_model(cls, model) -> DecodeStep | None:
        """The step for `model`, or None when its forward is not the one this step replicates."""
        cfg = model.config
        if getattr(cfg, "model_type", None) not in SUPPORTED \
                or getattr(cfg, "_attn_implementation", None) != "sdpa" \
                or getattr(cfg, "hidden_act", None) != "silu" \
                or getattr(cfg, "pretraining_tp", 1) != 1 \
                or any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []) \
                or getattr(cfg, "use_sliding_window", False) \
                or model.training:
            return None
        return cls(model)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache) -> torch.Tensor:
        h = self.embed(ids)  # (B, 1, H)
        cos, sin = self.rotary(h, positions)
        # transformers' sdpa mask for one query token: none when no row is padded
        padded = None if bool(mask.all()) else mask.bool()[:, None, None, :]  # (B, 1, 1, T)
        for i, (before, after) in enumerate(self.norms):
            residual = h
            h = residual + self._attention(i, before(h), cos, sin, padded, cache.layers[i])
            residual = h
            gate, up = self.gate_up[i](after(h))
            h = residual + self.down[i](F.silu(gate) * up)[0]
        return self.lm_head(self.final_norm(h)[:, -1:, :])[0][:, -1].float()

    def _attention(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   padded: torch.Tensor | None, cache_layer) -> torch.Tensor:
        b, d = x.shape[0], self.head_dim
        qk, v = (t.view(b, 1, -1, d).transpose(1, 2) for t in self.qkv[i](x))  # (B, H, 1, D)
        qk = self.rope(qk, qk[:, :0], cos, sin)[0]  # the same elementwise ops as q and k apart
        q, k = qk[:, :self.q_heads], qk[:, self.q_heads:]
        k, v = cache_layer.update(k, v)  # (B, Hkv, T, D)
        if self.groups == 1:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=padded, dropout_p=0.0,
                                                 scale=self.scaling, is_causal=False)
        elif padded is None or self.half_gqa:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=padded, dropout_p=0.0,
                                                 scale=self.scaling, is_causal=False,
                                                 enable_gqa=True)
        else:  # the query heads of one key/value head as its queries: no copy of the cache
            out = F.scaled_dot_product_attention(q.reshape(b, k.shape[1], self.groups, d), k, v,
                                                 attn_mask=padded, dropout_p=0.0,
                                                 scale=self.scaling, is_causal=False)
        out = out.reshape(b, -1, 1, d).transpose(1, 2).contiguous()  # (B, 1, Hq, D)
        return self.o[i](out.reshape(b, 1, -1).contiguous())[0]


class _Linear:
    """One or more linear layers on one input as one matmul, split back: `(x) -> (outputs...)`.
    Several are joined into one weight, and the modules' weights become views of it (the
    prefill, through `model(...)`, reads the same memory). Each output column is the same dot
    product as in its own layer's matmul (tested bit for bit against transformers' forward in
    fp32).

    With `pack` (bf16 on a CPU with oneDNN) the weight is also kept in oneDNN's blocked layout,
    reordered once here: `F.linear` reorders a bf16 weight for the AMX / AVX512-BF16 kernels at
    every call, which at decode shapes costs as much as the matmul (measured on SmolLM2's
    shapes at batch 64: 1.5-2.3x faster packed, the same numbers bit for bit). The packed copy
    is the one extra copy of the linear weights this step keeps."""

    def __init__(self, pack: bool, *linears: torch.nn.Linear, split: list[int] | None = None):
        self.sizes = [lin.out_features for lin in linears]
        if len(linears) == 1:
            self.weight, self.bias = linears[0].weight.detach(), linears[0].bias
        else:
            self.weight = torch.cat([lin.weight.detach() for lin in linears])
            biases = [lin.bias for lin in linears]
            if len({b is None for b in biases}) > 1:
                raise ValueError("linear layers with and without bias cannot be joined")
            self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
            start = 0
            for lin, size in zip(linears, self.sizes, strict=True):
                lin.weight = torch.nn.Parameter(self.weight[start:start + size],
                                                requires_grad=False)
                if self.bias is not None:
                    lin.bias = torch.nn.Parameter(self.bias[start:start + size],
                                                  requires_grad=False)
                start += size
        if self.bias is not None:
            self.bias = self.bias.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, 64) if pack else None
        if split is not None:  # outputs cut otherwise than by layer
            if sum(split) != sum(self.sizes):
                raise ValueError(f"split {split} does not add up to {sum(self.sizes)} outputs")
            self.sizes = split

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.packed is not None:
            out = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        else:
            out = F.linear(x, self.weight, self.bias)
        return out.split(self.sizes, -1) if len(self.sizes) > 1 else (out,)


def _norm(module):
    """`module` (an RMSNorm of the Llama family) as `F.rms_norm` over fp32, cast back and
    scaled by its weight: the module's own arithmetic (x * rsqrt(mean(x^2) + eps) in fp32, then
    weight * that in the input's dtype) with the reduction and its products fused."""
    eps = getattr(module, "variance_epsilon", None)
    if type(module).__name__ not in NORMS or eps is None:
        return module

    def norm(x: torch.Tensor) -> torch.Tensor:
        return module.weight * F.rms_norm(x.float(), x.shape[-1:], None, eps).to(x.dtype)
    return norm



def greedy_logits(model, step, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """The logits (steps, rows, V) of `steps` greedy decode steps of `step` (a DecodeStep of
    `model`, or any callable of its signature) after `model` prefills the unpadded prompts `ids`
    (rows, P): the check that a step computes what `model(...)` does, and the loop its
    benchmark times."""
    from reasoner.infer.kv_cache import new_cache

    rows, prompt = ids.shape
    mask = torch.ones_like(ids)
    positions = torch.arange(prompt).expand(rows, prompt)
    cache = new_cache(model.config)
    out = []
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
              use_cache=True)
        ids, positions = ids[:, -1:], positions[:, -1:]
        for _ in range(steps):
            mask = torch.cat([mask, torch.ones_like(ids)], 1)
            positions = positions + 1
            logits = step(ids, mask, positions, cache)  # (rows, V)
            out.append(logits)
            ids = logits.argmax(-1, keepdim=True)
    return torch.stack(out)
