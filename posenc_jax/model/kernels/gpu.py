"""Flash attention kernels in the GPU structure: one program per (batch, head, block), the
loop over the other sequence inside the kernel. Lowered with Triton on GPUs; also what CPU
interpret mode runs by default.

Why Triton and not Mosaic GPU on sm_90: the kernels are written against the portable Pallas
surface (BlockSpec, `pl.ds` ref slices, `lax.fori_loop`, `lax.cond`, `dot_general`), which
the Triton lowering compiles for any NVIDIA GPU, including H100/H200, with Triton choosing
the wgmma/TMA instructions itself. Mosaic GPU reaches sm_90's peak only with explicit
warpgroup programming (its own refs, barriers and TMA pipelines in
`jax.experimental.pallas.mosaic_gpu`), an API that still changes between jax releases (this
host has 0.10.2, the H200 machine 0.11.2); the same portable body lowered by Mosaic GPU
is not expected to run well. jax's own `pallas/ops/gpu/attention.py` makes the same choice.

Three kernels (Dao 2023, FlashAttention-2):
  fwd  grid (B, H, nq): online softmax over key blocks -> out, lse = m + log l.
  dq   grid (B, H, nq): dS = P * (dO V^T - delta) over key blocks -> dq (rotated back) and
       the bias params' gradient per (b, h, query block), summed outside.
  dkv  grid (B, K, nk): over the G heads of the group and all query blocks -> dk, dv.
A key block the mask hides entirely (block visibility `vis` [B, nq, nk], from positions) is
skipped with `lax.cond`.

Layout: q [B, H, Lq, D], k/v [B, K, Lk, D], lse/delta [B, H, Lq, 1] float32, q positions and
segment ids [B, Lq, 1], key positions/validity/segments [B, 1, Lk] int32 (L padded).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from posenc_jax.model.kernels import common as c
from posenc_jax.model.kernels.common import leaf_map as _leaf_map

__all__ = ["backward", "forward"]

F32 = jnp.float32


def _full(x):
    return pl.BlockSpec(x.shape, lambda *_: (0,) * x.ndim)


def _key_block(r, st, j, bk):
    rows = pl.ds(pl.multiple_of(j * bk, bk), bk)
    k_pos, k_valid = r["kpos"][:, rows], r["kvalid"][:, rows]
    k_seg = r["kseg"][:, rows] if st.segments else None
    return rows, k_pos, k_valid, k_seg


def _logits(r, st, params, qs, q_pos, q_seg, head, rows, k_pos, k_valid, k_seg, kidx):
    """(keep, s) for one block: masked scores + bias, float32 [bq, bk]; and k's (cos, sin)."""
    cs_k = c.rotation(r["rot"], jnp.transpose(k_pos)) if st.rotary else None
    ks = c.load_pieces(r["k"], kidx, st, cs_k)
    s = c.scores(qs, ks, st)
    b = c.bias(st, params, q_pos, k_pos, head)
    if b is not None:
        s = s + b
    keep = c.keep_mask(st, q_pos, k_pos, k_valid, q_seg, k_seg)
    return keep, jnp.where(keep, s, F32(c.NEG)), ks


def _fwd_kernel(*refs, st, names, bq, bk):
    r = dict(zip(names, refs))
    b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    params = c.load_params([r[n] for n in names if n.startswith("p")], st)
    q_pos = r["qpos"][...]
    q_seg = r["qseg"][...] if st.segments else None
    cs_q = c.rotation(r["rot"], q_pos) if st.rotary else None
    qs = c.load_pieces(r["q"], (slice(None),), st, cs_q)
    nk = r["k"].shape[0] // bk

    def body(j, carry):
        rows, k_pos, k_valid, k_seg = _key_block(r, st, j, bk)

        def update(carry):
            m, l, acc = carry
            keep, s, _ = _logits(r, st, params, qs, q_pos, q_seg, h, rows, k_pos, k_valid,
                                 k_seg, (rows,))
            m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
            p = jnp.where(keep, jnp.exp(s - m_new), F32(0.0))
            alpha = jnp.exp(m - m_new)
            v = r["v"][rows, :]
            acc = alpha * acc + c.matmul(p.astype(v.dtype), v, "nn")
            return m_new, alpha * l + jnp.sum(p, axis=1, keepdims=True), acc

        return lax.cond(r["vis"][b, i, j] != 0, update, lambda x: x, carry)

    d = r["q"].shape[-1]
    init = (jnp.full((bq, 1), c.NEG, F32), jnp.zeros((bq, 1), F32), jnp.zeros((bq, d), F32))
    m, l, acc = lax.fori_loop(0, nk, body, init)
    seen = l > 0
    safe = jnp.where(seen, l, F32(1.0))
    r["o"][...] = jnp.where(seen, acc / safe, F32(0.0)).astype(r["o"].dtype)
    r["lse"][...] = jnp.where(seen, m + jnp.log(safe), F32(0.0))


