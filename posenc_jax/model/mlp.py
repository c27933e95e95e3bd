"""The block's feed-forward network: SwiGLU, GeGLU or a plain GELU MLP.

    swiglu   (silu(x W_gate) * x W_up) W_down              Llama, Mistral, Qwen
    geglu    (gelu_tanh(x W_gate) * x W_up) W_down         Gemma ("gelu_pytorch_tanh")
    gelu     gelu_tanh(x W_up) W_down

GELU is the tanh approximation throughout (`jax.nn.gelu(approximate=True)`, which is
transformers' `gelu_pytorch_tanh`). Shapes: [B, T, E] -> [B, T, E], hidden width F.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from posenc_jax.model.params import normal, param

__all__ = ["GATED", "MLP", "MLP_ACTIVATIONS"]

Array = jax.Array
GATED = {"swiglu": jax.nn.silu, "geglu": lambda x: jax.nn.gelu(x, approximate=True)}
MLP_ACTIVATIONS = ("swiglu", "geglu", "gelu")


class MLP(nnx.Module):
    """`config.mlp_activation` over [B, T, E]; params gate (gated kinds), up, down."""

    def __init__(self, config, *, rngs: nnx.Rngs):
        e, f, pd = config.embed_dim, config.mlp_dim, config.param_dtype
        self.config = config
        if config.mlp_activation in GATED:
            self.gate = param(normal(rngs.params(), (e, f), e), ("embed", "mlp"), pd)
        self.up = param(normal(rngs.params(), (e, f), e), ("embed", "mlp"), pd)
        self.down = param(normal(rngs.params(), (f, e), f), ("mlp", "embed"), pd)

    def __call__(self, x: Array) -> Array:
        dt, act = self.config.dtype, self.config.mlp_activation
        h = jnp.einsum("bte,ef->btf", x, self.up[...].astype(dt))
        if act in GATED:
            h = GATED[act](jnp.einsum("bte,ef->btf", x, self.gate[...].astype(dt))) * h
        else:
            h = jax.nn.gelu(h, approximate=True)
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        return jnp.einsum("btf,fe->bte", h, self.down[...].astype(dt))
