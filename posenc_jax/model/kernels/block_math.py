"""The block math of every attention kernel (GPU, TPU, interpret), written once.

A kernel sees one block of queries [bq, D] and one of keys [bk, D] at a time (a `Side`:
the block's feature pieces, positions -- q [bq, 1], k [1, bk] int32 --, segment ids, key
validity int32 [1, bk], RoPE's (cos, sin)). Everything positional is computed here from those:

* RoPE in-kernel: q and k are loaded as feature pieces [0, R), [R, 2R), [2R, D) and the
  first two are rotated by cos/sin of `position * inv_freq` (float32, times the attention
  factor), then cast back to the input dtype -- exactly what `rope.apply` does outside. The
  scores are the sum of the pieces' dot products, so no concatenate is needed; gradients
  w.r.t. rotated pieces are rotated back with the transposed rotation (`unrotate`).
  The "interleaved" layout is permuted to "half" by the caller (a permutation of features
  applied to both q and k leaves q.k unchanged).
* the bias: `encoding.elementwise_bias(params, q_pos, k_pos, head)` on the block ([bq, bk]
  float32); its params gradient is `jax.vjp` of that same function at dS (`bias_vjp`).
* the mask: key valid, causal by positions (k_pos <= q_pos), equal segment ids, and the
  local rules: the window (q_pos - k_pos < W), equal chunk ids (pos // c, computed by the
  caller), keys with k_pos < sink_tokens exempt from both.
* learned sinks (gpt-oss): the forward's state starts at (m, l) = (sink, 1) per row, so the
  sink joins the denominator once and lse includes it; the backward's P = exp(S - lse) is
  then already right, and the sink's gradient, -sum_rows exp(sink - lse) delta, is one
  reduction outside the kernel (`vjp.py`).

The three passes are `*_init` / `*_step` / `*_finish` triples over a carry, the same for
the GPU structure (the carry in a `fori_loop`) and the TPU one (the carry in VMEM scratch):
forward (the online softmax of `posenc_jax.model.softmax_math`), dq (+ the bias params'
gradient) and dk/dv. All matmuls accumulate in float32 (`preferred_element_type`); the
softmax state is float32.

Shapes: bq / bk block rows, D head dim, R rotary frequencies (pieces), G = H // K.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from posenc_jax.model.kernels.static import Static
from posenc_jax.model.softmax_math import NEG, log_normaliser, normalise, online_step, start

__all__ = ["NEG", "Side", "Static", "dkv_finish", "dkv_init", "dkv_step", "dq_finish",
           "dq_init", "dq_step", "fwd_finish", "fwd_init", "fwd_step", "load_chunks",
           "load_keys", "load_queries", "store_chunks", "store_pieces"]

F32 = jnp.float32


@dataclasses.dataclass
class Side:
    """One block of queries or keys as loaded: (rotated) feature pieces, positions (q
    [bq, 1], k [1, bk]), segment ids or None, (cos, sin), key validity (keys only) and chunk
    ids or None."""

    pieces: list
    pos: Any
    seg: Any
    cs: Any
    valid: Any = None
    chunk: Any = None


def matmul(a, b, dims: str):
    """'nt': a @ b.T, 'nn': a @ b, 'tn': a.T @ b; float32 accumulation."""
    contract = {"nt": ((1,), (1,)), "nn": ((1,), (0,)), "tn": ((0,), (0,))}[dims]
    precision = lax.Precision.HIGHEST if a.dtype == F32 else None
    return lax.dot_general(a, b, (contract, ((), ())), precision=precision,
                           preferred_element_type=F32)


def rotation(rot_ref, positions, st: Static) -> list:
    """(cos, sin) float32 [n, w] per rotated chunk at int positions [n, 1]; rot_ref rows:
    inv_freq, factor."""
    out = []
    for a, w in st.rot_chunks:
        inv_freq, factor = rot_ref[pl.ds(0, 1), pl.ds(a, w)], rot_ref[pl.ds(1, 1), pl.ds(a, w)]
        angles = positions.astype(F32) * inv_freq
        out.append((jnp.cos(angles) * factor, jnp.sin(angles) * factor))
    return out


def load_chunks(ref, index: tuple, chunks) -> list:
    """`ref[index + (features,)]` for each (start, width) chunk."""
    return [ref[index + (pl.ds(a, n),)] for a, n in chunks]


def store_chunks(ref, index: tuple, chunks, values: list) -> None:
    for (a, n), x in zip(chunks, values):
        ref[index + (pl.ds(a, n),)] = x.astype(ref.dtype)


def load_pieces(ref, index: tuple, st: Static, cs=None) -> list:
    """The feature chunks of `ref[index + (features,)]`, rotated when cs (per chunk pair)."""
    pieces = load_chunks(ref, index, st.pieces)
    if cs is None or not st.rotary:
        return pieces
    m = len(cs)
    dt = pieces[0].dtype
    out = list(pieces)
    for i, (c, s) in enumerate(cs):
        x1, x2 = pieces[i].astype(F32), pieces[m + i].astype(F32)
        out[i], out[m + i] = (x1 * c - x2 * s).astype(dt), (x2 * c + x1 * s).astype(dt)
    return out


def unrotate(grads: list, st: Static, cs=None) -> list:
    """Gradients w.r.t. rotated chunks -> w.r.t. the raw chunks (the rotation transposed)."""
    if cs is None or not st.rotary:
        return grads
    m, out = len(cs), list(grads)
    for i, (c, s) in enumerate(cs):
        g1, g2 = grads[i], grads[m + i]
        out[i], out[m + i] = g1 * c + g2 * s, g2 * c - g1 * s
    return out


def store_pieces(ref, index: tuple, st: Static, pieces: list) -> None:
    store_chunks(ref, index, st.pieces, pieces)


def load_queries(r, st: Static, index: tuple, rows) -> Side:
    """The query block `r["q"][index]` with positions `r["qpos"][rows, :]`, rotated."""
    pos = r["qpos"][rows, :]
    cs = rotation(r["rot"], pos, st) if st.rotary else None
    seg = r["qseg"][rows, :] if st.segments else None
    chunk = r["qchunk"][rows, :] if st.chunks else None
    return Side(load_pieces(r["q"], index, st, cs), pos, seg, cs, chunk=chunk)


def load_keys(r, st: Static, index: tuple, cols) -> Side:
    """The key block `r["k"][index]` with positions `r["kpos"][:, cols]`, rotated."""
    pos = r["kpos"][:, cols]
    cs = rotation(r["rot"], jnp.transpose(pos), st) if st.rotary else None
    seg = r["kseg"][:, cols] if st.segments else None
    chunk = r["kchunk"][:, cols] if st.chunks else None
    return Side(load_pieces(r["k"], index, st, cs), pos, seg, cs, r["kvalid"][:, cols], chunk)


def scores(qs: list, ks: list, st: Static):
    """q.k^T * scale summed over pieces: float32 [bq, bk]."""
    out = matmul(qs[0], ks[0], "nt")
    for a, b in zip(qs[1:], ks[1:]):
        out = out + matmul(a, b, "nt")
    return out * F32(st.scale)


def keep_mask(st: Static, q: Side, k: Side):
    """bool [bq, bk]: which scores are visible (key valid, causal, same segment, and the
    local rules: inside the window, q_pos - k_pos < window, and the same chunk, unless
    k_pos < sink_tokens) -- `scores.build_mask`, block by block."""
    keep = jnp.broadcast_to(k.valid != 0, (q.pos.shape[0], k.pos.shape[1]))
    if st.causal:
        keep = jnp.logical_and(keep, k.pos <= q.pos)
    if st.segments:
        keep = jnp.logical_and(keep, q.seg == k.seg)
    local = None
    if st.window is not None:
        local = q.pos - k.pos < st.window
    if st.chunks:
        same = q.chunk == k.chunk
        local = same if local is None else jnp.logical_and(local, same)
    if local is not None and st.sink_tokens:
        local = jnp.logical_or(local, k.pos < st.sink_tokens)
    return keep if local is None else jnp.logical_and(keep, local)


def _head(head):
    return jnp.full((1, 1), head, jnp.int32)


def bias(st: Static, params, q_pos, k_pos, head):
    """The encoding's elementwise bias on the block, float32 [bq, bk] (None without one)."""
    if st.encoding is None:
        return None
    out = st.encoding.elementwise_bias(params, q_pos, k_pos, _head(head))
    return jnp.broadcast_to(out.astype(F32), (q_pos.shape[0], k_pos.shape[1]))


