"""One decoding step of a Llama-family model (Llama, Qwen2, Mistral without a sliding window),
written out for one new token a row: what r1kit's decoding loop (r1kit.sampling.decode) runs after
the prefill for these models.

    step = LlamaStep.of(model, rows=128, attention=decode_attention)   # None: the model's forward pass does it
    logits = step(tokens, positions, attend, cache)   # [B] tokens, [B, 1] positions, [B, L] mask

The same products in the same precision at each point as the model's forward pass (under
autocast too: the norms and the residual stream in the weights' dtype, the products, keys and
values in the autocast dtype), with the modules' own weights (packed by r1kit.hardware.cpu.packed_linears
where the loop packs them) and the model's own norms and rotary embedding: the logits are the forward
pass's bit for bit with torch's own products (a test compares every step's in float32, bfloat16
and under autocast), and were so with oneDNN's joined products on the 2-core machine measured
(oneDNN does not promise it; the test allows rounding there). What it
leaves out is the machinery around the products: per token and layer the forward pass runs some
hundred small operations (module calls, reshapes, autocast's casts of the activations and of the
cached keys and values at each product), which on a CPU cost about as much as the products for a
small model at a few dozen rows. Here a layer is some forty operations with autocast off: the
query, key and value projections are one product, as are the gate and up projections (their
weights side by side, packed once per decoding call where the loop packs weights: another copy of
those weights while it runs), and keys and values are
cached in the precision of the products. On SmolLM2-135M, 128 samples of 64 tokens on 2 cores,
decoding ran 1.03-1.18x as fast as with the forward pass in float32 and 1.12-1.16x in bfloat16,
and 1.06-1.15x with 16 samples of 32 tokens (bench/sampling.py --model-forward, two runs each).

Not here: the prefill (several tokens a row), sliding-window or other attention variants, any
model whose layers are not plain ``nn.Linear`` (adapters, quantized layers): `of` returns None
for them and the loop uses the model's forward pass.
"""

from __future__ import annotations

import torch

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class LlamaStep:
    """A decoding step of `model` (see the module); build it with `of`."""

    def __init__(self, model, rows: int, attention, dtype: torch.dtype | None):
        self.model, self.attention = model, attention
        self.qkv = [_Joined([layer.self_attn.get_submodule(n) for n in ("q_proj", "k_proj", "v_proj")], rows, dtype) for layer in model.model.layers]
        self.gate_up = [_Joined([layer.mlp.gate_proj, layer.mlp.up_proj], rows, dtype) for layer in model.model.layers]
        config = model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scaling = self.dim**-0.5

    @classmethod
    def of(cls, model, rows: int, attention, dtype: torch.dtype | None = None) -> LlamaStep | None:
        """The step for `model`, for batches of about `rows` rows with products in `dtype` (else
        the weights' own), attending with `attention` (a transformers attention function for one
        query a row, reading the cache's key and value views: r1kit.sampling.decode's
        decode_attention), or None where the model's forward pass must do it."""
        config = model.config
        if type(model).__name__ not in ARCHITECTURES:
            return None
        if config.hidden_act != "silu" or getattr(config, "pretraining_tp", 1) != 1 or "sliding_attention" in (getattr(config, "layer_types", None) or ()):
            return None
        if type(model).__name__ == "MistralForCausalLM" and getattr(config, "sliding_window", None) is not None:
            return None
        layers = model.model.layers
        linears = [layer.get_submodule(name) for layer in layers for name in PROJECTIONS] + [model.lm_head]
        if any(type(m) is not torch.nn.Linear for m in linears) or type(model.model.embed_tokens) is not torch.nn.Embedding:
            return None
        return cls(model, rows, attention, dtype)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor, cache) -> torch.Tensor:
        """Logits [B, V] after `tokens` [B] at `positions` [B, 1], each row attending to the
        positions where `attend` [B, L] is nonzero; their keys and values go into `cache` (a
        DynamicCache of r1kit.sampling.decode's GrowingLayers)."""
        autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        inner = self.model.model
        with torch.autocast("cpu", enabled=False):
            x = inner.embed_tokens(tokens)  # [B, hidden], the residual stream in the weights' dtype
            compute = autocast or x.dtype
            cos, sin = inner.rotary_emb(x[:, None], positions)  # [B, 1, D] each, in x's dtype
            mask = attend[:, None, None, :].bool()
            rows, qk = len(tokens), self.heads + self.kv_heads
            for i, layer in enumerate(inner.layers):
                attn, mlp = layer.self_attn, layer.mlp
                h = layer.input_layernorm(x).to(compute)  # once for the three products
                qkv = self.qkv[i](h, compute).view(rows, qk + self.kv_heads, self.dim)
                qk_rot = _rotate(qkv[:, :qk], cos, sin).to(compute)
                keys, values = cache.layers[i].update(qk_rot[:, self.heads :, None], qkv[:, qk:, None])
                dropout = getattr(attn, "attention_dropout", 0.0) if attn.training else 0.0  # as the model's own attention
                out, _ = self.attention(attn, qk_rot[:, : self.heads, None], keys, values, mask, scaling=self.scaling, dropout=dropout)
                x = x + _linear(attn.o_proj, out.view(rows, -1), compute)
                h = layer.post_attention_layernorm(x).to(compute)
                gate, up = self.gate_up[i](h, compute).chunk(2, dim=-1)
                x = x + _linear(mlp.down_proj, torch.nn.functional.silu(gate) * up, compute)
            return _linear(self.model.lm_head, inner.norm(x), compute)


def _linear(module: torch.nn.Linear, x: torch.Tensor, compute: torch.dtype) -> torch.Tensor:
    """The layer's product in `compute` (its packed forward where r1kit.hardware.cpu packed it)."""
    if "forward" in vars(module):  # packed: casts x itself
        return module.forward(x)
    return torch.nn.functional.linear(x.to(compute), module.weight.to(compute), None if module.bias is None else module.bias.to(compute))


class _Joined:
    """Linear layers that read the same input, as one product: where r1kit.hardware.cpu.packed_linears
    packed the layers, their weights side by side, packed once by oneDNN (another copy of those
    weights; on the machine measured the outputs were the layers' own packed products bit for bit,
    at 16 to 128 rows, in float32 and bfloat16); elsewhere
    (a GPU, a torch without oneDNN) each layer's own product, the outputs side by side."""

    def __init__(self, modules: list[torch.nn.Linear], rows: int, dtype: torch.dtype | None):
        self.modules, self.weight = modules, None
        if "forward" in vars(modules[0]):  # packed by packed_linears
            weight = torch.cat([m.weight.detach() for m in modules]).to(dtype or modules[0].weight.dtype)
            biases = [m.bias for m in modules]
            self.bias = None if all(b is None for b in biases) else torch.cat([
                (b.detach() if b is not None else m.weight.new_zeros(m.out_features)) for b, m in zip(biases, modules)
            ]).to(weight.dtype)
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, rows)

    def __call__(self, x: torch.Tensor, compute: torch.dtype) -> torch.Tensor:
        if self.weight is None:
            return torch.cat([_linear(m, x, compute) for m in self.modules], dim=-1)
        return torch.ops.mkldnn._linear_pointwise(x.to(self.weight.dtype), self.weight, self.bias, "none", [], "")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotary embedding of `x` [B, heads, D] (x * cos + rotate_half(x) * sin)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin
