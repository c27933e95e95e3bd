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
* the mask: key valid, causal by positions (k_pos <= q_pos), equal segment ids.

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

from posenc_jax.model.softmax_math import NEG, log_normaliser, normalise, online_step

__all__ = ["NEG", "Side", "Static", "dkv_finish", "dkv_init", "dkv_step", "dq_finish",
           "dq_init", "dq_step", "fwd_finish", "fwd_init", "fwd_step", "load_keys",
           "load_queries", "store_pieces"]

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Static:
    """Everything static about one attention call (hashable: a custom_vjp nondiff arg)."""

    causal: bool
    segments: bool
    scale: float
    num_heads: int
    groups: int                    # G = H // K
    head_dim: int
    rotary: int                    # R, 0 without in-kernel rotation
    encoding: Any                  # a scheme with an elementwise bias, or None
    param_tree: Any                # treedef of the encoding's params
    block_q: int                   # CPU-interpret blocks (GPU and TPU: `blocks`)
    block_k: int
    cpu_kernel: str = "gpu"        # which kernel structure interpret mode runs: gpu | tpu
    blocks: Any = None             # a `blocks.KernelBlocks` (None: the defaults)
    interpret: Any = None          # CPU: `interpret=` of pallas_call (None: True), e.g. a
                                   # `pltpu.InterpretParams(out_of_bounds_reads="raise")`

    @property
    def pieces(self) -> tuple[tuple[int, int], ...]:
        """(start, width) of the feature pieces: rotated halves, then pass-through."""
        r, d = self.rotary, self.head_dim
        if not r:
            return ((0, d),)
        return ((0, r), (r, r)) + (((2 * r, d - 2 * r),) if 2 * r < d else ())


@dataclasses.dataclass
class Side:
    """One block of queries or keys as loaded: (rotated) feature pieces, positions (q
    [bq, 1], k [1, bk]), segment ids or None, key validity (keys only) and (cos, sin)."""

    pieces: list
    pos: Any
    seg: Any
    cs: Any
    valid: Any = None


def matmul(a, b, dims: str):
    """'nt': a @ b.T, 'nn': a @ b, 'tn': a.T @ b; float32 accumulation."""
    contract = {"nt": ((1,), (1,)), "nn": ((1,), (0,)), "tn": ((0,), (0,))}[dims]
    precision = lax.Precision.HIGHEST if a.dtype == F32 else None
    return lax.dot_general(a, b, (contract, ((), ())), precision=precision,
                           preferred_element_type=F32)


def rotation(rot_ref, positions):
    """(cos, sin) float32 [n, R] at int positions [n, 1]; rot_ref rows: inv_freq, factor."""
    inv_freq, factor = rot_ref[pl.ds(0, 1), :], rot_ref[pl.ds(1, 1), :]      # [1, R] each
    angles = positions.astype(F32) * inv_freq
    return jnp.cos(angles) * factor, jnp.sin(angles) * factor


def load_pieces(ref, index: tuple, st: Static, cs=None) -> list:
    """The feature pieces of `ref[index + (features,)]`, rotated when cs = (cos, sin)."""
    pieces = [ref[index + (pl.ds(a, n),)] for a, n in st.pieces]
    if cs is None or not st.rotary:
        return pieces
    c, s = cs
    dt = pieces[0].dtype
    x1, x2 = pieces[0].astype(F32), pieces[1].astype(F32)
    return [(x1 * c - x2 * s).astype(dt), (x2 * c + x1 * s).astype(dt)] + pieces[2:]


def unrotate(grads: list, st: Static, cs=None) -> list:
    """Gradients w.r.t. rotated pieces -> w.r.t. the raw pieces (the rotation transposed)."""
    if cs is None or not st.rotary:
        return grads
    c, s = cs
    g1, g2 = grads[0], grads[1]
    return [g1 * c + g2 * s, g2 * c - g1 * s] + grads[2:]


def store_pieces(ref, index: tuple, st: Static, pieces: list) -> None:
    for (a, n), piece in zip(st.pieces, pieces):
        ref[index + (pl.ds(a, n),)] = piece.astype(ref.dtype)


def load_queries(r, st: Static, index: tuple, rows) -> Side:
    """The query block `r["q"][index]` with positions `r["qpos"][rows, :]`, rotated."""
    pos = r["qpos"][rows, :]
    cs = rotation(r["rot"], pos) if st.rotary else None
    seg = r["qseg"][rows, :] if st.segments else None
    return Side(load_pieces(r["q"], index, st, cs), pos, seg, cs)