def bias_vjp(st: Static, params, q_pos, k_pos, head, ds) -> list:
    """Gradient of sum(bias * ds) w.r.t. each params leaf (float32, leaf shapes)."""
    leaves = jax.tree.leaves(params)
    if st.encoding is None or not leaves:
        return []

    def f(p):
        return bias(st, p, q_pos, k_pos, head)

    _, pullback = jax.vjp(f, params)
    return [g.astype(F32) for g in jax.tree.leaves(pullback(ds)[0])]


def logits(st: Static, params, head, q: Side, k: Side):
    """(keep, s): the block's visible entries and its logits q.k * scale + bias, float32
    [bq, bk], NEG where hidden."""
    s = scores(q.pieces, k.pieces, st)
    b = bias(st, params, q.pos, k.pos, head)
    s = s if b is None else s + b
    keep = keep_mask(st, q, k)
    return keep, jnp.where(keep, s, F32(NEG))


# --- forward: online softmax -> (out, lse) ---------------------------------------------
# v, dO, out and dv travel as lists of chunks (`Static.v_pieces`).

def fwd_init(st: Static, bq: int, sink=None):
    """(m, l, acc chunks): [bq, 1], [bq, 1], ([bq, w], ...) float32; `sink` float32 [bq, 1]
    (the rows' sink logits) starts (m, l) at (sink, 1) (`softmax_math.start`)."""
    return (*start((bq, 1), sink), tuple(jnp.zeros((bq, w), F32) for _, w in st.v_pieces))


