"""The block math shared by every attention kernel (GPU, TPU, interpret): one score function.

A kernel sees one block of queries [bq, D] and one of keys [bk, D] at a time, with the
block's positions (q [bq, 1], k [1, bk] int32), key validity (int32 [1, bk]: cache slots,
padding) and optional segment ids. Everything positional is computed here from those:

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

All matmuls accumulate in float32 (`preferred_element_type`); the softmax state is float32.

Shapes: bq / bk block rows, D head dim, R rotary frequencies (pieces), G = H // K.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

__all__ = [
    "NEG",
    "Static",
    "bias",
    "bias_vjp",
    "keep_mask",
    "leaf_map",
    "load_params",
    "load_pieces",
    "matmul",
    "rotation",
    "scores",
    "store_pieces",
    "unrotate",
]

NEG = -1e30  # a finite "minus infinity": exp(NEG - m) underflows to 0, never NaN
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
    block_q: int                   # CPU-interpret blocks (GPU and TPU pick their own)
    block_k: int
    cpu_kernel: str = "gpu"        # which kernel structure interpret mode runs: gpu | tpu

    @property
    def pieces(self) -> tuple[tuple[int, int], ...]:
        """(start, width) of the feature pieces: rotated halves, then pass-through."""
        r, d = self.rotary, self.head_dim
        if not r:
            return ((0, d),)
        return ((0, r), (r, r)) + (((2 * r, d - 2 * r),) if 2 * r < d else ())


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


def scores(qs: list, ks: list, st: Static):
    """q.k^T * scale summed over pieces: float32 [bq, bk]."""
    out = matmul(qs[0], ks[0], "nt")
    for a, b in zip(qs[1:], ks[1:]):
        out = out + matmul(a, b, "nt")
    return out * F32(st.scale)


def keep_mask(st: Static, q_pos, k_pos, k_valid, q_seg=None, k_seg=None):
    """bool [bq, bk]: which scores are visible (key valid, causal, same segment)."""
    keep = jnp.broadcast_to(k_valid != 0, (q_pos.shape[0], k_pos.shape[1]))
    if st.causal:
        keep = jnp.logical_and(keep, k_pos <= q_pos)
    if st.segments:
        keep = jnp.logical_and(keep, q_seg == k_seg)
    return keep


def load_params(refs: list, st: Static):
    """The encoding's params pytree, each leaf loaded whole (they are small tables)."""
    return jax.tree.unflatten(st.param_tree, [r[...] for r in refs])


def leaf_map(ndim: int, lead: int):
    """Index map of a per-block params-gradient output: the first `lead` grid ids, then 0s."""
    return lambda *ids: tuple(ids[:lead]) + (0,) * ndim


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
