"""Flash attention kernels in the GPU structure: one program per (batch, head, block), the
loop over the other sequence inside the kernel. Lowered with Triton on GPUs; also what CPU
interpret mode runs by default. The block math is `block_math.py` (shared with `tpu.py`);
this file holds what is the GPU's own: the grids, the block specs and Triton's parameters.

Why Triton and not Mosaic GPU on sm_90: the kernels are written against the portable Pallas
surface (BlockSpec, `pl.ds` ref slices, `lax.fori_loop`, `lax.cond`, `dot_general`), which
the Triton lowering compiles for any NVIDIA GPU, including H100/H200, with Triton choosing
the wgmma/TMA instructions itself. Mosaic GPU reaches sm_90's peak only with explicit
warpgroup programming (its own refs, barriers and TMA pipelines), an API that still changes
between jax releases; jax's own `pallas/ops/gpu/attention.py` makes the same choice.

Three kernels (Dao 2023, FlashAttention-2):
  fwd  grid (B, H, nq): online softmax over key blocks -> out, lse = m + log l.
  dq   grid (B, H, nq): dS = P * (dO V^T - delta) over key blocks -> dq (rotated back) and
       the bias params' gradient per (b, h, query block), summed outside.
  dkv  grid (B, K, nk): over the G heads of the group and all query blocks -> dk, dv.
A key block the mask hides entirely (block visibility `vis` [B, nq, nk], from positions) is
skipped with `lax.cond`.

Every head dim and rotary split: q/k/v are loaded as power-of-two feature chunks, padded
with zero lanes in memory only where a piece is not a multiple of 16 wide (`static.py`
says how and what it costs); `_to_kernel` / `_from_kernel` change the layout.

Layout: q [B, H, Lq, D], k/v [B, K, Lk, D], lse/delta [B, H, Lq, 1] float32, q positions and
segment ids [B, Lq, 1], key positions/validity/segments [B, 1, Lk] int32 (L padded).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from posenc_jax.model.kernels import block_math as bm
from posenc_jax.model.kernels.refs import Refs, call, param_grad_outputs

__all__ = ["backward", "forward"]

F32 = jnp.float32
_ALL = slice(None)


def _rows(i, n):
    return pl.ds(pl.multiple_of(i * n, n), n)


def _fwd_kernel(*refs, layout, st, bq, bk):
    r = Refs(layout, refs)
    b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    params = r.load_params(st.param_tree)
    q = bm.load_queries(r, st, (_ALL,), _ALL)

    def body(j, carry):
        def update(carry):
            rows = _rows(j, bk)
            k = bm.load_keys(r, st, (rows,), rows)
            vs = bm.load_chunks(r["v"], (rows,), st.v_pieces)
            return bm.fwd_step(st, params, h, q, k, vs, carry)
        return lax.cond(r["vis"][b, i, j] != 0, update, lambda x: x, carry)

    init = bm.fwd_init(st, bq, r["sink"][...] if st.sinks else None)
    carry = lax.fori_loop(0, r["k"].shape[0] // bk, body, init)
    o, lse = bm.fwd_finish(carry, r.out["o"].dtype)
    bm.store_chunks(r.out["o"], (_ALL,), st.v_pieces, o)
    r.out["lse"][...] = lse


def _dq_kernel(*refs, layout, st, bq, bk):
    r = Refs(layout, refs)
    b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    params = r.load_params(st.param_tree)
    q = bm.load_queries(r, st, (_ALL,), _ALL)
    dos = bm.load_chunks(r["do"], (_ALL,), st.v_pieces)
    lse, delta = r["lse"][...], r["delta"][...]

    def body(j, carry):
        def update(carry):
            rows = _rows(j, bk)
            k = bm.load_keys(r, st, (rows,), rows)
            vs = bm.load_chunks(r["v"], (rows,), st.v_pieces)
            return bm.dq_step(st, params, h, q, k, vs, dos, lse, delta, carry)
        return lax.cond(r["vis"][b, i, j] != 0, update, lambda x: x, carry)

    init = bm.dq_init(st, bq, [p.shape for p in r.params])
    dqs, dps = bm.dq_finish(st, lax.fori_loop(0, r["k"].shape[0] // bk, body, init), q.cs)
    bm.store_pieces(r.out["dq"], (_ALL,), st, dqs)
    for ref, g in zip(r.param_grads, dps):
        ref[...] = g


def _dkv_kernel(*refs, layout, st, bq, bk):
    r = Refs(layout, refs)
    b, kh, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    params = r.load_params(st.param_tree)
    k = bm.load_keys(r, st, (_ALL,), _ALL)
    vs = bm.load_chunks(r["v"], (_ALL,), st.v_pieces)
    nq = r["q"].shape[1] // bq

    def body(t, carry):
        g, i = lax.div(t, jnp.int32(nq)), lax.rem(t, jnp.int32(nq))

        def update(carry):
            rows = _rows(i, bq)
            q = bm.load_queries(r, st, (g, rows), rows)
            dos = bm.load_chunks(r["do"], (g, rows), st.v_pieces)
            return bm.dkv_step(st, params, kh * st.groups + g, q, k, vs, dos,
                               r["lse"][g, rows, :], r["delta"][g, rows, :], carry)
        return lax.cond(r["vis"][b, i, j] != 0, update, lambda x: x, carry)

    init = bm.dkv_init(st, bk)
    dks, dvs = bm.dkv_finish(st, lax.fori_loop(0, st.groups * nq, body, init), k.cs)
    bm.store_pieces(r.out["dk"], (_ALL,), st, dks)
    bm.store_chunks(r.out["dv"], (_ALL,), st.v_pieces, dvs)


def _q_specs(st, x, bq):
    """Grid (B, H, nq): one query block; all keys of the head's kv head."""
    d, dv, lk, g = x["q"].shape[-1], x["v"].shape[-1], x["k"].shape[2], st.groups
    q_blk = pl.BlockSpec((None, None, bq, d), lambda b, h, i: (b, h, i, 0))
    o_blk = pl.BlockSpec((None, None, bq, dv), lambda b, h, i: (b, h, i, 0))
    row = pl.BlockSpec((None, None, bq, 1), lambda b, h, i: (b, h, i, 0))
    kv_head = lambda b, h, i: (b, lax.div(h, jnp.int32(g)), 0, 0)             # noqa: E731
    k_all, v_all = pl.BlockSpec((None, None, lk, d), kv_head), pl.BlockSpec((None, None, lk, dv),
                                                                           kv_head)
    qp = pl.BlockSpec((None, bq, 1), lambda b, h, i: (b, i, 0))
    kp = pl.BlockSpec((None, 1, lk), lambda b, h, i: (b, 0, 0))
    return {"q": q_blk, "do": o_blk, "k": k_all, "v": v_all, "lse": row, "delta": row,
            "sink": row, "qpos": qp, "qseg": qp, "qchunk": qp, "kpos": kp, "kvalid": kp,
            "kseg": kp, "kchunk": kp}, q_blk, o_blk, row


