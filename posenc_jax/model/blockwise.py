"""Blockwise (flash-style) attention in pure JAX: online softmax, bias computed per block.

Queries are cut into blocks of `block_q` rows and keys into blocks of `block_k` columns. For
each query block a `lax.scan` runs over the key blocks keeping the running row maximum m, the
running normaliser l and the unnormalised output acc (Milakov & Gimelshein 2018; Dao et al.
2022), with the update and normalisation of `posenc_jax.model.softmax_math`:

    s      = q_blk k_blk^T * scale + bias(q_pos_blk, k_pos_blk)    masked entries -> NEG
    m'     = max(m, rowmax(s));   p = exp(s - m') (0 where masked)
    l'     = exp(m - m') l + rowsum(p);   acc' = exp(m - m') acc + p v_blk
    out    = acc / l        (0 where l == 0: a row that sees no key gives zeros, not NaN)

The encoding's bias hook is called on the block's own positions, so only [B, H, block_q,
block_k] is ever live: ALiBi, T5 and Shaw never build [H, Lq, Lk] and memory is linear in the
length. An encoding's `BlockTransform` (xPos) is applied to each (query block, key block)
before scoring, and its `ValueTerm` (Shaw's a^V, linear in the weights) is fed the block's
unnormalised p and accumulated with p v. A `RowBias` (CoPE: whole rows of logits) is refused. A key block that the mask hides entirely (e.g. above the causal diagonal, outside a
window or a chunk, or unfilled cache slots) is skipped (`lax.switch`), which halves the
work of causal attention, and a block the mask shows entirely (below the causal diagonal)
runs without the mask's `where`s. The G query heads of a kv head are stacked as the rows of
one matmul in the dot's own layout (q [B, K, G * bq, D] per query block, k and v
[nk, B, K, bk, D] once): 1.7-2x faster on XLA:CPU than the per-step transposes of a
[B, bq, K, G, D] einsum (docs/performance.md). A learned sink logit per head (gpt-oss) starts each row's state at
(m, l) = (sink, 1) (`softmax_math.start`): it joins the denominator once and gets its
gradient by autodiff.

Fewer passes over the float32 score tile (each a pass through memory on XLA:CPU): the softmax
scale is folded into q (float32, or a power-of-two scale); rowsum(p) comes out of the p v dot
as one more column (v is extended by a column of ones once); and once every row of the query
block has a finite running max, a key block is exponentiated against that max as it stands
(p = exp(s - m), no pass for the block's own row max, alpha = 1) and kept when no row's sum
of p reaches e^39 (`STALE_LOG_CAP`), else redone exactly (`lax.cond`). Softmax is invariant to
the reference point, so values and gradients agree with the exact step to float32 rounding;
the bound keeps p v and l far from overflow, and p is capped below inf so that a redone
block's discarded p never puts NaN into a gradient.

Lengths that are not multiples of the block sizes are padded (padded keys masked, padded query
rows dropped). For reverse-mode AD both loop bodies are `jax.checkpoint`ed: the backward pass
recomputes each block instead of storing [Lq, Lk] residuals, so gradients also take memory
linear in the length (at the cost of about one extra forward pass).

Shapes: B batch, Lq / Lk lengths, H query heads, K kv heads, G = H // K, D head dim.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from posenc_jax.checks import positive_int
from posenc_jax.encodings.base import Encoding
from posenc_jax.encodings.capabilities import BlockTransform, ValueTerm
from posenc_jax.model.scores import build_mask, encoding_bias
from posenc_jax.model.softmax_math import NEG, normalise, online_max, start

__all__ = ["STALE_LOG_CAP", "attend_blockwise", "attend_blockwise_lse"]

Array = jax.Array
#: Against the stale running max, p = exp(min(s - m, STALE_LOG_CAP)) (never inf, so no NaN
#: reaches a gradient), and the block is kept only while every row's sum of p stays below
#: exp(STALE_LOG_CAP - 1): then no entry was capped, and p v and the normaliser stay far from
#: float32's overflow. Otherwise the block is redone exactly.
STALE_LOG_CAP = 40.0


def _pad(x: Array | None, axis: int, size: int, value=0) -> Array | None:
    if x is None or x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def _blocks(x: Array | None, axis: int, block: int) -> Array | None:
    """Splits `axis` (a multiple of `block`) into [n, ..., block, ...] with n leading."""
    if x is None:
        return None
    n = x.shape[axis] // block
    x = x.reshape(x.shape[:axis] + (n, block) + x.shape[axis + 1:])
    return jnp.moveaxis(x, axis, 0)


def _mix(p: Array, vx: Array) -> tuple[Array, Array]:
    """(p v [B, K, G, bq, D], rowsum(p) [..., 1]) float32 from p [B, K, G, bq, bk] and v with a
    column of ones [B, K, bk, D + 1]: one dot, no pass of its own for the sum."""
    pvx = jnp.einsum("bkgqs,bksd->bkgqd", p.astype(vx.dtype), vx,
                     preferred_element_type=jnp.float32)
    return pvx[..., :-1], pvx[..., -1:]


def _exact_block(m, l, acc, s, vx, masked: bool):
    """The online step (`softmax_math.online_max`): the running max updated from this
    block's row max. s: float32 [B, K, G, bq, bk], NEG where masked."""
    m_new, p, alpha = online_max(m, s, s > NEG / 2 if masked else None)
    pv, rowsum = _mix(p, vx)
    return m_new, alpha * l + rowsum, alpha * acc + pv


