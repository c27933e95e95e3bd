"""Attention that knows positions only through an encoding's hooks, over any registered backend.

Queries and keys arrive already rotated (the layer calls `encoding.rotate` before it caches
keys, so a KV cache holds rotated keys) -- except where the rotation rule
(`posenc_jax.model.rotation`) defers the rotation to attention (then q, k and the cache are raw,
`rotated=False`); `attend` adds the encoding's score bias and the masks and mixes the values.
Every mask is built from explicit arrays, never from an implied arange:

* causal: key j is visible to query i iff `k_positions[j] <= q_positions[i]` -- so a cache
  whose slots are filled in any order, and packed documents whose positions restart, work;
* segments: iff `q_segment_ids[i] == k_segment_ids[j]` (packed sequences);
* `k_mask`: iff `k_mask[j]` (valid cache slots, padding);
* the local rules (`scores.build_mask`): a sliding `window` W (qp - kp < W), chunks of
  `chunk_size` c (kp // c == qp // c, Llama 4), and `sink_tokens` k: keys at kp < k escape
  both (StreamingLLM). In a KV cache the slots' positions make a chunk boundary reset what a
  query sees and keep the sink tokens visible as the window slides.

Learned `sinks` (gpt-oss): a float [H] logit per query head joins every row's softmax
denominator with a zero value (p_j = e^{s_j} / (e^{sink_h} + sum_i e^{s_i})) and gets a
gradient; a row that sees no key gives zeros, its whole mass on the sink.

A query row that sees no key at all returns zeros (never NaN, never a uniform average).

The compute paths are the records of `posenc_jax.model.backends` (tested against each other,
values and gradients): `backends.names()` lists them, each record says what it supports
(bias kinds, rotation inside, value terms, block transforms, platforms) and how it is called;
`implementation="auto"` runs what `backends.choose` picks for the platform lowered for. An
encoding a backend cannot run is a ValueError with the record's reason (`Backend.supports`),
naming the alternatives. Encoding capabilities (`posenc_jax.encodings.capabilities`) are
what the records test: a `BlockTransform` is applied to each scored block, a `ValueTerm` or a
`RowBias` makes dense attention compute its probabilities explicitly, `CausalOnly` requires
causal=True.

The softmax scale is 1 / sqrt(D). A `QueryBias` hook (Shaw et al.) receives the query
already multiplied by that scale, so it returns exactly the additive logit term.

Shapes: B batch, Lq / Lk query / key lengths, H query heads, K key/value heads (K divides H:
grouped-query attention, query head h reads kv head h // (H // K)), D head dim.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from posenc_jax.checks import boolean, positive_int
from posenc_jax.encodings.base import Encoding
from posenc_jax.encodings.capabilities import QueryBias
from posenc_jax.model import backends, rotation
from posenc_jax.model.rotation import rotates_inside
from posenc_jax.model.scores import as_2d, build_mask, check_local, check_sinks, encoding_bias

__all__ = ["IMPLEMENTATIONS", "as_2d", "attend", "build_mask", "encoding_bias",
           "rotates_inside"]

#: Every valid `implementation=`: the registered backends and "auto".
IMPLEMENTATIONS = (*backends.names(), backends.AUTO)
Array = jax.Array


def attend(q: Array, k: Array, v: Array, *, encoding: Encoding, params: Any = None,
           q_positions: Array, k_positions: Array, causal: bool = True,
           q_segment_ids: Array | None = None, k_segment_ids: Array | None = None,
           k_mask: Array | None = None, implementation: str = backends.DENSE,
           block_q: int = 256, block_k: int = 256,
           rotated: bool = True,
           kernel_blocks: Any = None, window: int | None = None,
           chunk_size: int | None = None, sinks: Array | None = None,
           sink_tokens: int = 0) -> Array:
    """Multi-head (or grouped-query) attention with the encoding's bias and explicit masks.

    Args:
      q: [B, Lq, H, D] queries, already rotated by the encoding (unless `rotated=False`).
      k, v: [B, Lk, K, D] keys (likewise) and values; K divides H.
      encoding: the scheme whose `bias` hook is called (rotate only when `rotated=False`).
      params: the encoding's params pytree (`{}` / None for stateless schemes).
      q_positions: [Lq] or [B, Lq]; k_positions: [Lk] or [B, Lk] (int; float allowed for
        schemes that take them). They define the causal mask and the bias.
      causal: mask keys whose position is greater than the query's.
      q_segment_ids, k_segment_ids: int [Lq] / [Lk] or [B, ...]; give both or neither.
      k_mask: bool [Lk] or [B, Lk]: which key slots hold data (e.g. a cache's filled slots).
      implementation: a registered backend (`backends.names()`: the XLA dense path, the
        blockwise loop, the Pallas kernel, cuDNN) or "auto" (`backends.choose` per platform).
      block_q, block_k: ints >= 1 (checked for every backend): block sizes of the blockwise
        implementation and of the kernel's interpret mode (clipped to the lengths; lengths
        need not be multiples of them).
      rotated: False when q and k are raw (see `rotation.rotates_inside`): a backend that
        rotates inside then applies the rotation, any other calls the rotate hook here.
      kernel_blocks: the kernel's GPU / TPU block sizes (`kernels.blocks.kernel_blocks`).
      window: a sliding window W (None: unlimited): key kp is visible to query qp only if
        qp - kp < W (with the other masks), from positions; backends whose record has
        `sliding_window` take it ("auto" chooses among them).
      chunk_size: chunked attention c (None: none): kp visible to qp only if
        kp // c == qp // c (with causal: Llama 4's local layers).
      sinks: float [H] learned sink logit per query head (gpt-oss), or None.
      sink_tokens: the first positions (kp < sink_tokens) stay visible beside the window
        and the chunk (StreamingLLM); 0: none.

    Returns:
      [B, Lq, H, D] in q.dtype; zeros for query rows that see no key.

    Raises:
      ValueError: unknown implementation or backend, H not divisible by K, mismatched shapes,
        a bias whose head count differs from H, only one of the two segment-id arrays, an
        encoding or a mask the backend cannot run (the record's reason), a window or
        chunk_size < 1, sink_tokens < 0, sinks not of shape [H].
      TypeError: a non-int window / chunk_size / sink_tokens, integer sinks.
    """
    name = backends.resolve(implementation)
    same_positions = q_positions is k_positions
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
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must have one dtype, got dtype q={q.dtype}, k={k.dtype}, "
                        f"v={v.dtype}")
    boolean("causal", causal)
    positive_int("block_q", block_q)  # every backend, not only those that read them
    positive_int("block_k", block_k)
    if (q_segment_ids is None) != (k_segment_ids is None):
        raise ValueError("give both q_segment_ids and k_segment_ids, or neither")
    window, chunk_size, sink_tokens = check_local(window=window, chunk_size=chunk_size,
                                                  sink_tokens=sink_tokens)
    sinks = check_sinks(sinks, h)
    shapes = backends.Shapes(batch=b, q_len=lq, k_len=lk, heads=h, kv_heads=kh, head_dim=d,
                            window=window, chunk_size=chunk_size, sinks=sinks is not None,
                            sink_tokens=sink_tokens)
    qp = as_2d(q_positions, lq, b, "q_positions")
    kp = as_2d(k_positions, lk, b, "k_positions")
    qs = as_2d(q_segment_ids, lq, b, "q_segment_ids")
    ks = as_2d(k_segment_ids, lk, b, "k_segment_ids")
    km = as_2d(k_mask, lk, b, "k_mask")
    if isinstance(encoding, QueryBias):  # the bias varies with q's batch row anyway
        qp, kp = jnp.broadcast_to(qp, (b, lq)), jnp.broadcast_to(kp, (b, lk))

    def body(backend: backends.Backend, operands) -> Array:
        q, k, v, (qp, kp, qs, ks, km, sinks) = operands
        q, k, rot = rotation.for_backend(backend, encoding, params, q, k, qp, kp, km,
                                         rotated=rotated)
        return backend.call(backends.Inputs(
            q=q, k=k, v=v, encoding=encoding, params=params, q_positions=qp, k_positions=kp,
            q_segment_ids=qs, k_segment_ids=ks, k_mask=km, causal=causal, block_q=block_q,
            block_k=block_k, rotation=rot, same_positions=same_positions and km is None,
            kernel_blocks=kernel_blocks, window=window, chunk_size=chunk_size,
            sink_tokens=sink_tokens, sinks=sinks))

    return backends.run(name, encoding, (q, k, v, (qp, kp, qs, ks, km, sinks)), body,
                        causal=causal, shapes=shapes)
