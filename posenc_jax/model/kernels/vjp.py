"""`flash_attention`: layout, padding, block visibility, the custom VJP and the platform choice.

The kernels work on [B, H, L, D] with L padded to whole blocks; this module does the layout
change, pads (padded keys are invalid, padded query rows dropped), computes which (query
block, key block) pairs are visible at all (`visibility`, [B, nq, nk] from the positions:
causal, segments, key validity -- a conservative test, so skipping never changes a result),
and wires a `jax.custom_vjp` whose forward saves only (out, lse): the backward recomputes the
scores block by block in two kernels (dq, and dk/dv), so no [L, L] tensor exists anywhere.

Block sizes per platform and pass come from `Static.blocks` (`blocks.KernelBlocks`, defaults
by head dim), cut to divide the padded lengths (`Plan`). Which kernel runs follows the platform being lowered for (`jax.lax.platform_dependent`):
cuda -> the Triton kernels of `gpu.py`; tpu -> the Mosaic kernels of `tpu.py`; anything else
(cpu) -> interpret mode of one of them (`Static.cpu_kernel`, default the GPU structure).

Shapes: B batch, Lq / Lk lengths, H query heads, K kv heads, D head dim, R frequencies.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.model.kernels import gpu, tpu
from posenc_jax.model.kernels.static import Static
from posenc_jax.model.kernels.blocks import KernelBlocks

__all__ = ["Plan", "backward", "core", "padded_length", "visibility"]

F32 = jnp.float32
_INT_MAX = np.iinfo(np.int32).max
_INT_MIN = np.iinfo(np.int32).min
_AUX = ("qpos", "kpos", "kvalid", "qseg", "kseg", "qchunk", "kchunk")


def padded_length(length: int) -> tuple[int, int]:
    """(padded length, largest block dividing it): whole 128-blocks, or one short block."""
    unit = 128 if length >= 128 else max(16, 1 << (length - 1).bit_length())
    return -(-length // unit) * unit, unit


def _block_max(x, block, fill):
    b, n = x.shape
    return jnp.max(jnp.where(x == fill, _INT_MIN, x).reshape(b, n // block, block), axis=-1)


def _block_min(x, block):
    b, n = x.shape
    return jnp.min(x.reshape(b, n // block, block), axis=-1)


def _overlap(q_ids, k_ids, valid, bq, bk):
    """bool [B, nq, nk]: the id ranges of query block i and of the valid keys of block j
    overlap (a necessary condition for some equal pair: segments, chunks)."""
    k_min = _block_min(jnp.where(valid, k_ids, _INT_MAX), bk)
    k_max = _block_max(jnp.where(valid, k_ids, _INT_MIN), bk, _INT_MIN)
    q_min, q_max = _block_min(q_ids, bq), _block_max(q_ids, bq, _INT_MIN)
    return (q_min[:, :, None] <= k_max[:, None, :]) & (k_min[:, None, :] <= q_max[:, :, None])


def visibility(st: Static, aux: dict, bq: int, bk: int):
    """int32 [B, nq, nk]: 1 where some query of block i may see some key of block j."""
    valid = aux["kvalid"][:, 0, :] != 0                                   # [B, Lk]
    any_valid = jnp.any(valid.reshape(valid.shape[0], -1, bk), axis=-1)[:, None, :]
    vis = any_valid
    kpos = aux["kpos"][:, 0, :]
    if st.causal:
        k_min = _block_min(jnp.where(valid, kpos, _INT_MAX), bk)
        q_max = _block_max(aux["qpos"][:, :, 0], bq, _INT_MIN)
        vis = vis & (k_min[:, None, :] <= q_max[:, :, None])
    if st.segments:
        vis = vis & _overlap(aux["qseg"][:, :, 0], aux["kseg"][:, 0, :], valid, bq, bk)
    local = None
    if st.window is not None:  # some q - k < window: q_min < k_max + window (saturating)
        k_max = _block_max(jnp.where(valid, kpos, _INT_MIN), bk, _INT_MIN)
        q_min = _block_min(aux["qpos"][:, :, 0], bq)
        sat = k_max > _INT_MAX - st.window                       # k_max + window overflows
        reach = jnp.where(sat, _INT_MAX, k_max + st.window)
        local = sat[:, None, :] | (q_min[:, :, None] < reach[:, None, :])
    if st.chunks:
        same = _overlap(aux["qchunk"][:, :, 0], aux["kchunk"][:, 0, :], valid, bq, bk)
        local = same if local is None else local & same
    if local is not None and st.sink_tokens:  # a block holding a sink token stays visible
        k_min = _block_min(jnp.where(valid, kpos, _INT_MAX), bk)
        local = local | (k_min < st.sink_tokens)[:, None, :]
    if local is not None:
        vis = vis & local
    b, nq, nk = valid.shape[0], aux["qpos"].shape[1] // bq, valid.shape[1] // bk
    if st.q_len:  # a query block of padding rows only: nothing to compute (its rows dropped)
        vis = vis & (jnp.arange(nq) * bq < st.q_len)[None, :, None]
    return jnp.broadcast_to(vis, (b, nq, nk)).astype(jnp.int32)   # every (i, j) is read


class Plan(NamedTuple):
    """One platform's blocks and block visibility per pass: (block_q, block_k) and int32
    [B, nq, nk] for the forward, the dq and the dk/dv kernels; Triton's warps and stages."""

    fwd: tuple[int, int]
    dq: tuple[int, int]
    dkv: tuple[int, int]
    vis_fwd: Any
    vis_dq: Any
    vis_dkv: Any
    num_warps: int = 4
    num_stages: int = 2