def fwd_step(st: Static, params, head, q: Side, k: Side, vs: list, carry):
    m, l, acc = carry
    keep, s = logits(st, params, head, q, k)
    m, l, p, alpha = online_step(m, l, s, keep)
    return m, l, tuple(alpha * a + matmul(p.astype(v.dtype), v, "nn") for a, v in zip(acc, vs))


def fwd_finish(carry, dtype):
    """(out chunks [bq, w] in dtype, lse [bq, 1] float32); rows that saw no key: 0 and NEG
    (as `blockwise.attend_blockwise_lse`: such a row merges across key sets as weight 0; the
    backward never reads it, its p is 0 wherever the mask hides)."""
    m, l, acc = carry
    return ([normalise(a, l).astype(dtype) for a in acc],
            jnp.where(l > 0, log_normaliser(m, l), F32(NEG)))


# --- backward: P = exp(S - lse), dS = P * (dO V^T - delta) -----------------------------

def _probs(st: Static, params, head, q: Side, k: Side, vs, dos, lse, delta):
    keep, s = logits(st, params, head, q, k)
    p = jnp.where(keep, jnp.exp(s - lse), F32(0.0))
    dov = matmul(dos[0], vs[0], "nt")
    for do, v in zip(dos[1:], vs[1:]):
        dov = dov + matmul(do, v, "nt")
    return p, p * (dov - delta)


def dq_init(st: Static, bq: int, param_shapes):
    """(dq chunks [bq, n] each, params-gradient leaves) float32 zeros."""
    return (tuple(jnp.zeros((bq, n), F32) for _, n in st.pieces),
            tuple(jnp.zeros(shape, F32) for shape in param_shapes))


def dq_step(st: Static, params, head, q: Side, k: Side, vs, dos, lse, delta, carry):
    dqs, dps = carry
    p, ds = _probs(st, params, head, q, k, vs, dos, lse, delta)
    dsc = (ds * F32(st.scale)).astype(k.pieces[0].dtype)
    dqs = tuple(a + matmul(dsc, kp, "nn") for a, kp in zip(dqs, k.pieces))
    grads = bias_vjp(st, params, q.pos, k.pos, head, ds)
    return dqs, tuple(a + g for a, g in zip(dps, grads))


def dq_finish(st: Static, carry, q_cs):
    """(dq chunks w.r.t. the raw q, params-gradient leaves)."""
    dqs, dps = carry
    return unrotate(list(dqs), st, q_cs), list(dps)


def dkv_init(st: Static, bk: int):
    """(dk chunks [bk, n] each, dv chunks [bk, w] each) float32 zeros."""
    return (tuple(jnp.zeros((bk, n), F32) for _, n in st.pieces),
            tuple(jnp.zeros((bk, w), F32) for _, w in st.v_pieces))


def dkv_step(st: Static, params, head, q: Side, k: Side, vs, dos, lse, delta, carry):
    dks, dvs = carry
    p, ds = _probs(st, params, head, q, k, vs, dos, lse, delta)
    dvs = tuple(a + matmul(p.astype(do.dtype), do, "tn") for a, do in zip(dvs, dos))
    dsc = (ds * F32(st.scale)).astype(q.pieces[0].dtype)
    return tuple(a + matmul(dsc, qp, "tn") for a, qp in zip(dks, q.pieces)), dvs


def dkv_finish(st: Static, carry, k_cs):
    """(dk chunks w.r.t. the raw k, dv chunks float32)."""
    dks, dvs = carry
    return unrotate(list(dks), st, k_cs), list(dvs)