@functools.partial(jax.custom_jvp, nondiff_argnums=(5,))
def _softmax_block(m, l, acc, s, vx, masked: bool):
    """One key block into (m, l, acc). Once every row has a finite running max, exp against
    that max as it stands (no pass for the block's row max; masked entries give
    exp(NEG - m) = 0), kept unless a row's sum of p reaches exp(STALE_LOG_CAP - 1), else the
    exact step. Softmax is invariant to the reference point, so both agree to rounding.
    Differentiated (the jvp below), it is the exact step: a `lax.cond` under autodiff made
    the backward pass 17% slower on XLA:CPU."""
    def stale(_):
        pv, rowsum = _mix(jnp.exp(jnp.minimum(s - m, jnp.float32(STALE_LOG_CAP))), vx)
        ok = jnp.all(rowsum < jnp.float32(math.exp(STALE_LOG_CAP - 1)))  # False on NaN
        return jax.lax.cond(ok, lambda _: (m, l + rowsum, acc + pv),
                            lambda _: _exact_block(m, l, acc, s, vx, masked), None)

    return jax.lax.cond(jnp.all(m > NEG / 2), stale,
                        lambda _: _exact_block(m, l, acc, s, vx, masked), None)


@_softmax_block.defjvp
def _softmax_block_jvp(masked, primals, tangents):
    return jax.jvp(lambda *a: _exact_block(*a, masked), primals, tangents)


def attend_blockwise(q: Array, k: Array, v: Array, *, encoding: Encoding, params: Any,
                     q_positions: Array, k_positions: Array, causal: bool,
                     q_segment_ids: Array | None, k_segment_ids: Array | None,
                     k_mask: Array | None, block_q: int, block_k: int,
                     window: int | None = None, chunk_size: int | None = None,
                     sink_tokens: int = 0, sinks: Array | None = None) -> Array:
    """Online-softmax attention; same contract as `posenc_jax.model.attention.attend`.

    Args:
      q: [B, Lq, H, D]; k, v: [B, Lk, K, D].
      q_positions, q_segment_ids: [B|1, Lq]; k_positions, k_segment_ids, k_mask: [B|1, Lk]
        (already validated and made 2-D by `attend`; segment ids and k_mask may be None).
      block_q, block_k: block sizes (>= 1), clipped to Lq and Lk.
      window, chunk_size, sink_tokens: the local rules of `scores.build_mask`; key blocks
        wholly outside them are skipped like those above the causal diagonal.
      sinks: float [H] learned sink logits (gpt-oss) or None.

    Returns:
      [B, Lq, H, D] in q.dtype.
    """
    out, _ = attend_blockwise_lse(
        q, k, v, encoding=encoding, params=params, q_positions=q_positions,
        k_positions=k_positions, causal=causal, q_segment_ids=q_segment_ids,
        k_segment_ids=k_segment_ids, k_mask=k_mask, block_q=block_q, block_k=block_k,
        window=window, chunk_size=chunk_size, sink_tokens=sink_tokens, sinks=sinks)
    return out.astype(q.dtype)