def _plan(st: Static, x: dict, platform: str, backward: bool) -> Plan:
    """The blocks of `st.blocks` (or the defaults) for `platform`, cut to divide the padded
    lengths; CPU interpret mode uses `st.block_q` / `st.block_k` for every pass."""
    lq, lk = x["q"].shape[2], x["k"].shape[2]
    if platform == "cpu":
        pairs = [(st.block_q, st.block_k)] * 3
        extra = {}
    else:
        blk = (st.blocks or KernelBlocks()).resolve(platform, st.head_dim)
        pairs = [(blk.block_q, blk.block_k), (blk.block_q_dq, blk.block_k_dq),
                 (blk.block_q_dkv, blk.block_k_dkv)]
        extra = ({"num_warps": blk.num_warps, "num_stages": blk.num_stages}
                 if platform == "gpu" else {})
    pairs = [(math.gcd(bq, lq), math.gcd(bk, lk)) for bq, bk in pairs]
    aux = {n: x[n] for n in _AUX if n in x}
    vis = {}
    for pair in pairs[1:] if backward else pairs[:1]:
        if pair not in vis:
            vis[pair] = visibility(st, aux, *pair)
    return Plan(*pairs, vis.get(pairs[0]), vis.get(pairs[1]), vis.get(pairs[2]), **extra)


def _run(st: Static, x: dict, params: list, backward: bool):
    """One kernel family by lowering platform (outputs of gpu/tpu .forward or .backward)."""

    def branch(module, platform, interpret):
        def run(x, params):
            fn = module.backward if backward else module.forward
            return fn(st, x, params, _plan(st, x, platform, backward), interpret=interpret)
        return run

    cpu = branch(tpu if st.cpu_kernel == "tpu" else gpu, "cpu",
                 True if st.interpret is None else st.interpret)
    return jax.lax.platform_dependent(x, params, cpu=cpu, cuda=branch(gpu, "gpu", False),
                                      tpu=branch(tpu, "tpu", False), default=cpu)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def core(st, q, k, v, aux, leaves):
    return _run(st, _inputs(q, k, v, aux), list(leaves), False)[0]


def _inputs(q, k, v, aux):
    """The named kernel inputs (the params leaves travel apart, by role)."""
    return {"q": q, "k": k, "v": v, **{n: a for n, a in aux.items() if a is not None}}


def _core_fwd(st, q, k, v, aux, leaves):
    o, lse = _run(st, _inputs(q, k, v, aux), list(leaves), False)
    return o, (q, k, v, aux, leaves, o, lse)


def backward(st, q, k, v, aux, leaves, lse, delta, do):
    """(dq, dk, dv, d aux, d leaves) given delta = rowsum(dO O) - d lse [B, H, Lq, 1]. The
    sink rows' gradient (aux "sink", float32 [B, H, Lq, 1]) is -exp(sink - lse) delta: the
    sink's probability times the row's d lse / d sink = -delta (`block_math` module doc)."""
    x = dict(_inputs(q, k, v, aux), do=do, lse=lse, delta=delta)
    sink = x.pop("sink", None)                # the backward kernels read lse, not the sink
    dq, dk, dv, dps = _run(st, x, list(leaves), True)
    dleaves = [g.astype(leaf.dtype) for g, leaf in zip(dps, leaves)]
    daux = {n: None for n in aux}
    if sink is not None:
        daux["sink"] = -jnp.exp(sink - lse) * delta
    return dq, dk, dv, daux, dleaves


def _core_bwd(st, res, do):
    q, k, v, aux, leaves, o, lse = res
    delta = jnp.sum(do.astype(F32) * o.astype(F32), axis=-1, keepdims=True)   # [B,H,Lq,1]
    return backward(st, q, k, v, aux, leaves, lse, delta, do)


core.defvjp(_core_fwd, _core_bwd)
