"""RMSNorm for the decoder, in the two conventions pretrained families use.

    y = x / sqrt(mean(x^2) + eps) * (offset + w)          over the last axis, in float32

`offset=0` is Llama / Mistral / Qwen (the weight starts at 1); `offset=1` is Gemma (the stored
weight w starts at 0 and the norm multiplies by 1 + w). The product is taken in float32 and
cast to x's dtype once (Gemma's order; for Llama in float32 the two orders agree exactly, in
bfloat16 they differ by one rounding).

The same module normalises the residual stream ([..., E], logical axis "embed") and, for
QK-norm (Qwen3, Gemma 3), each head's query and key ([..., D], logical axis "kv").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from posenc_jax.model.params import param

__all__ = ["RMSNorm"]

Array = jax.Array


class RMSNorm(nnx.Module):
    """x / rms(x) * (offset + scale) over the last axis (computed in float32). x: [..., dim].

    Args:
      dim: size of the normalised axis. eps: added to the mean square.
      param_dtype: storage dtype of `scale`. offset: 0.0 (scale starts at 1) or 1.0 (Gemma:
        scale starts at 0). axis: the logical axis name of `scale` ("embed" or "kv").
    """

    def __init__(self, dim: int, *, eps: float, param_dtype, offset: float = 0.0,
                 axis: str = "embed"):
        self.eps, self.offset = eps, offset
        self.scale = param(jnp.full((dim,), 1.0 - offset), (axis,), param_dtype)

    def __call__(self, x: Array) -> Array:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        scale = self.scale[...].astype(jnp.float32)
        if self.offset:
            scale = scale + jnp.float32(self.offset)
        return (y * scale.reshape((1,) * (y.ndim - 1) + scale.shape)).astype(x.dtype)
