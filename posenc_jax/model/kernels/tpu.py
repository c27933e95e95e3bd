"""Flash attention kernels in the TPU structure (Mosaic): the loop over the other sequence is
the LAST GRID AXIS ("arbitrary"), its state in VMEM scratch, so Pallas's pipeline streams
one key (or query) block at a time through VMEM -- memory on chip is O(block), whatever L.
The block math is `block_math.py` (shared with `gpu.py`); this file holds what is the TPU's
own: the grids, block specs, memory spaces and Mosaic's parameters.

  fwd  grid (B, H, nq, nk): scratch m, l [bq, 1], acc [bq, D]; out and lse at the last j.
  dq   grid (B, H, nq, nk): scratch dq pieces; params' gradient accumulated in the output
       block (resident across j), one per (b, h, query block), summed outside.
  dkv  grid (B, K, nk, G * nq): scratch dk pieces, dv; q/do blocks of head kh * G + t // nq.
Block visibility: each program gets its row of `vis` [B, nq, nk] in SMEM (the [nk] row of
its query block; for dkv the [nq] column of its key block), so SMEM holds O(L / block)
words; an invisible block is skipped with `pl.when`.

Layout as in `gpu.py`; key blocks are lane-dense ([1, bk] positions, bk a multiple of 128
or the whole padded length).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from posenc_jax.model.kernels import block_math as bm
from posenc_jax.model.kernels.refs import Refs, call, param_grad_outputs

__all__ = ["backward", "forward"]

F32 = jnp.float32
_ALL = slice(None)
_SEMANTICS = pltpu.CompilerParams(
    dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))


def _div(a, n: int):  # lax, not //: jnp's floor division lowers via sign (needs a TPU)
    return jax.lax.div(a, jnp.int32(n))


def _rem(a, n: int):
    return jax.lax.rem(a, jnp.int32(n))


def _blocks(r, st):
    """The current (query block, key block) as loaded and rotated."""
    return (bm.load_queries(r, st, (_ALL,), _ALL), bm.load_keys(r, st, (_ALL,), _ALL))


def _read(refs):
    return tuple(a[...] for a in refs)


def _write(refs, values):
    for a, x in zip(refs, values):
        a[...] = x


def _fwd_kernel(*refs, layout, st, shapes):
    r = Refs(layout, refs)
    h, j = pl.program_id(1), pl.program_id(3)

    m_ref, l_ref, *acc_refs = r.scratch

    def read():
        return m_ref[...], l_ref[...], _read(acc_refs)

    def write(carry):
        m, l, acc = carry
        _write([m_ref, l_ref, *acc_refs], [m, l, *acc])

    @pl.when(j == 0)
    def _():
        write(bm.fwd_init(st, m_ref.shape[0], r["sink"][...] if st.sinks else None))

    @pl.when(r["vis"][0, j] != 0)
    def _():
        q, k = _blocks(r, st)
        vs = bm.load_chunks(r["v"], (_ALL,), st.v_pieces)
        write(bm.fwd_step(st, r.load_params(st.param_tree, shapes), h, q, k, vs, read()))

    @pl.when(j == pl.num_programs(3) - 1)
    def _():
        o, lse = bm.fwd_finish(read(), r.out["o"].dtype)
        bm.store_chunks(r.out["o"], (_ALL,), st.v_pieces, o)
        r.out["lse"][...] = lse


def _dq_kernel(*refs, layout, st, shapes):
    r = Refs(layout, refs)
    h, j = pl.program_id(1), pl.program_id(3)

    @pl.when(j == 0)
    def _():
        for a in r.scratch + r.param_grads:
            a[...] = jnp.zeros(a.shape, a.dtype)

    @pl.when(r["vis"][0, j] != 0)
    def _():
        q, k = _blocks(r, st)
        carry = (_read(r.scratch), tuple(a[...].reshape(s) for a, s in zip(r.param_grads,
                                                                            shapes)))
        vs = bm.load_chunks(r["v"], (_ALL,), st.v_pieces)
        dos = bm.load_chunks(r["do"], (_ALL,), st.v_pieces)
        dqs, dps = bm.dq_step(st, r.load_params(st.param_tree, shapes), h, q, k, vs, dos,
                              r["lse"][...], r["delta"][...], carry)
        _write(r.scratch, dqs)
        _write(r.param_grads, [g.reshape(a.shape) for a, g in zip(r.param_grads, dps)])

    @pl.when(j == pl.num_programs(3) - 1)
    def _():
        q = bm.load_queries(r, st, (_ALL,), _ALL)
        dqs, _ = bm.dq_finish(st, (_read(r.scratch), ()), q.cs)
        bm.store_pieces(r.out["dq"], (_ALL,), st, dqs)


def _dkv_kernel(*refs, layout, st, nq, shapes):
    r = Refs(layout, refs)
    kh, t = pl.program_id(1), pl.program_id(3)
    n = len(st.pieces)
    dk_refs, dv_refs = r.scratch[:n], r.scratch[n:]
    g, i = _div(t, nq), _rem(t, nq)

    @pl.when(t == 0)
    def _():
        for a in r.scratch:
            a[...] = jnp.zeros(a.shape, a.dtype)

    @pl.when(r["vis"][0, i] != 0)
    def _():
        q, k = _blocks(r, st)
        params = r.load_params(st.param_tree, shapes)
        vs = bm.load_chunks(r["v"], (_ALL,), st.v_pieces)
        dos = bm.load_chunks(r["do"], (_ALL,), st.v_pieces)
        dks, dvs = bm.dkv_step(st, params, kh * st.groups + g, q, k, vs, dos, r["lse"][...],
                               r["delta"][...], (_read(dk_refs), _read(dv_refs)))
        _write(dk_refs, dks)
        _write(dv_refs, dvs)

    @pl.when(t == pl.num_programs(3) - 1)
    def _():
        k = bm.load_keys(r, st, (_ALL,), _ALL)
        dks, dvs = bm.dkv_finish(st, (_read(dk_refs), _read(dv_refs)), k.cs)
        bm.store_pieces(r.out["dk"], (_ALL,), st, dks)
        bm.store_chunks(r.out["dv"], (_ALL,), st.v_pieces, dvs)


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
    return {"q": q_blk, "do": q_blk, "k": k_blk, "v": k_blk, "lse": row, "delta": row,
            "sink": row, "qpos": qp, "qseg": qp, "qchunk": qp, "kpos": kp, "kvalid": kp,
            "kseg": kp, "kchunk": kp, "vis": vis}


def _rows(vis):
    """[B, n, m] -> [B * n, 1, m]: one SMEM row per program (TPU block tiling rules)."""
    b, n, m = vis.shape
    return vis.reshape(b * n, 1, m)


def _tiles(params):
    """Mosaic blocks have rank >= 2 here: leaves of rank 0 / 1 (FIRE's scalars, KERPLE's
    [H]) travel as [1, 1] / [1, n] and are reshaped back after loading."""
    shapes = tuple(tuple(p.shape) for p in params)
    return [p.reshape((1,) * (2 - p.ndim) + p.shape) if p.ndim < 2 else p for p in params], shapes


def forward(st, x, params, plan, *, interpret):
    """As `gpu.forward`."""
    params, shapes = _tiles(params)
    (bq, bk), vis = plan.fwd, plan.vis_fwd
    b, h, lq, d = x["q"].shape
    x = dict(x, vis=_rows(vis))
    qi = lambda b, h, i, j: (b, h, i, 0)
    out = {"o": jax.ShapeDtypeStruct(x["q"].shape, x["q"].dtype),
           "lse": jax.ShapeDtypeStruct((b, h, lq, 1), F32)}
    specs = [pl.BlockSpec((None, None, bq, d), qi), pl.BlockSpec((None, None, bq, 1), qi)]
    scratch = [pltpu.VMEM((bq, 1), F32), pltpu.VMEM((bq, 1), F32)] + [
        pltpu.VMEM((bq, w), F32) for _, w in st.v_pieces]
    return tuple(call(_fwd_kernel, inputs=x, params=params, outputs=out,
                      specs=_specs(st, x, bq, bk, "q", lq // bq), out_specs=specs,
                      grid=(b, h, lq // bq, x["k"].shape[2] // bk), scratch=scratch,
                      interpret=interpret, compiler_params=_SEMANTICS, st=st, shapes=shapes))


def backward(st, x, params, plan, *, interpret):
    """As `gpu.backward`."""
    params, shapes = _tiles(params)
    b, h, lq, d = x["q"].shape
    kh, lk = x["k"].shape[1], x["k"].shape[2]
    (bq, bk) = plan.dq
    nq, nk = lq // bq, lk // bk
    qi = lambda b, h, i, j: (b, h, i, 0)
    xq = dict(x, vis=_rows(plan.vis_dq))
    dq, *dps = call(_dq_kernel, inputs=xq, params=params,
                    outputs={"dq": jax.ShapeDtypeStruct(x["q"].shape, x["q"].dtype)},
                    param_grads=param_grad_outputs(params, (b, h, nq)),
                    specs=_specs(st, xq, bq, bk, "q", nq),
                    out_specs=[pl.BlockSpec((None, None, bq, d), qi)], grid=(b, h, nq, nk),
                    scratch=[pltpu.VMEM((bq, n), F32) for _, n in st.pieces],
                    interpret=interpret, compiler_params=_SEMANTICS, st=st, shapes=shapes)
    (bq, bk) = plan.dkv
    nq, nk = lq // bq, lk // bk
    xk = dict(x, vis=_rows(jnp.swapaxes(plan.vis_dkv, 1, 2)))             # [B*nk, 1, nq]
    ki = lambda b, k, j, t: (b, k, j, 0)
    out = {"dk": jax.ShapeDtypeStruct(x["k"].shape, x["k"].dtype),
           "dv": jax.ShapeDtypeStruct(x["v"].shape, x["v"].dtype)}
    scratch = [pltpu.VMEM((bk, n), F32) for _, n in st.pieces + st.v_pieces]
    dk, dv = call(_dkv_kernel, inputs=xk, params=params, outputs=out,
                  specs=_specs(st, xk, bq, bk, "k", nq),
                  out_specs=[pl.BlockSpec((None, None, bk, d), ki)] * 2,
                  grid=(b, kh, nk, st.groups * nq), scratch=scratch, interpret=interpret,
                  compiler_params=_SEMANTICS, st=st, nq=nq, shapes=shapes)
    return dq, dk, dv, [jnp.sum(g, axis=(0, 1, 2)).reshape(s) for g, s in zip(dps, shapes)]
