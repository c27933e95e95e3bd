"""Attention that knows positions only through an encoding's bias hook.

Queries and keys arrive already rotated (the layer calls `encoding.rotate` before it caches
keys, so a KV cache holds rotated keys); `attend` adds the encoding's score bias and the masks
and mixes the values. Every mask is built from explicit arrays, never from an implied arange:

* causal: key j is visible to query i iff `k_positions[j] <= q_positions[i]` -- so a cache
  whose slots are filled in any order, and packed documents whose positions restart, work;
* segments: iff `q_segment_ids[i] == k_segment_ids[j]` (packed sequences);
* `k_mask`: iff `k_mask[j]` (valid cache slots, padding).

A query row that sees no key at all returns zeros (never NaN, never a uniform average).

Two implementations with the same results (tested against each other, values and gradients):

* "dense": `jax.nn.dot_product_attention` with the bias and mask materialised as
  [B, H, Lq, Lk] (`dense_backend="cudnn"` picks cuDNN's fused kernel on GPUs);
* "blockwise": `posenc_jax.model.blockwise`, an online-softmax (flash-style) loop over blocks that
  computes each block's bias from the block's positions, so ALiBi, T5 and Shaw never
  materialise [H, Lq, Lk]; memory is linear in the length.

The softmax scale is 1 / sqrt(D). A bias hook with `bias_needs_query` (Shaw et al.) receives
the query already multiplied by that scale, so it returns exactly the additive logit term.

Shapes: B batch, Lq / Lk query / key lengths, H query heads, K key/value heads (K divides H:
grouped-query attention, query head h reads kv head h // (H // K)), D head dim.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from posenc_jax.encodings.base import Encoding
from posenc_jax.model import blockwise
from posenc_jax.model.scores import as_2d, build_mask, encoding_bias

__all__ = ["DENSE_BACKENDS", "IMPLEMENTATIONS", "as_2d", "attend", "build_mask", "encoding_bias"]

IMPLEMENTATIONS = ("dense", "blockwise")
DENSE_BACKENDS = (None, "xla", "cudnn")
Array = jax.Array


def check_implementation(implementation: str, dense_backend: str | None = None) -> None:
    """ValueError naming the bad value and the valid ones."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention implementation {implementation!r}; valid "
                         f"implementations are: {', '.join(map(repr, IMPLEMENTATIONS))}")
    if dense_backend not in DENSE_BACKENDS:
        raise ValueError(f"unknown dense_backend {dense_backend!r}; valid: "
                         f"{', '.join(map(repr, DENSE_BACKENDS))}")


def attend(q: Array, k: Array, v: Array, *, encoding: Encoding, params: Any = None,
           q_positions: Array, k_positions: Array, causal: bool = True,
           q_segment_ids: Array | None = None, k_segment_ids: Array | None = None,
           k_mask: Array | None = None, implementation: str = "dense",
           block_q: int = 256, block_k: int = 256,
           dense_backend: str | None = None) -> Array:
    """Multi-head (or grouped-query) attention with the encoding's bias and explicit masks.

    Args:
      q: [B, Lq, H, D] queries, already rotated by the encoding.
      k, v: [B, Lk, K, D] keys (already rotated) and values; K divides H.
      encoding: the scheme whose `bias` hook is called (rotate/embed are not called here).
      params: the encoding's params pytree (`{}` / None for stateless schemes).
      q_positions: [Lq] or [B, Lq]; k_positions: [Lk] or [B, Lk] (int; float allowed for
        schemes that take them). They define the causal mask and the bias.
      causal: mask keys whose position is greater than the query's.
      q_segment_ids, k_segment_ids: int [Lq] / [Lk] or [B, ...]; give both or neither.
      k_mask: bool [Lk] or [B, Lk]: which key slots hold data (e.g. a cache's filled slots).
      implementation: "dense" or "blockwise" (module docstring).
      block_q, block_k: block sizes of the blockwise implementation (clipped to the lengths;
        lengths need not be multiples of them).
      dense_backend: None, "xla" or "cudnn", passed to `jax.nn.dot_product_attention`.

    Returns:
      [B, Lq, H, D] in q.dtype; zeros for query rows that see no key.

    Raises:
      ValueError: unknown implementation or backend, H not divisible by K, mismatched shapes,
        a bias whose head count differs from H, only one of the two segment-id arrays.
    """
    check_implementation(implementation, dense_backend)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError("q, k, v must be [B, L, heads, D]; got shapes "
                         f"{q.shape}, {k.shape}, {v.shape}")
    b, lq, h, d = q.shape
    lk, kh = k.shape[1], k.shape[2]
    if v.shape != k.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k and v must be [B={b}, Lk, K, D={d}] and equal; got k {k.shape}, "
                         f"v {v.shape}")
    if h % kh:
        raise ValueError(f"num_heads H={h} must be divisible by num_kv_heads K={kh}")
    if (q_segment_ids is None) != (k_segment_ids is None):
        raise ValueError("give both q_segment_ids and k_segment_ids, or neither")
    qp = as_2d(q_positions, lq, b, "q_positions")
    kp = as_2d(k_positions, lk, b, "k_positions")
    qs = as_2d(q_segment_ids, lq, b, "q_segment_ids")
    ks = as_2d(k_segment_ids, lk, b, "k_segment_ids")
    km = as_2d(k_mask, lk, b, "k_mask")
    if encoding.bias_needs_query:  # the bias varies with q's batch row anyway
        qp, kp = jnp.broadcast_to(qp, (b, lq)), jnp.broadcast_to(kp, (b, lk))
    if implementation == "blockwise":
        return blockwise.attend_blockwise(
            q, k, v, encoding=encoding, params=params, q_positions=qp, k_positions=kp,
            causal=causal, q_segment_ids=qs, k_segment_ids=ks, k_mask=km,
            block_q=block_q, block_k=block_k)
    scale = 1.0 / math.sqrt(d)
    bias = encoding_bias(encoding, params, qp, kp, (q * scale).astype(q.dtype), h)
    mask = build_mask(qp, kp, causal=causal, q_segment_ids=qs, k_segment_ids=ks, k_mask=km)
    seen = mask
    if dense_backend == "cudnn":  # cuDNN takes the mask folded into a bias of q's dtype
        if mask is not None:
            bias = jnp.where(mask, 0.0 if bias is None else bias, -1e9)
            mask = None
        bias = None if bias is None else bias.astype(q.dtype)
    out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                       implementation=dense_backend)
    if seen is not None:
        row_ok = jnp.any(seen, axis=-1)[:, 0, :, None, None]          # [B|1, Lq, 1, 1]
        out = jnp.where(row_ok, out, jnp.zeros((), out.dtype))
    return out
