"""The block's feed-forward network: SwiGLU, GeGLU, gpt-oss's clamped SwiGLU or a GELU MLP.

    swiglu          (silu(x W_gate) * x W_up) W_down                    Llama, Mistral, Qwen
    geglu           (gelu_tanh(x W_gate) * x W_up) W_down               Gemma
                                                                        ("gelu_pytorch_tanh")
    swiglu_clamped  g = min(x W_gate, 7), u = clip(x W_up, -7, 7),      gpt-oss
                    ((u + 1) * g * sigmoid(1.702 g)) W_down
    gelu            gelu_tanh(x W_up) W_down

GELU is the tanh approximation throughout (`jax.nn.gelu(approximate=True)`, which is
transformers' `gelu_pytorch_tanh`). gpt-oss stores gate and up interleaved in one tensor
(gate = even columns): that is the family record's business, here they are two params.
Shapes: [B, T, E] -> [B, T, E], hidden width F. `activate` is shared with the experts of
`posenc_jax.model.moe`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from posenc_jax.model.params import normal, param

__all__ = ["GATED_ACTIVATIONS", "MLP", "MLP_ACTIVATIONS", "SWIGLU_LIMIT", "activate"]

Array = jax.Array
MLP_ACTIVATIONS = ("swiglu", "geglu", "gelu", "swiglu_clamped")
GATED_ACTIVATIONS = ("swiglu", "geglu", "swiglu_clamped")
SWIGLU_LIMIT, SWIGLU_ALPHA = 7.0, 1.702  # gpt-oss's swiglu_limit and alpha


def activate(activation: str, gate: Array | None, up: Array) -> Array:
    """The hidden activations [..., F] from the pre-activations x W_gate (None for "gelu")
    and x W_up [..., F] (table above)."""
    if activation == "swiglu":
        return jax.nn.silu(gate) * up
    if activation == "geglu":
        return jax.nn.gelu(gate, approximate=True) * up
    if activation == "swiglu_clamped":
        gate = jnp.minimum(gate, SWIGLU_LIMIT)
        up = jnp.clip(up, -SWIGLU_LIMIT, SWIGLU_LIMIT)
        return (up + 1) * gate * jax.nn.sigmoid(SWIGLU_ALPHA * gate)
    if activation == "gelu":
        return jax.nn.gelu(up, approximate=True)
    raise ValueError(f"unknown mlp_activation {activation!r}; valid: {MLP_ACTIVATIONS}")


class MLP(nnx.Module):
    """`config.mlp_activation` over [B, T, E]; params gate (gated kinds), up, down; hidden width
    `mlp_dim` (default `config.mlp_dim`; a MoE's shared expert passes its own)."""

    def __init__(self, config, *, rngs: nnx.Rngs, mlp_dim: int | None = None):
        e, f, pd = config.embed_dim, mlp_dim or config.mlp_dim, config.param_dtype
        self.config = config
        if config.mlp_activation in GATED_ACTIVATIONS:
            self.gate = param(normal(rngs.params(), (e, f), e), ("embed", "mlp"), pd)
        self.up = param(normal(rngs.params(), (e, f), e), ("embed", "mlp"), pd)
        self.down = param(normal(rngs.params(), (f, e), f), ("mlp", "embed"), pd)

    def __call__(self, x: Array) -> Array:
        dt, act = self.config.dtype, self.config.mlp_activation
        up = jnp.einsum("bte,ef->btf", x, self.up[...].astype(dt))
        gate = (jnp.einsum("bte,ef->btf", x, self.gate[...].astype(dt))
                if act in GATED_ACTIVATIONS else None)
        h = nn.with_logical_constraint(activate(act, gate, up), ("batch", "length", "mlp"))
        return jnp.einsum("btf,fe->bte", h, self.down[...].astype(dt))