def attend_blockwise_lse(q: Array, k: Array, v: Array, *, encoding: Encoding, params: Any,
                         q_positions: Array, k_positions: Array, causal: bool,
                         q_segment_ids: Array | None, k_segment_ids: Array | None,
                         k_mask: Array | None, block_q: int, block_k: int,
                         window: int | None = None, chunk_size: int | None = None,
                         sink_tokens: int = 0, sinks: Array | None = None
                         ) -> tuple[Array, Array]:
    """`attend_blockwise` that also returns each row's log-sum-exp, for merging partial results.

    Returns (out float32 [B, Lq, H, D], lse float32 [B, Lq, H]) with
    lse = log sum_j exp(s_j) over the row's visible keys, and -1e30 for a row that sees no
    key (its out is 0); with `sinks`, lse includes the sink (sink alone for such a row). Two
    results over disjoint key sets merge exactly by the online-softmax
    rule: lse = logaddexp(lse1, lse2), out = exp(lse1 - lse) out1 + exp(lse2 - lse) out2
    (`posenc_jax.model.context_parallel` does this across devices).
    """
    block_q, block_k = positive_int("block_q", block_q), positive_int("block_k", block_k)
    b, lq, h, d = q.shape
    lk, kh = k.shape[1], k.shape[2]
    if b == 0 or lq == 0 or lk == 0:  # as the dense path: no rows, or rows that see no key
        lse = jnp.full(q.shape[:3], NEG, jnp.float32)
        if sinks is not None:
            lse = jnp.broadcast_to(jnp.asarray(sinks, jnp.float32), q.shape[:3])
        return jnp.zeros(q.shape, jnp.float32), lse
    g = h // kh
    bq, bk = min(block_q, lq), min(block_k, lk)
    nq, nk = -(-lq // bq), -(-lk // bk)
    scale = 1.0 / math.sqrt(d)

    # Key validity: the caller's k_mask and the padding; None when every key is visible.
    valid = None
    if k_mask is not None or nk * bk != lk:
        valid = jnp.arange(nk * bk)[None, :] < lk
        if k_mask is not None:
            valid = jnp.logical_and(valid, _pad(k_mask.astype(bool), 1, nk * bk, False))
    has_mask = (causal or q_segment_ids is not None or valid is not None
                or window is not None or chunk_size is not None)

    q_blk = _blocks(_pad(q, 1, nq * bq), 1, bq)                              # [nq, B, bq, H, D]
    qp_blk = _blocks(_pad(q_positions, 1, nq * bq), 1, bq)                   # [nq, P, bq]
    qs_blk = _blocks(_pad(q_segment_ids, 1, nq * bq), 1, bq)
    # Keys and values in the dot's own layout, once: [nk, B, K, bk, D] (kv head before rows).
    k_blk = jnp.swapaxes(_blocks(_pad(k, 1, nk * bk), 1, bk), 2, 3)
    v_blk = jnp.swapaxes(_blocks(_pad(v, 1, nk * bk), 1, bk), 2, 3)
    v_blk = jnp.concatenate([v_blk, jnp.ones(v_blk.shape[:-1] + (1,), v.dtype)], -1)  # D + 1
    kp_blk = _blocks(_pad(k_positions, 1, nk * bk), 1, bk)                   # [nk, P, bk]
    ks_blk = _blocks(_pad(k_segment_ids, 1, nk * bk), 1, bk)
    valid_blk = _blocks(valid, 1, bk)

    # The softmax scale goes into q once per query block, not over every [bq, bk] score tile
    # (an XLA:CPU pass of its own), where that is exact enough: float32, or a power of two.
    fold = q.dtype == jnp.float32 or math.log2(scale).is_integer()

    def stack(x):
        """[B, n, H, D] -> [B, K, G * n, D]: the G query heads of a kv head stacked as rows
        (times the softmax scale when it is folded into q)."""
        n = x.shape[1]
        x = jnp.transpose(x.reshape(b, n, kh, g, d), (0, 2, 3, 1, 4)).reshape(b, kh, g * n, d)
        return x * jnp.asarray(scale, x.dtype) if fold else x

    def update(carry, qb, qs, kt, vt, qpb, kpb, mask):
        """One key block into the running state; mask None: every entry visible."""
        m, l, acc = carry                       # [B, K, G, bq, 1], same, [B, K, G, bq, D] f32
        if isinstance(encoding, BlockTransform):
            qb, kb = encoding.block_transform(params, qb, jnp.swapaxes(kt, 1, 2), qpb, kpb)
            qs, kt = stack(qb), jnp.swapaxes(kb, 1, 2)
        s = jnp.einsum("bkqd,bksd->bkqs", qs, kt, preferred_element_type=jnp.float32)
        s = s.reshape(b, kh, g, bq, bk)
        s = s if fold else s * jnp.float32(scale)
        bias = encoding_bias(encoding, params, qpb, kpb, (qb * scale).astype(qb.dtype), h)
        if bias is not None:                                              # [B|1, H, bq, bk]
            s = s + bias.reshape(bias.shape[0], kh, g, bq, bk)
        m5 = None if mask is None else mask[:, :, None]                   # [B|1, 1, 1, bq, bk]
        if m5 is not None:
            s = jnp.where(m5, s, jnp.float32(NEG))

        if isinstance(encoding, ValueTerm):  # p feeds the value term: the exact step inline
            m_new, p, alpha = online_max(m, s, m5)
            pv, rowsum = _mix(p, vt)
            extra = encoding.value_term(params, p.reshape(b, h, bq, -1), qpb, kpb)
            pv = pv + extra.astype(jnp.float32).reshape(b, kh, g, bq, d)  # linear in p
            return m_new, alpha * l + rowsum, alpha * acc + pv
        return _softmax_block(m, l, acc, s, vt, m5 is not None)

    def key_step(carry, xs, qb, qs, qpb, qsb):
        kt, vt, kpb, ksb, vmb = xs
        if not has_mask:
            return update(carry, qb, qs, kt, vt, qpb, kpb, None), None
        mask = build_mask(qpb, kpb, causal=causal, q_segment_ids=qsb, k_segment_ids=ksb,
                          k_mask=vmb, window=window, chunk_size=chunk_size,
                          sink_tokens=sink_tokens)                         # [B|1, 1, bq, bk]
        # 0: nothing visible (skipped: above the causal diagonal, outside a window...);
        # 1: some entries hidden (the masked update); 2: all visible (no mask arithmetic).
        which = jnp.where(jnp.all(mask), 2, jnp.where(jnp.any(mask), 1, 0))
        branches = (lambda c: c,
                    lambda c: update(c, qb, qs, kt, vt, qpb, kpb, mask),
                    lambda c: update(c, qb, qs, kt, vt, qpb, kpb, None))
        return jax.lax.switch(which, branches, carry), None

    def query_block(xs):
        qb, qpb, qsb = xs
        qs = stack(qb)                                                    # [B, K, G * bq, D]
        sink = None if sinks is None else jnp.reshape(sinks, (1, kh, g, 1, 1))
        init = (*start((b, kh, g, bq, 1), sink), jnp.zeros((b, kh, g, bq, d), jnp.float32))
        step = jax.checkpoint(lambda c, x: key_step(c, x, qb, qs, qpb, qsb), prevent_cse=False)
        (m, l, acc), _ = jax.lax.scan(step, init, (k_blk, v_blk, kp_blk, ks_blk, valid_blk))
        out = normalise(acc, l).reshape(b, h, bq, d)                     # head h = k * G + g
        seen = l[..., 0] > 0                      # a row that sees no key: lse NEG (merges as 0)
        lse = jnp.where(seen, m[..., 0] + jnp.log(jnp.where(seen, l[..., 0], 1.0)),
                        jnp.float32(NEG)).reshape(b, h, bq)
        return jnp.transpose(out, (0, 2, 1, 3)), jnp.transpose(lse, (0, 2, 1))

    out, lse = jax.lax.map(jax.checkpoint(query_block, prevent_cse=False),
                           (q_blk, qp_blk, qs_blk))      # [nq, B, bq, H, D], [nq, B, bq, H]
    out = jnp.moveaxis(out, 0, 1).reshape(b, nq * bq, h, d)
    lse = jnp.moveaxis(lse, 0, 1).reshape(b, nq * bq, h)
    return out[:, :lq], lse[:, :lq]