def _dq_kernel(*refs, st, names, bq, bk):
    r = dict(zip(names, refs))
    b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    param_refs = [r[n] for n in names if n.startswith("p")]
    params = c.load_params(param_refs, st)
    q_pos = r["qpos"][...]
    q_seg = r["qseg"][...] if st.segments else None
    cs_q = c.rotation(r["rot"], q_pos) if st.rotary else None
    qs = c.load_pieces(r["q"], (slice(None),), st, cs_q)
    do, lse, delta = r["do"][...], r["lse"][...], r["delta"][...]
    nk = r["k"].shape[0] // bk

    def body(j, carry):
        rows, k_pos, k_valid, k_seg = _key_block(r, st, j, bk)

        def update(carry):
            dqs, dps = carry
            keep, s, ks = _logits(r, st, params, qs, q_pos, q_seg, h, rows, k_pos, k_valid,
                                  k_seg, (rows,))
            p = jnp.where(keep, jnp.exp(s - lse), F32(0.0))
            ds = p * (c.matmul(do, r["v"][rows, :], "nt") - delta)
            dsc = (ds * F32(st.scale)).astype(ks[0].dtype)
            dqs = tuple(a + c.matmul(dsc, kp, "nn") for a, kp in zip(dqs, ks))
            grads = c.bias_vjp(st, params, q_pos, k_pos, h, ds)
            return dqs, tuple(a + g for a, g in zip(dps, grads))

        return lax.cond(r["vis"][b, i, j] != 0, update, lambda x: x, carry)

    init = (tuple(jnp.zeros((bq, n), F32) for _, n in st.pieces),
            tuple(jnp.zeros(p.shape, F32) for p in param_refs))
    dqs, dps = lax.fori_loop(0, nk, body, init)
    c.store_pieces(r["dq"], (slice(None),), st, c.unrotate(list(dqs), st, cs_q))
    for n, g in zip([n for n in names if n.startswith("dp")], dps):
        r[n][...] = g


def _dkv_kernel(*refs, st, names, bq, bk):
    r = dict(zip(names, refs))
    b, kh, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    params = c.load_params([r[n] for n in names if n.startswith("p")], st)
    k_pos, k_valid = r["kpos"][...], r["kvalid"][...]
    k_seg = r["kseg"][...] if st.segments else None
    cs_k = c.rotation(r["rot"], jnp.transpose(k_pos)) if st.rotary else None
    ks = c.load_pieces(r["k"], (slice(None),), st, cs_k)
    v = r["v"][...]
    nq = r["q"].shape[1] // bq

    def body(t, carry):
        g, i = lax.div(t, jnp.int32(nq)), lax.rem(t, jnp.int32(nq))
        rows = pl.ds(pl.multiple_of(i * bq, bq), bq)

        def update(carry):
            dks, dv = carry
            q_pos = r["qpos"][rows, :]
            q_seg = r["qseg"][rows, :] if st.segments else None
            cs_q = c.rotation(r["rot"], q_pos) if st.rotary else None
            qs = c.load_pieces(r["q"], (g, rows), st, cs_q)
            s = c.scores(qs, ks, st)
            bias = c.bias(st, params, q_pos, k_pos, kh * st.groups + g)
            s = s if bias is None else s + bias
            keep = c.keep_mask(st, q_pos, k_pos, k_valid, q_seg, k_seg)
            p = jnp.where(keep, jnp.exp(s - r["lse"][g, rows, :]), F32(0.0))
            do = r["do"][g, rows, :]
            dv = dv + c.matmul(p.astype(do.dtype), do, "tn")
            ds = p * (c.matmul(do, v, "nt") - r["delta"][g, rows, :])
            dsc = (ds * F32(st.scale)).astype(qs[0].dtype)
            return tuple(a + c.matmul(dsc, qp, "tn") for a, qp in zip(dks, qs)), dv

        return lax.cond(r["vis"][b, i, j] != 0, update, lambda x: x, carry)

    d = v.shape[-1]
    init = (tuple(jnp.zeros((bk, n), F32) for _, n in st.pieces), jnp.zeros((bk, d), F32))
    dks, dv = lax.fori_loop(0, st.groups * nq, body, init)
    c.store_pieces(r["dk"], (slice(None),), st, c.unrotate(list(dks), st, cs_k))
    r["dv"][...] = dv.astype(r["dv"].dtype)