def _k_specs(st, x, bk):
    """Grid (B, K, nk): one key block; all queries of the group's G heads."""
    d, dv, lq, g = x["q"].shape[-1], x["v"].shape[-1], x["q"].shape[2], st.groups
    q_all = pl.BlockSpec((None, g, lq, d), lambda b, k, j: (b, k, 0, 0))
    do_all = pl.BlockSpec((None, g, lq, dv), lambda b, k, j: (b, k, 0, 0))
    row = pl.BlockSpec((None, g, lq, 1), lambda b, k, j: (b, k, 0, 0))
    k_blk = pl.BlockSpec((None, None, bk, d), lambda b, k, j: (b, k, j, 0))
    v_blk = pl.BlockSpec((None, None, bk, dv), lambda b, k, j: (b, k, j, 0))
    qp = pl.BlockSpec((None, lq, 1), lambda b, k, j: (b, 0, 0))
    kp = pl.BlockSpec((None, 1, bk), lambda b, k, j: (b, 0, j))
    return {"q": q_all, "do": do_all, "k": k_blk, "v": v_blk, "lse": row, "delta": row,
            "qpos": qp, "qseg": qp, "qchunk": qp, "kpos": kp, "kvalid": kp, "kseg": kp,
            "kchunk": kp}, k_blk, v_blk


