"""The "dense" backend: `jax.nn.dot_product_attention` (XLA) with the bias and masks
materialised as [B, H, Lq, Lk]; a `RowBias`, a `ValueTerm` or learned sinks take the
explicit-probabilities path (`posenc_jax.model.explicit`). Every bias kind, every platform.

`attend_dense` is shared with the "cudnn" record (`posenc_jax.model.backends.cudnn`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from posenc_jax.encodings.capabilities import BlockTransform, RowBias, ValueTerm
from posenc_jax.model.backends.registry import BIAS_KINDS, PLATFORMS, Backend, Inputs, register
from posenc_jax.model.explicit import attend_explicit
from posenc_jax.model.scores import build_mask, encoding_bias

__all__ = ["AUTO_DENSE_MAX", "AUTO_DENSE_MAX_CPU", "BACKEND", "NAME", "attend_dense"]

NAME = "dense"
AUTO_DENSE_MAX = 2048 * 2048  # "auto": dense up to Lq * Lk of this, then blockwise
# On CPU blockwise is 4-6x faster than dense from L = 1024 (benchmarks/attention_cpu.py,
# docs/performance.md) and 1.6x at L = 512, forward and forward + backward: dense to 256.
AUTO_DENSE_MAX_CPU = 256 * 256


def attend_dense(x: Inputs, *, fused: str) -> jax.Array:
    """Dense attention over `x` with `jax.nn.dot_product_attention(implementation=fused)`.

    With fused="cudnn", self-attention without a key mask (`x.same_positions`) uses cuDNN's
    own causal mask, which is BY INDEX (positions must increase along the sequence, within
    each segment), and a bias is passed in q's dtype only when the encoding has one."""
    q, k, v, encoding, params = x.q, x.k, x.v, x.encoding, x.params
    qp, kp = x.q_positions, x.k_positions
    h, d = q.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(d)
    if isinstance(encoding, BlockTransform):  # dense: the whole query set is one block
        q, k = encoding.block_transform(params, q, k, qp, kp)
    masks = {"q_segment_ids": x.q_segment_ids, "k_segment_ids": x.k_segment_ids,
             "k_mask": x.k_mask, "window": x.window, "chunk_size": x.chunk_size,
             "sink_tokens": x.sink_tokens}
    if isinstance(encoding, (RowBias, ValueTerm)) or x.sinks is not None:  # p, rows, sinks
        mask = build_mask(qp, kp, causal=x.causal, **masks)
        return attend_explicit(q, k, v, encoding=encoding, params=params, q_positions=qp,
                               k_positions=kp, mask=mask, scale=scale, sinks=x.sinks)
    bias = encoding_bias(encoding, params, qp, kp, (q * scale).astype(q.dtype), h)
    is_causal = fused == "cudnn" and x.causal and x.same_positions
    mask = build_mask(qp, kp, causal=x.causal and not is_causal, **masks)
    if fused == "cudnn" and bias is not None:
        bias = bias.astype(q.dtype)  # cuDNN takes a bias of q's dtype, only when there is one
    out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                       is_causal=is_causal, implementation=fused)
    if mask is not None:
        row_ok = jnp.any(mask, axis=-1)[:, 0, :, None, None]          # [B|1, Lq, 1, 1]
        out = jnp.where(row_ok, out, jnp.zeros((), out.dtype))
    return out


BACKEND = register(Backend(
    name=NAME, call=lambda x: attend_dense(x, fused="xla"),
    bias=frozenset(BIAS_KINDS), platforms=frozenset(PLATFORMS), value_term=True,
    block_transform=True, sliding_window=True, chunked=True, sinks=True, sink_tokens=True,
    materialises_scores=True, auto_priority=1,
    auto_platforms=frozenset(PLATFORMS), auto_max_scores={
        **dict.fromkeys(PLATFORMS, AUTO_DENSE_MAX), "cpu": AUTO_DENSE_MAX_CPU}))
