"""Flash attention kernels in the TPU structure (Mosaic): the loop over the other sequence is
the LAST GRID AXIS ("arbitrary"), its state in VMEM scratch, so Pallas's pipeline streams
one key (or query) block at a time through VMEM -- memory on chip is O(block), whatever L.

  fwd  grid (B, H, nq, nk): scratch m, l [bq, 1], acc [bq, D]; out and lse at the last j.
  dq   grid (B, H, nq, nk): scratch dq pieces; params' gradient accumulated in the output
       block (resident across j), one per (b, h, query block), summed outside.
  dkv  grid (B, K, nk, G * nq): scratch dk pieces, dv; q/do blocks of head kh * G + t // nq.
Block visibility: each program gets its row of `vis` [B, nq, nk] in SMEM (the [nk] row of
its query block; for dkv the [nq] column of its key block), so SMEM holds O(L / block)
words; an invisible block is skipped with `pl.when`. The block math is `common.py`, the
same as the GPU kernels'.

Layout as in `gpu.py`; key blocks are lane-dense ([1, bk] positions, bk a multiple of 128
or the whole padded length).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from posenc_jax.model.kernels import common as c
from posenc_jax.model.kernels.common import leaf_map as _leaf_map

__all__ = ["backward", "forward"]

F32 = jnp.float32


def _div(a, n: int):  # lax, not //: jnp's floor division lowers via sign (needs a TPU)
    return jax.lax.div(a, jnp.int32(n))


def _rem(a, n: int):
    return jax.lax.rem(a, jnp.int32(n))


def _block(r, st, params, head):
    """Rotated q, k pieces, masked logits s and keep for the current (q block, k block)."""
    q_pos, k_pos = r["qpos"][...], r["kpos"][...]
    cs_q = c.rotation(r["rot"], q_pos) if st.rotary else None
    cs_k = c.rotation(r["rot"], jnp.transpose(k_pos)) if st.rotary else None
    qs = c.load_pieces(r["q"], (slice(None),), st, cs_q)
    ks = c.load_pieces(r["k"], (slice(None),), st, cs_k)
    s = c.scores(qs, ks, st)
    b = c.bias(st, params, q_pos, k_pos, head)
    s = s if b is None else s + b
    keep = c.keep_mask(st, q_pos, k_pos, r["kvalid"][...],
                       r["qseg"][...] if st.segments else None,
                       r["kseg"][...] if st.segments else None)
    return qs, ks, keep, jnp.where(keep, s, F32(c.NEG)), cs_q, cs_k


def _params(r, names, st):
    return c.load_params([r[n] for n in names if n.startswith("p")], st)


def _fwd_kernel(*refs, st, names):
    r = dict(zip(names, refs))
    h, j = pl.program_id(1), pl.program_id(3)
    m_ref, l_ref, acc_ref = refs[len(names):]

    @pl.when(j == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, c.NEG, F32)
        l_ref[...] = jnp.zeros(l_ref.shape, F32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

    @pl.when(r["vis"][0, j] != 0)
    def _():
        _, _, keep, s, _, _ = _block(r, st, _params(r, names, st), h)
        m = m_ref[...]
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        p = jnp.where(keep, jnp.exp(s - m_new), F32(0.0))
        alpha = jnp.exp(m - m_new)
        v = r["v"][...]
        acc_ref[...] = alpha * acc_ref[...] + c.matmul(p.astype(v.dtype), v, "nn")
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        m_ref[...] = m_new

    @pl.when(j == pl.num_programs(3) - 1)
    def _():
        l = l_ref[...]
        seen = l > 0
        safe = jnp.where(seen, l, F32(1.0))
        r["o"][...] = jnp.where(seen, acc_ref[...] / safe, F32(0.0)).astype(r["o"].dtype)
        r["lse"][...] = jnp.where(seen, m_ref[...] + jnp.log(safe), F32(0.0))


def _dq_kernel(*refs, st, names):
    r = dict(zip(names, refs))
    h, j = pl.program_id(1), pl.program_id(3)
    dq_refs = refs[len(names):]
    dp_names = [n for n in names if n.startswith("dp")]

    @pl.when(j == 0)
    def _():
        for a in list(dq_refs) + [r[n] for n in dp_names]:
            a[...] = jnp.zeros(a.shape, a.dtype)

    @pl.when(r["vis"][0, j] != 0)
    def _():
        params = _params(r, names, st)
        _, ks, keep, s, _, _ = _block(r, st, params, h)
        p = jnp.where(keep, jnp.exp(s - r["lse"][...]), F32(0.0))
        ds = p * (c.matmul(r["do"][...], r["v"][...], "nt") - r["delta"][...])
        dsc = (ds * F32(st.scale)).astype(ks[0].dtype)
        for a, kp in zip(dq_refs, ks):
            a[...] += c.matmul(dsc, kp, "nn")
        grads = c.bias_vjp(st, params, r["qpos"][...], r["kpos"][...], h, ds)
        for n, g in zip(dp_names, grads):
            r[n][...] += g

    @pl.when(j == pl.num_programs(3) - 1)
    def _():
        cs_q = c.rotation(r["rot"], r["qpos"][...]) if st.rotary else None
        dqs = c.unrotate([a[...] for a in dq_refs], st, cs_q)
        c.store_pieces(r["dq"], (slice(None),), st, dqs)


def _dkv_kernel(*refs, st, names, nq):
    r = dict(zip(names, refs))
    kh, t = pl.program_id(1), pl.program_id(3)
    *dk_refs, dv_ref = refs[len(names):]
    g, i = _div(t, nq), _rem(t, nq)

    @pl.when(t == 0)
    def _():
        for a in list(dk_refs) + [dv_ref]:
            a[...] = jnp.zeros(a.shape, a.dtype)

    @pl.when(r["vis"][0, i] != 0)
    def _():
        qs, _, keep, s, _, _ = _block(r, st, _params(r, names, st), kh * st.groups + g)
        p = jnp.where(keep, jnp.exp(s - r["lse"][...]), F32(0.0))
        do = r["do"][...]
        dv_ref[...] += c.matmul(p.astype(do.dtype), do, "tn")
        ds = p * (c.matmul(do, r["v"][...], "nt") - r["delta"][...])
        dsc = (ds * F32(st.scale)).astype(qs[0].dtype)
        for a, qp in zip(dk_refs, qs):
            a[...] += c.matmul(dsc, qp, "tn")

    @pl.when(t == pl.num_programs(3) - 1)
    def _():
        cs_k = c.rotation(r["rot"], jnp.transpose(r["kpos"][...])) if st.rotary else None
        dks = c.unrotate([a[...] for a in dk_refs], st, cs_k)
        c.store_pieces(r["dk"], (slice(None),), st, dks)
        r["dv"][...] = dv_ref[...].astype(r["dv"].dtype)


def _specs(st, x, bq, bk, kind, nq):
    """BlockSpecs by name: grid (B, H, nq, nk) for 'q', (B, K, nk, G * nq) for 'k'."""
    g, d = st.groups, x["q"].shape[-1]
    if kind == "q":
        qi = lambda b, h, i, j: (b, h, i, 0)
        ki = lambda b, h, i, j: (b, _div(h, g), j, 0)
        qr, kr = (lambda b, h, i, j: (b, i, 0)), (lambda b, h, i, j: (b, 0, j))
        vis = pl.BlockSpec((None, 1, x["vis"].shape[2]), lambda b, h, i, j: (b * nq + i, 0, 0),
                           memory_space=pltpu.SMEM)                        # row [1, nk]
    else:
        qi = lambda b, k, j, t: (b, k * g + _div(t, nq), _rem(t, nq), 0)
        ki = lambda b, k, j, t: (b, k, j, 0)
        qr, kr = (lambda b, k, j, t: (b, _rem(t, nq), 0)), (lambda b, k, j, t: (b, 0, j))
        nk = x["k"].shape[2] // bk
        vis = pl.BlockSpec((None, 1, nq), lambda b, k, j, t: (b * nk + j, 0, 0),
                           memory_space=pltpu.SMEM)                        # vis^T row [1, nq]
    q_blk, row = pl.BlockSpec((None, None, bq, d), qi), pl.BlockSpec((None, None, bq, 1), qi)
    k_blk = pl.BlockSpec((None, None, bk, d), ki)
    qp, kp = pl.BlockSpec((None, bq, 1), qr), pl.BlockSpec((None, 1, bk), kr)
    specs = {"q": q_blk, "do": q_blk, "k": k_blk, "v": k_blk, "lse": row, "delta": row,
             "qpos": qp, "qseg": qp, "kpos": kp, "kvalid": kp, "kseg": kp,
             "vis": vis}
    return [specs.get(n) or pl.BlockSpec(x[n].shape, lambda *_, n=x[n].ndim: (0,) * n)
            for n in x]


def _call(kernel, st, x, out, out_specs, grid, scratch, bq, bk, kind, interpret, **kw):
    names = list(x) + list(out)
    nq = x["q"].shape[2] // bq
    return pl.pallas_call(
        functools.partial(kernel, st=st, names=names, **kw), grid=grid,
        in_specs=_specs(st, x, bq, bk, kind, nq), out_specs=out_specs,
        out_shape=list(out.values()), scratch_shapes=scratch, interpret=interpret,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
        name=f"posenc_flash_{kernel.__name__[1:]}")(*x.values())


def _rows(vis):
    """[B, n, m] -> [B * n, 1, m]: one SMEM row per program (TPU block tiling rules)."""
    b, n, m = vis.shape
    return vis.reshape(b * n, 1, m)


def forward(st, x, vis, *, bq, bk, interpret):
    """As `gpu.forward`."""
    b, h, lq, d = x["q"].shape
    x = dict(x, vis=_rows(vis))
    out = {"o": jax.ShapeDtypeStruct(x["q"].shape, x["q"].dtype),
           "lse": jax.ShapeDtypeStruct((b, h, lq, 1), F32)}
    qi = lambda b, h, i, j: (b, h, i, 0)
    specs = [pl.BlockSpec((None, None, bq, d), qi), pl.BlockSpec((None, None, bq, 1), qi)]
    scratch = [pltpu.VMEM((bq, 1), F32), pltpu.VMEM((bq, 1), F32), pltpu.VMEM((bq, d), F32)]
    grid = (b, h, lq // bq, x["k"].shape[2] // bk)
    return tuple(_call(_fwd_kernel, st, x, out, specs, grid, scratch, bq, bk, "q", interpret))


def backward(st, x, vis, *, bq, bk, interpret):
    """As `gpu.backward`."""
    b, h, lq, d = x["q"].shape
    kh, lk = x["k"].shape[1], x["k"].shape[2]
    nq, nk = lq // bq, lk // bk
    x = dict(x, vis=_rows(vis))
    qi = lambda b, h, i, j: (b, h, i, 0)
    out = {"dq": jax.ShapeDtypeStruct(x["q"].shape, x["q"].dtype)}
    specs = [pl.BlockSpec((None, None, bq, d), qi)]
    for n in [n for n in x if n.startswith("p")]:
        shape = x[n].shape
        out["d" + n] = jax.ShapeDtypeStruct((b, h, nq) + shape, F32)
        specs.append(pl.BlockSpec((None, None, None) + shape,
                                  _leaf_map(len(shape), 3)))
    scratch = [pltpu.VMEM((bq, n), F32) for _, n in st.pieces]
    dq, *dps = _call(_dq_kernel, st, x, out, specs, (b, h, nq, nk), scratch, bq, bk, "q",
                     interpret)
    x["vis"] = _rows(jnp.swapaxes(vis, 1, 2))                              # [B*nk, 1, nq]
    out = {"dk": jax.ShapeDtypeStruct(x["k"].shape, x["k"].dtype),
           "dv": jax.ShapeDtypeStruct(x["v"].shape, x["v"].dtype)}
    ki = lambda b, k, j, t: (b, k, j, 0)
    specs = [pl.BlockSpec((None, None, bk, d), ki)] * 2
    scratch = [pltpu.VMEM((bk, n), F32) for _, n in st.pieces] + [pltpu.VMEM((bk, d), F32)]
    dk, dv = _call(_dkv_kernel, st, x, out, specs, (b, kh, nk, st.groups * nq), scratch, bq,
                   bk, "k", interpret, nq=nq)
    return dq, dk, dv, [jnp.sum(g, axis=(0, 1, 2)) for g in dps]