def _compiler(plan, interpret):
    return None if interpret else plt.CompilerParams(num_warps=plan.num_warps,
                                                     num_stages=plan.num_stages)


def _index(st, kind):
    idx = st.physical_index(kind)
    return None if idx is None else (idx, np.nonzero(idx >= 0)[0])


def _to_kernel(st, x):
    """The inputs in the chunked layout (`Static.physical_index`: zero lanes where a piece
    is not a multiple of 16 wide); unchanged where no padding is needed."""
    x = dict(x)
    for names, kind in ((("q", "k"), "qk"), (("v", "do"), "v"), (("rot",), "rot")):
        ix = _index(st, kind)
        for n in names:
            if ix is not None and n in x:
                x[n] = jnp.where(ix[0] >= 0, jnp.take(x[n], np.maximum(ix[0], 0), axis=-1),
                                 jnp.zeros((), x[n].dtype))
    return x


def _from_kernel(st, y, kind):
    ix = _index(st, kind)
    return y if ix is None else jnp.take(y, ix[1], axis=-1)


def forward(st, x, params, plan, *, interpret):
    """x: named kernel inputs (see module doc), params: the encoding's leaves; plan: the
    blocks and visibility per pass (`vjp.Plan`). Returns (o [B,H,Lq,D], lse [B,H,Lq,1])."""
    st = dataclasses.replace(st, chunked=True)
    x = _to_kernel(st, x)
    (bq, bk), vis = plan.fwd, plan.vis_fwd
    b, h, lq, _ = x["q"].shape
    specs, _, o_blk, row = _q_specs(st, x, bq)
    out = {"o": jax.ShapeDtypeStruct((b, h, lq, x["v"].shape[-1]), x["q"].dtype),
           "lse": jax.ShapeDtypeStruct((b, h, lq, 1), F32)}
    o, lse = call(_fwd_kernel, inputs=dict(x, vis=vis), params=params, outputs=out,
                  specs=specs, out_specs=[o_blk, row], grid=(b, h, lq // bq),
                  interpret=interpret, compiler_params=_compiler(plan, interpret), st=st,
                  bq=bq, bk=bk)
    return _from_kernel(st, o, "v"), lse


def backward(st, x, params, plan, *, interpret):
    """x also holds do, lse, delta. Returns (dq, dk, dv, [params leaves' grads, float32])."""
    st = dataclasses.replace(st, chunked=True)
    x = _to_kernel(st, x)
    b, h, lq, _ = x["q"].shape
    kh, lk = x["k"].shape[1], x["k"].shape[2]
    (bq, bk), nq = plan.dq, lq // plan.dq[0]
    specs, q_blk, _, _ = _q_specs(st, x, bq)
    grads = param_grad_outputs(params, (b, h, nq))
    dq, *dps = call(_dq_kernel, inputs=dict(x, vis=plan.vis_dq), params=params,
                    outputs={"dq": jax.ShapeDtypeStruct(x["q"].shape, x["q"].dtype)},
                    param_grads=grads, specs=specs, out_specs=[q_blk], grid=(b, h, nq),
                    interpret=interpret, compiler_params=_compiler(plan, interpret), st=st,
                    bq=bq, bk=bk)
    bq, bk = plan.dkv
    specs, k_blk, v_blk = _k_specs(st, x, bk)
    out = {"dk": jax.ShapeDtypeStruct(x["k"].shape, x["k"].dtype),
           "dv": jax.ShapeDtypeStruct(x["v"].shape, x["v"].dtype)}
    dk, dv = call(_dkv_kernel, inputs=dict(x, vis=plan.vis_dkv), params=params, outputs=out,
                  specs=specs, out_specs=[k_blk, v_blk], grid=(b, kh, lk // bk),
                  interpret=interpret, compiler_params=_compiler(plan, interpret), st=st,
                  bq=bq, bk=bk)
    return (_from_kernel(st, dq, "qk"), _from_kernel(st, dk, "qk"), _from_kernel(st, dv, "v"),
            [jnp.sum(g, axis=(0, 1, 2)) for g in dps])   # per-block -> total
