"""`core_lse`: the kernel's (out, lse) as a differentiable pair, for merging partial results.

`vjp.core` returns only the output; a caller that merges partial attention results over
disjoint key sets (context parallelism's ring: lse = logaddexp(lse1, lse2), out = e^(lse1 -
lse) out1 + e^(lse2 - lse) out2) also differentiates the row log-sum-exp. Its cotangent
enters the same backward kernels exactly, through delta: with p = softmax(s) over the row's
visible keys, d lse / d s = p, so

    ds = p (dp - delta) + dlse p = p (dp - (delta - dlse)),    delta = rowsum(dO * O),

i.e. the dq and dk/dv kernels run unchanged with delta' = rowsum(dO * O) - dlse. A row that
sees no key has lse = NEG (`block_math.fwd_finish`) and p = 0, so its dlse adds nothing.
`flash.flash_attention(..., return_lse=True)` is the public entry point.

Shapes (the kernels' layout): q [B, H, Lq, D], k, v [B, K, Lk, D], lse [B, H, Lq, 1] float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from posenc_jax.model.kernels.vjp import _inputs, _run, backward

__all__ = ["core_lse"]

F32 = jnp.float32


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def core_lse(st, q, k, v, aux, leaves):
    """(o [B, H, Lq, D] in q.dtype, lse [B, H, Lq, 1] float32) of the forward kernel."""
    o, lse = _run(st, _inputs(q, k, v, aux), list(leaves), False)
    return o, lse


def _fwd(st, q, k, v, aux, leaves):
    o, lse = _run(st, _inputs(q, k, v, aux), list(leaves), False)
    return (o, lse), (q, k, v, aux, leaves, o, lse)


def _bwd(st, res, cotangents):
    q, k, v, aux, leaves, o, lse = res
    do, dlse = cotangents
    delta = (jnp.sum(do.astype(F32) * o.astype(F32), axis=-1, keepdims=True)
             - dlse.astype(F32))                                             # [B, H, Lq, 1]
    return backward(st, q, k, v, aux, leaves, lse, delta, do.astype(o.dtype))


core_lse.defvjp(_fwd, _bwd)