def _specs(st, x, bq, bk, kind):
    """BlockSpecs by input name for grid (B, H, nq) ('q') or (B, K, nk) ('k')."""
    g = st.groups
    d, lq, lk = x["q"].shape[-1], x["q"].shape[2], x["k"].shape[2]
    if kind == "q":
        q_blk = pl.BlockSpec((None, None, bq, d), lambda b, h, i: (b, h, i, 0))
        row_blk = pl.BlockSpec((None, None, bq, 1), lambda b, h, i: (b, h, i, 0))
        kv_all = pl.BlockSpec((None, None, lk, d), lambda b, h, i: (b, jax.lax.div(h, jnp.int32(g)), 0, 0))
        qp = pl.BlockSpec((None, bq, 1), lambda b, h, i: (b, i, 0))
        kp = pl.BlockSpec((None, 1, lk), lambda b, h, i: (b, 0, 0))
        specs = {"q": q_blk, "do": q_blk, "k": kv_all, "v": kv_all, "lse": row_blk,
                 "delta": row_blk, "qpos": qp, "qseg": qp, "kpos": kp, "kvalid": kp, "kseg": kp}
    else:
        q_all = pl.BlockSpec((None, g, lq, d), lambda b, k, j: (b, k, 0, 0))
        row_all = pl.BlockSpec((None, g, lq, 1), lambda b, k, j: (b, k, 0, 0))
        k_blk = pl.BlockSpec((None, None, bk, d), lambda b, k, j: (b, k, j, 0))
        qp = pl.BlockSpec((None, lq, 1), lambda b, k, j: (b, 0, 0))
        kp = pl.BlockSpec((None, 1, bk), lambda b, k, j: (b, 0, j))
        specs = {"q": q_all, "do": q_all, "k": k_blk, "v": k_blk, "lse": row_all,
                 "delta": row_all, "qpos": qp, "qseg": qp, "kpos": kp, "kvalid": kp, "kseg": kp}
    return [specs.get(n) or _full(x[n]) for n in x]


def _call(kernel, st, x, out, out_specs, grid, bq, bk, kind, interpret):
    names = list(x) + list(out)
    kw = {} if interpret else {"compiler_params": _triton_params()}
    return pl.pallas_call(
        functools.partial(kernel, st=st, names=names, bq=bq, bk=bk),
        grid=grid, in_specs=_specs(st, x, bq, bk, kind), out_specs=out_specs,
        out_shape=list(out.values()), interpret=interpret, name=f"posenc_flash_{kernel.__name__[1:]}",
        **kw)(*x.values())


def _triton_params():
    return plt.CompilerParams(num_warps=4, num_stages=2)


def forward(st, x, vis, *, bq, bk, interpret):
    """x: dict of kernel inputs (see module doc). Returns (o [B,H,Lq,D], lse [B,H,Lq,1])."""
    b, h, lq, d = x["q"].shape
    x = dict(x, vis=vis)
    out = {"o": jax.ShapeDtypeStruct(x["q"].shape, x["q"].dtype),
           "lse": jax.ShapeDtypeStruct((b, h, lq, 1), F32)}
    specs = [pl.BlockSpec((None, None, bq, d), lambda b, h, i: (b, h, i, 0)),
             pl.BlockSpec((None, None, bq, 1), lambda b, h, i: (b, h, i, 0))]
    o, lse = _call(_fwd_kernel, st, x, out, specs, (b, h, lq // bq), bq, bk, "q", interpret)
    return o, lse


def backward(st, x, vis, *, bq, bk, interpret):
    """x also holds do, lse, delta. Returns (dq, dk, dv, [params leaves' grads, float32])."""
    b, h, lq, d = x["q"].shape
    kh, lk = x["k"].shape[1], x["k"].shape[2]
    nq = lq // bq
    x = dict(x, vis=vis)
    leaves = [n for n in x if n.startswith("p")]
    out = {"dq": jax.ShapeDtypeStruct(x["q"].shape, x["q"].dtype)}
    specs = [pl.BlockSpec((None, None, bq, d), lambda b, h, i: (b, h, i, 0))]
    for n in leaves:
        shape = x[n].shape
        out["d" + n] = jax.ShapeDtypeStruct((b, h, nq) + shape, F32)
        specs.append(pl.BlockSpec((None, None, None) + shape,
                                  _leaf_map(len(shape), 3)))
    dq, *dps = _call(_dq_kernel, st, x, out, specs, (b, h, nq), bq, bk, "q", interpret)
    out = {"dk": jax.ShapeDtypeStruct(x["k"].shape, x["k"].dtype),
           "dv": jax.ShapeDtypeStruct(x["v"].shape, x["v"].dtype)}
    blk = pl.BlockSpec((None, None, bk, d), lambda b, k, j: (b, k, j, 0))
    dk, dv = _call(_dkv_kernel, st, x, out, [blk, blk], (b, kh, lk // bk), bq, bk, "k",
                   interpret)
    return dq, dk, dv, [jnp.sum(g, axis=(0, 1, 2)) for g in dps]   # per-block -> total
