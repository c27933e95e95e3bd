"""Attention that knows positions only through an encoding's bias hook.

Queries and keys arrive already rotated (the layer calls `encoding.rotate` before it caches
keys, so a KV cache holds rotated keys) -- except where `rotates_inside` says the Pallas
kernel rotates them in-kernel (then q, k and the cache are raw, `rotated=False`); `attend`
adds the encoding's score bias and the masks and mixes the values. Every mask is built from explicit arrays, never from an implied arange:

* causal: key j is visible to query i iff `k_positions[j] <= q_positions[i]` -- so a cache
  whose slots are filled in any order, and packed documents whose positions restart, work;
* segments: iff `q_segment_ids[i] == k_segment_ids[j]` (packed sequences);
* `k_mask`: iff `k_mask[j]` (valid cache slots, padding).

A query row that sees no key at all returns zeros (never NaN, never a uniform average).

Implementations with the same results (tested against each other, values and gradients):

* "dense": `jax.nn.dot_product_attention` with the bias and mask materialised as
  [B, H, Lq, Lk] (`dense_backend="cudnn"` picks cuDNN's fused kernel on GPUs, with its own
  causal mask and no bias unless the scheme has one);
* "blockwise": `posenc_jax.model.blockwise`, an online-softmax (flash-style) loop over blocks that
  computes each block's bias from the block's positions, so ALiBi, T5 and Shaw never
  materialise [H, Lq, Lk]; memory is linear in the length;
* "pallas": `posenc_jax.model.kernels`, a flash-attention kernel (Triton on GPUs, Mosaic on
  TPUs, interpret mode on CPU, by the platform lowered for) that computes an elementwise bias
  and RoPE inside the kernel from the blocks' positions, forward and backward;
* "auto": the kernel on GPU/TPU when the encoding allows it, else dense (short) or blockwise.

Encoding capabilities (declared on the encoding, see `posenc_jax.encodings.base`): a
`block_transform` is applied to each scored block (dense: all queries at once); a
`value_term` or a bias that `needs_full_rows` makes dense attention compute its probabilities
explicitly (`posenc_jax.model.explicit`); `needs_full_rows` is dense only, `causal_only`
requires causal=True (ValueError otherwise, naming the alternative), and the kernel serves
none of the three (`kernel_capable`; "auto" then picks the portable paths).

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

from posenc_jax.checks import boolean
from posenc_jax.encodings.base import Encoding
from posenc_jax.model import blockwise
from posenc_jax.model.explicit import attend_explicit
from posenc_jax.model.kernels import check_supported, flash_attention
from posenc_jax.model.scores import as_2d, build_mask, check_capabilities, encoding_bias

__all__ = ["DENSE_BACKENDS", "IMPLEMENTATIONS", "as_2d", "attend", "build_mask", "encoding_bias",
           "rotates_inside"]

IMPLEMENTATIONS = ("dense", "blockwise", "pallas", "auto")
AUTO_DENSE_MAX = 2048 * 2048  # "auto" on CPU: dense up to Lq * Lk of this, then blockwise
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


def kernel_capable(encoding: Encoding) -> bool:
    """Whether the Pallas kernel can compute this encoding's bias in-kernel (and the encoding
    declares no hook the kernel lacks: value term, block transform, whole rows)."""
    if encoding.has_value_term or encoding.has_block_transform or encoding.needs_full_rows:
        return False
    return not encoding.has_bias or encoding.has_elementwise_bias


def rotates_inside(encoding: Encoding, implementation: str) -> bool:
    """True when `attend` takes RAW q and k and rotates them itself (in-kernel RoPE).

    Then the caller must not call the rotate hook, and a KV cache holds raw keys (the
    kernel rotates every cached key at its slot's position on each call).
    """
    return (implementation in ("pallas", "auto") and encoding.has_kernel_rotation
            and kernel_capable(encoding))


def _seq_len(encoding: Encoding, kp: Array, km: Array | None):
    """The length a length-dependent rotation reads: max(valid key positions) + 1."""
    if not encoding.is_length_dependent:
        return None
    kp = kp if km is None else jnp.where(km.astype(bool), kp, jnp.iinfo(jnp.int32).min)
    return jnp.max(kp) + 1


def attend(q: Array, k: Array, v: Array, *, encoding: Encoding, params: Any = None,
           q_positions: Array, k_positions: Array, causal: bool = True,
           q_segment_ids: Array | None = None, k_segment_ids: Array | None = None,
           k_mask: Array | None = None, implementation: str = "dense",
           block_q: int = 256, block_k: int = 256,
           dense_backend: str | None = None, rotated: bool = True,
           window: int | None = None) -> Array:
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
      implementation: "dense", "blockwise", "pallas" (the kernel: Triton on GPUs, Mosaic on
        TPUs, interpret mode on CPU, chosen by the platform lowered for) or "auto" (the
        kernel on GPU/TPU when the encoding allows it; on CPU dense up to Lq*Lk =
        `AUTO_DENSE_MAX`, blockwise beyond).
      block_q, block_k: block sizes of the blockwise implementation and of the kernel's
        interpret mode (clipped to the lengths; lengths need not be multiples of them).
      dense_backend: None, "xla" or "cudnn", passed to `jax.nn.dot_product_attention`.
        With "cudnn", self-attention without a key mask (`q_positions is k_positions`, as
        the model passes them) uses cuDNN's own causal mask, which is BY INDEX: positions
        must increase along the sequence (within each segment); a bias is passed only
        when the encoding has one; segment ids and key masks become a boolean mask.
      rotated: False when q and k are raw (see `rotates_inside`): the kernel then rotates
        in-kernel, other paths call the rotate hook here.
      window: a sliding window W (None: unlimited): key kp is visible to query qp only if
        qp - kp < W (with the other masks). The kernel has no window yet: "pallas" refuses
        one and "auto" then takes the portable paths.

    Returns:
      [B, Lq, H, D] in q.dtype; zeros for query rows that see no key.

    Raises:
      ValueError: unknown implementation or backend, H not divisible by K, mismatched shapes,
        a bias whose head count differs from H, only one of the two segment-id arrays, an
        encoding the kernel cannot serve with implementation="pallas".
    """
    check_implementation(implementation, dense_backend)
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
    if (q_segment_ids is None) != (k_segment_ids is None):
        raise ValueError("give both q_segment_ids and k_segment_ids, or neither")
    check_capabilities(encoding, implementation=implementation, causal=causal)
    if implementation == "pallas":
        check_supported(encoding)
        if window is not None:
            raise ValueError(f"attention implementation 'pallas' has no sliding window yet "
                             f"(window={window}); use 'dense', 'blockwise' or 'auto'")
    qp = as_2d(q_positions, lq, b, "q_positions")
    kp = as_2d(k_positions, lk, b, "k_positions")
    qs = as_2d(q_segment_ids, lq, b, "q_segment_ids")
    ks = as_2d(k_segment_ids, lk, b, "k_segment_ids")
    km = as_2d(k_mask, lk, b, "k_mask")
    if encoding.bias_needs_query:  # the bias varies with q's batch row anyway
        qp, kp = jnp.broadcast_to(qp, (b, lq)), jnp.broadcast_to(kp, (b, lk))
    kw = {"encoding": encoding, "params": params, "causal": causal}
    masks = (qp, kp, qs, ks, km)

    def kernel(q, k, v, masks):
        qp, kp, qs, ks, km = masks
        rotation = None
        if not rotated and encoding.has_kernel_rotation:
            rotation = encoding.kernel_rotation(params, seq_len=_seq_len(encoding, kp, km))
        elif not rotated:
            q, k = encoding.rotate(params, q, k, qp, kp, seq_len=_seq_len(encoding, kp, km))
        return flash_attention(q, k, v, q_positions=qp, k_positions=kp, q_segment_ids=qs,
                               k_segment_ids=ks, k_mask=km, rotation=rotation,
                               block_q=_pow2(block_q), block_k=_pow2(block_k), **kw)

    def portable(q, k, v, masks, impl):
        qp, kp, qs, ks, km = masks
        if not rotated:
            q, k = encoding.rotate(params, q, k, qp, kp, seq_len=_seq_len(encoding, kp, km))
        if impl == "blockwise":
            return blockwise.attend_blockwise(
                q, k, v, q_positions=qp, k_positions=kp, q_segment_ids=qs, k_segment_ids=ks,
                k_mask=km, block_q=block_q, block_k=block_k, window=window, **kw)
        return _dense(q, k, v, qp, kp, qs, ks, km, dense_backend=dense_backend,
                      index_causal=same_positions and km is None, window=window, **kw)

    if implementation == "pallas":
        return kernel(q, k, v, masks)
    if implementation != "auto":
        return portable(q, k, v, masks, implementation)
    cpu_impl = ("dense" if lq * lk <= AUTO_DENSE_MAX or encoding.needs_full_rows
                else "blockwise")
    if not kernel_capable(encoding) or window is not None:
        return portable(q, k, v, masks, cpu_impl)
    return jax.lax.platform_dependent(
        q, k, v, masks, cpu=lambda *a: portable(*a, cpu_impl), cuda=kernel, tpu=kernel,
        default=lambda *a: portable(*a, cpu_impl))


def _pow2(n: int) -> int:
    """The largest power of two <= n (interpret-mode blocks)."""
    return 1 << (max(int(n), 1).bit_length() - 1)


def _dense(q, k, v, qp, kp, qs, ks, km, *, encoding, params, causal, dense_backend,
           index_causal, window=None):
    """`jax.nn.dot_product_attention` with the bias and masks (see `attend`)."""
    h, d = q.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(d)
    if encoding.has_block_transform:  # dense: the whole query set is one block
        q, k = encoding.block_transform(params, q, k, qp, kp)
    if encoding.needs_full_rows or encoding.has_value_term:  # they read p or whole rows
        mask = build_mask(qp, kp, causal=causal, q_segment_ids=qs, k_segment_ids=ks, k_mask=km,
                          window=window)
        return attend_explicit(q, k, v, encoding=encoding, params=params, q_positions=qp,
                               k_positions=kp, mask=mask, scale=scale)
    bias = encoding_bias(encoding, params, qp, kp, (q * scale).astype(q.dtype), h)
    is_causal = dense_backend == "cudnn" and causal and index_causal
    mask = build_mask(qp, kp, causal=causal and not is_causal, q_segment_ids=qs,
                      k_segment_ids=ks, k_mask=km, window=window)
    if dense_backend == "cudnn" and bias is not None:
        bias = bias.astype(q.dtype)  # cuDNN takes a bias of q's dtype, only when there is one
    out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                       is_causal=is_causal, implementation=dense_backend)
    if mask is not None:
        row_ok = jnp.any(mask, axis=-1)[:, 0, :, None, None]          # [B|1, Lq, 1, 1]
        out = jnp.where(row_ok, out, jnp.zeros((), out.dtype))
    return out