def load_keys(r, st: Static, index: tuple, cols) -> Side:
    """The key block `r["k"][index]` with positions `r["kpos"][:, cols]`, rotated."""
    pos = r["kpos"][:, cols]
    cs = rotation(r["rot"], jnp.transpose(pos)) if st.rotary else None
    seg = r["kseg"][:, cols] if st.segments else None
    return Side(load_pieces(r["k"], index, st, cs), pos, seg, cs, r["kvalid"][:, cols])


def scores(qs: list, ks: list, st: Static):
    """q.k^T * scale summed over pieces: float32 [bq, bk]."""
    out = matmul(qs[0], ks[0], "nt")
    for a, b in zip(qs[1:], ks[1:]):
        out = out + matmul(a, b, "nt")
    return out * F32(st.scale)


def keep_mask(st: Static, q: Side, k: Side):
    """bool [bq, bk]: which scores are visible (key valid, causal, same segment)."""
    keep = jnp.broadcast_to(k.valid != 0, (q.pos.shape[0], k.pos.shape[1]))
    if st.causal:
        keep = jnp.logical_and(keep, k.pos <= q.pos)
    if st.segments:
        keep = jnp.logical_and(keep, q.seg == k.seg)
    return keep


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

def fwd_init(bq: int, d: int):
    """(m, l, acc): [bq, 1], [bq, 1], [bq, D] float32."""
    return (jnp.full((bq, 1), NEG, F32), jnp.zeros((bq, 1), F32), jnp.zeros((bq, d), F32))


def fwd_step(st: Static, params, head, q: Side, k: Side, v, carry):
    m, l, acc = carry
    keep, s = logits(st, params, head, q, k)
    m, l, p, alpha = online_step(m, l, s, keep)
    return m, l, alpha * acc + matmul(p.astype(v.dtype), v, "nn")


def fwd_finish(carry, dtype):
    """(out [bq, D] in dtype, lse [bq, 1] float32); rows that saw no key: 0 and 0."""
    m, l, acc = carry
    return normalise(acc, l).astype(dtype), log_normaliser(m, l)


# --- backward: P = exp(S - lse), dS = P * (dO V^T - delta) -----------------------------

def _probs(st: Static, params, head, q: Side, k: Side, v, do, lse, delta):
    keep, s = logits(st, params, head, q, k)
    p = jnp.where(keep, jnp.exp(s - lse), F32(0.0))
    return p, p * (matmul(do, v, "nt") - delta)


def dq_init(st: Static, bq: int, param_shapes):
    """(dq pieces [bq, n] each, params-gradient leaves) float32 zeros."""
    return (tuple(jnp.zeros((bq, n), F32) for _, n in st.pieces),
            tuple(jnp.zeros(shape, F32) for shape in param_shapes))


def dq_step(st: Static, params, head, q: Side, k: Side, v, do, lse, delta, carry):
    dqs, dps = carry
    p, ds = _probs(st, params, head, q, k, v, do, lse, delta)
    dsc = (ds * F32(st.scale)).astype(k.pieces[0].dtype)
    dqs = tuple(a + matmul(dsc, kp, "nn") for a, kp in zip(dqs, k.pieces))
    grads = bias_vjp(st, params, q.pos, k.pos, head, ds)
    return dqs, tuple(a + g for a, g in zip(dps, grads))


def dq_finish(st: Static, carry, q_cs):
    """(dq pieces w.r.t. the raw q, params-gradient leaves)."""
    dqs, dps = carry
    return unrotate(list(dqs), st, q_cs), list(dps)


def dkv_init(st: Static, bk: int, d: int):
    """(dk pieces [bk, n] each, dv [bk, D]) float32 zeros."""
    return tuple(jnp.zeros((bk, n), F32) for _, n in st.pieces), jnp.zeros((bk, d), F32)


def dkv_step(st: Static, params, head, q: Side, k: Side, v, do, lse, delta, carry):
    dks, dv = carry
    p, ds = _probs(st, params, head, q, k, v, do, lse, delta)
    dv = dv + matmul(p.astype(do.dtype), do, "tn")
    dsc = (ds * F32(st.scale)).astype(q.pieces[0].dtype)
    return tuple(a + matmul(dsc, qp, "tn") for a, qp in zip(dks, q.pieces)), dv


def dkv_finish(st: Static, carry, k_cs):
    """(dk pieces w.r.t. the raw k, dv float32)."""
    dks, dv = carry
    return unrotate(list(dks), st, k_cs), dv
