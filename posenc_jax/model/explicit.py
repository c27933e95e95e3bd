"""Dense attention with explicit probabilities, for encodings whose hooks read what the fused
`jax.nn.dot_product_attention` keeps inside: whole rows of logits (a `RowBias`, CoPE),
the attention weights (a `ValueTerm`, Shaw et al.'s a^V), or a learned sink logit per head
that joins every denominator (gpt-oss: p = e^s / (e^sink + sum e^s)).

    s = q k^T * scale (masked entries -1e30);  s += row_bias(..., logits=s);  p = softmax(s)
    out = p v + value_term(p)

Same contract and masks as `posenc_jax.model.attention.attend` (a row that sees no key gives
zeros). Memory is [B, H, Lq, Lk], as any dense attention.

Shapes: B batch, Lq / Lk lengths, H query heads, K kv heads, G = H // K, D head dim.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from posenc_jax.encodings.base import Encoding
from posenc_jax.encodings.capabilities import ValueTerm
from posenc_jax.model.scores import encoding_bias
from posenc_jax.model.softmax_math import NEG, normalise

__all__ = ["attend_explicit"]

Array = jax.Array


def attend_explicit(q: Array, k: Array, v: Array, *, encoding: Encoding, params: Any,
                    q_positions: Array, k_positions: Array, mask: Array | None,
                    scale: float, sinks: Array | None = None) -> Array:
    """q [B, Lq, H, D], k/v [B, Lk, K, D], positions [B|1, L], mask bool [B|1, 1, Lq, Lk] or
    None, sinks float [H] or None (a learned logit per head that joins every row's
    denominator, gpt-oss) -> [B, Lq, H, D] in q.dtype (float32 softmax)."""
    b, lq, h, d = q.shape
    lk, kh = k.shape[1], k.shape[2]
    g = h // kh
    s = jnp.einsum("bqkgd,bskd->bkgqs", q.reshape(b, lq, kh, g, d), k,
                   preferred_element_type=jnp.float32).reshape(b, h, lq, lk)
    s = s * jnp.float32(scale)
    if mask is not None:
        s = jnp.where(mask, s, jnp.float32(NEG))
    bias = encoding_bias(encoding, params, q_positions, k_positions,
                         (q * scale).astype(q.dtype), h, logits=s)
    if bias is not None:
        s = s + bias
        if mask is not None:
            s = jnp.where(mask, s, jnp.float32(NEG))
    m = jnp.max(s, axis=-1, keepdims=True)
    if sinks is not None:
        sink = jnp.asarray(sinks, jnp.float32)[None, :, None, None]         # [1, H, 1, 1]
        m = jnp.maximum(m, sink)
    m = jax.lax.stop_gradient(m)
    p = jnp.exp(s - m)
    if mask is not None:
        p = jnp.where(mask, p, jnp.float32(0.0))
    total = jnp.sum(p, axis=-1, keepdims=True)
    if sinks is not None:
        total = total + jnp.exp(sink - m)
    p = normalise(p, total)                                                # [B, H, Lq, Lk]
    out = jnp.einsum("bkgqs,bskd->bkgqd", p.reshape(b, kh, g, lq, lk).astype(v.dtype), v,
                     preferred_element_type=jnp.float32).reshape(b, h, lq, d)
    if isinstance(encoding, ValueTerm):
        out = out + encoding.value_term(params, p, q_positions, k_positions).astype(jnp.float32)
    return jnp.transpose(out, (0, 2, 1, 3)).astype(q.dtype)               # [B, Lq, H, D]
