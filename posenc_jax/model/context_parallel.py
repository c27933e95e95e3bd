"""Context parallelism: one sequence split across the devices of a mesh axis ("context").

Each of the N devices of the axis holds L / N tokens of every sequence (in the zig-zag order
of `posenc_jax.model.load_balance` for causal work balance; any order works, because every
mask and every bias is computed from the GLOBAL positions each token carries, never from
indices). Queries stay where they are; keys and values come to them in one of two ways:

* "ring": K, V and their positions, segment ids and key mask travel round the axis by
  `jax.lax.ppermute`, one neighbour hop per step; at step s device i scores its queries
  against the chunk of device (i - s) mod N and merges the partial results by the
  online-softmax rule: lse = logaddexp(lse, lse_s), out = e^(lse_old - lse) out +
  e^(lse_s - lse) out_s. No device ever holds more than two K/V chunks (the one it scores,
  the one arriving). Backward: a `jax.custom_vjp` ring. Autodiff through the forward loop
  would be correct but saves every visiting K/V chunk as a residual (full-length K/V per
  device, the memory the ring exists to avoid); instead the backward sends K, V and their
  gradient accumulators dK, dV round the ring again (N hops, so each dK, dV arrives home
  complete), and at each step takes the vjp of the same step with the cotangents of the
  merge: d out_s = w_s d out, d lse_s = w_s (d out . out_s - d out . out), w_s =
  e^(lse_s - lse). That vjp covers dq, dk, dv and every encoding parameter (T5's table,
  FIRE's MLP, KERPLE's), which accumulate on each device and are summed over devices by
  shard_map's transpose of the replicated params.
* "all_gather": K, V (+ positions, segment ids, key mask) are all-gathered along the axis
  and each device runs one step of its queries against the full length. Backward by
  autodiff (the transpose of all_gather is a reduce-scatter of dK, dV).

What a step runs (`step=`, both modes; "auto" by default) is the attention registry's choice
(`backends.run(..., lse=True)`: among the records with a `call_lse`, by the platform lowered
for, one `jax.lax.platform_dependent`, as `attend` chooses): on cuda and tpu the Pallas
kernel (`kernels.flash_attention(..., return_lse=True)`; its custom_vjp takes the d lse_s
above exactly, through delta' = rowsum(dO O) - d lse, `kernels/lse.py`) where its record
supports the encoding at these shapes, blockwise elsewhere (`blockwise.attend_blockwise_lse`).
step="kernel" names the "pallas" record everywhere (interpret mode on CPU: the tests),
"blockwise" the blockwise one. One rotation rule for every step: q and k arrive ROTATED at
their global positions (the caller's rotate hook, once per token), and the kernel runs
without in-kernel rotation: rotating k in-kernel would redo it at every one of the N steps.
The backward's vjp of a step recomputes that step's forward (out_s, lse_s).

Masks: the window, chunks and sink tokens are rules of global positions, so every step
applies them to its own keys (and skips the blocks they hide). Learned sinks (gpt-oss) enter
ONCE, after the merge, never per step: with lse the merged log-sum-exp over every key,
out = e^(lse - lse') out and lse' = logaddexp(lse, sink) (`_add_sinks`, by autodiff, which
is why the ring also returns a differentiable lse: its cotangent enters each step's d lse_s
as w_s d lse).

Bytes moved (per device, one attention layer, forward; b = bytes per element, B the local
batch rows, K kv heads, D head dim, C = L / N the local length):
  ring:        N - 1 steps of 2 B C K D b (K and V) + the chunk's int32 positions/ids
  all_gather:  one collective receiving (N - 1) 2 B C K D b
The totals are equal, (N - 1) / N * 2 B L K D b; the ring hides each hop behind a step of
compute (needs a step's FLOPs, 4 B C^2 H D, to outlast a hop) and holds 2 chunks, the
all-gather holds 2 B L K D b of K/V per device and pays one latency. The ring's backward
moves N hops of 2 B C K D (b + 4) (K, V and the float32 dK, dV). Whichever step runs (kernel
or blockwise), the bytes are the same. So: all-gather wins with few KV heads (GQA / MQA:
full-length K/V is small next to the activations) and short chunks (latency-bound hops);
the ring wins when full-length K/V does not fit, i.e. at long L with
many KV heads. docs/context_parallel.md has the memory per device.

Shapes (global; inside shard_map each is the device's slice): B batch, L length, H query
heads, K kv heads (K | H, query head h reads kv head h // (H // K)), D head dim.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.core import spmd as flax_spmd
from jax.sharding import PartitionSpec as P

from posenc_jax.checks import one_of, positive_int
from posenc_jax.encodings.base import Encoding
from posenc_jax.model import backends
from posenc_jax.model.scores import check_local, check_sinks

__all__ = ["MODES", "STEPS", "ContextAxis", "all_gather_attention", "check_mode",
           "context_attention", "current_context_axis", "ring_attention"]

MODES = ("ring", "all_gather")
STEPS = ("auto", "kernel", "blockwise")
Array = jax.Array


class ContextAxis(NamedTuple):
    """Where the sequence is split: the mesh, its context axis, the axes B is split over."""

    mesh: Any
    axis: str
    batch_axes: tuple[str, ...]


def check_mode(mode: str) -> str:
    """ValueError unless `mode` is one of MODES."""
    return one_of("context_mode", mode, MODES)


def current_context_axis() -> ContextAxis | None:
    """The context axis of the current mesh (`jax.set_mesh`) and logical axis rules
    (`nnx.logical_axis_rules`): the mesh axis that the logical axis "length" maps to, when
    its size is > 1; None otherwise (no mesh, no rules, "length" unmapped or of size 1).
    Read at trace time by the model's attention layer."""
    mesh = jax.sharding.get_abstract_mesh()
    rules = flax_spmd.get_logical_axis_rules()
    if mesh.empty or not rules:
        return None
    batch, length = nn.logical_to_mesh_axes(("batch", "length"), rules)
    if length is None:
        return None
    axes = (length,) if isinstance(length, str) else tuple(length)
    if len(axes) != 1:
        raise ValueError(f"the logical axis 'length' maps to mesh axes {axes}; context "
                         "parallelism splits it over one mesh axis")
    length = axes[0]
    if int(mesh.shape[length]) == 1:
        return None
    batch = () if batch is None else (batch,) if isinstance(batch, str) else tuple(batch)
    return ContextAxis(mesh, length, batch)


def _merge(out, lse, out_s, lse_s):
    """Online-softmax merge of two partial results over disjoint key sets (float32)."""
    new = jnp.logaddexp(lse, lse_s)
    return (out * jnp.exp(lse - new)[..., None] + out_s * jnp.exp(lse_s - new)[..., None], new)


def _shift(tree, axis_name: str, size: int):
    """Every array of `tree` to the next device along the axis (i -> i + 1 mod N)."""
    perm = [(i, (i + 1) % size) for i in range(size)]
    return jax.tree.map(lambda x: jax.lax.ppermute(x, axis_name, perm), tree)


def _make_ring(step, axis_name: str, size: int):
    """The custom_vjp ring over `step(q, k, v, params, q_meta, kv_meta) -> (out, lse)`:
    `ring(...) -> (out float32, lse)`, both differentiable."""

    def forward(q, kv, params, q_meta, kv_meta):
        b, lq, h, d = q.shape
        init = (jnp.zeros((b, lq, h, d), jnp.float32), jnp.full((b, lq, h), -1e30, jnp.float32))

        def body(carry, _):
            (out, lse), kv, kv_meta = carry
            out_s, lse_s = step(q, *kv, params, q_meta, kv_meta)
            kv, kv_meta = _shift((kv, kv_meta), axis_name, size)
            return (_merge(out, lse, out_s, lse_s), kv, kv_meta), None

        (acc, kv, kv_meta), _ = jax.lax.scan(body, (init, kv, kv_meta), None, length=size - 1)
        return _merge(*acc, *step(q, *kv, params, q_meta, kv_meta))

    @jax.custom_vjp
    def ring(q, kv, params, q_meta, kv_meta):
        return forward(q, kv, params, q_meta, kv_meta)

    def ring_fwd(q, kv, params, q_meta, kv_meta):
        out, lse = forward(q, kv, params, q_meta, kv_meta)
        return (out, lse), (q, kv, params, q_meta, kv_meta, out, lse)

    def ring_bwd(res, cotangents):
        q, kv, params, q_meta, kv_meta, out, lse = res
        d_out, d_lse = cotangents
        d_out = d_out.astype(jnp.float32)
        delta = jnp.sum(d_out * out, axis=-1) - d_lse.astype(jnp.float32)  # [B, Lq, H]
        f32 = functools.partial(jax.tree.map, lambda x: jnp.zeros(x.shape, jnp.float32))

        def body(carry, _):
            dq, d_params, kv, d_kv, kv_meta = carry
            (out_s, lse_s), vjp = jax.vjp(
                lambda q_, k_, v_, p_: step(q_, k_, v_, p_, q_meta, kv_meta), q, *kv, params)
            w = jnp.exp(lse_s - lse)
            g_lse = w * (jnp.sum(d_out * out_s, axis=-1) - delta)
            dq_s, dk_s, dv_s, dp_s = vjp((w[..., None] * d_out, g_lse))
            dq = dq + dq_s.astype(jnp.float32)
            d_params = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), d_params, dp_s)
            d_kv = (d_kv[0] + dk_s.astype(jnp.float32), d_kv[1] + dv_s.astype(jnp.float32))
            kv, d_kv, kv_meta = _shift((kv, d_kv, kv_meta), axis_name, size)
            return (dq, d_params, kv, d_kv, kv_meta), None

        init = (jnp.zeros(q.shape, jnp.float32), f32(params), kv, f32(kv), kv_meta)
        (dq, d_params, _, d_kv, _), _ = jax.lax.scan(body, init, None, length=size)
        cast = lambda g, x: g.astype(x.dtype)
        return (cast(dq, q), jax.tree.map(cast, d_kv, kv), jax.tree.map(cast, d_params, params),
                None, None)

    ring.defvjp(ring_fwd, ring_bwd)
    return ring


def _step_fn(encoding, causal, window, block_q, block_k, *, step="auto", kernel_blocks=None,
             chunk_size=None, sink_tokens=0, shapes: backends.Shapes):
    """`step(q, k, v, params, q_meta, kv_meta) -> (out f32, lse f32)`: the `call_lse` of the
    record the attention registry runs for `step` ("blockwise", "kernel" = "pallas", or
    "auto": its choice per platform lowered for), without sinks (they enter after the merge)."""
    name = {"auto": backends.AUTO, "kernel": backends.PALLAS,
            "blockwise": backends.BLOCKWISE}[one_of("context_step", step, STEPS)]

    def fn(q, k, v, params, q_meta, kv_meta):
        def body(backend, operands):
            q, k, v, params, ((qp, qs), (kp, ks, km)) = operands
            return backend.call_lse(backends.Inputs(
                q=q, k=k, v=v, encoding=encoding, params=params, q_positions=qp,
                k_positions=kp, q_segment_ids=qs, k_segment_ids=ks, k_mask=km, causal=causal,
                block_q=block_q, block_k=block_k, rotation=None, same_positions=False,
                kernel_blocks=kernel_blocks, window=window, chunk_size=chunk_size,
                sink_tokens=sink_tokens, sinks=None))

        return backends.run(name, encoding, (q, k, v, params, (q_meta, kv_meta)), body,
                            causal=causal, shapes=shapes, lse=True)
    return fn


def _shapes(q, k, window, chunk_size, sink_tokens) -> backends.Shapes:
    """The sizes the registry's support checks read (one step's q against k)."""
    b, lq, h, d = q.shape
    return backends.Shapes(b, lq, k.shape[1], h, k.shape[2], d, window, chunk_size, False,
                           sink_tokens)


def _add_sinks(out, lse, sinks):
    """(out, lse) over every key -> out with the sink logits [H] in the denominator, once:
    out e^(lse - logaddexp(lse, sink)) (a row that saw no key stays 0). float32."""
    if sinks is None:
        return out
    total = jnp.logaddexp(lse, jnp.asarray(sinks, jnp.float32)[None, None, :])  # [B, Lq, H]
    return out * jnp.exp(lse - total)[..., None]


def ring_attention(q: Array, k: Array, v: Array, *, encoding: Encoding, params: Any,
                   q_positions: Array, k_positions: Array, causal: bool = True,
                   q_segment_ids: Array | None = None, k_segment_ids: Array | None = None,
                   k_mask: Array | None = None, window: int | None = None, axis_name: str,
                   axis_size: int, block_q: int = 256, block_k: int = 256,
                   step: str = "auto", kernel_blocks: Any = None,
                   chunk_size: int | None = None, sinks: Array | None = None,
                   sink_tokens: int = 0) -> Array:
    """Ring attention of this device's queries against every device's keys (call it inside
    `shard_map` over `axis_name`, of `axis_size` devices; see the module docstring).

    Args (the device's slices; q, k already rotated at their global positions):
      q: [B, C, H, D]; k, v: [B, C, K, D]; q_positions, q_segment_ids: [B|1, C];
      k_positions, k_segment_ids, k_mask: [B|1, C] (segment ids and k_mask may be None).
      window, chunk_size, sink_tokens: the local rules of `scores.build_mask` (global
        positions); sinks: float [H] learned sink logits (added once, after the merge).
      step: what each step runs (`STEPS`): "auto" (the registry's choice: the Pallas kernel
        on cuda / tpu where it supports the encoding, blockwise elsewhere), "kernel" (also on
        CPU, interpret mode: for tests) or "blockwise". block_q, block_k: blockwise's (and
        interpret mode's) blocks; kernel_blocks: the kernel's GPU / TPU blocks.

    Returns:
      [B, C, H, D] in q.dtype, equal to attention of q against all N * C keys.
    """
    fn = _step_fn(encoding, causal, window, block_q, block_k, step=step,
                  kernel_blocks=kernel_blocks, chunk_size=chunk_size, sink_tokens=sink_tokens,
                  shapes=_shapes(q, k, window, chunk_size, sink_tokens))
    ring = _make_ring(fn, axis_name, positive_int("axis_size", axis_size))
    out, lse = ring(q, (k, v), params, (q_positions, q_segment_ids),
                    (k_positions, k_segment_ids, k_mask))
    return _add_sinks(out, lse, sinks).astype(q.dtype)


def all_gather_attention(q: Array, k: Array, v: Array, *, encoding: Encoding, params: Any,
                         q_positions: Array, k_positions: Array, causal: bool = True,
                         q_segment_ids: Array | None = None, k_segment_ids: Array | None = None,
                         k_mask: Array | None = None, window: int | None = None,
                         axis_name: str, axis_size: int = 0, block_q: int = 256,
                         block_k: int = 256, step: str = "auto",
                         kernel_blocks: Any = None, chunk_size: int | None = None,
                         sinks: Array | None = None, sink_tokens: int = 0) -> Array:
    """As `ring_attention`, but K, V and their positions / ids / mask are all-gathered along
    `axis_name` first (each device then holds full-length K/V). `axis_size` is unused."""
    del axis_size
    gather = functools.partial(jax.lax.all_gather, axis_name=axis_name, axis=1, tiled=True)
    k, v, kp, ks, km = jax.tree.map(gather, (k, v, k_positions, k_segment_ids, k_mask))
    fn = _step_fn(encoding, causal, window, block_q, block_k, step=step,
                  kernel_blocks=kernel_blocks, chunk_size=chunk_size, sink_tokens=sink_tokens,
                  shapes=_shapes(q, k, window, chunk_size, sink_tokens))
    out, lse = fn(q, k, v, params, (q_positions, q_segment_ids), (kp, ks, km))
    return _add_sinks(out, lse, sinks).astype(q.dtype)


def context_attention(q: Array, k: Array, v: Array, *, encoding: Encoding, params: Any,
                      q_positions: Array, k_positions: Array, causal: bool = True,
                      q_segment_ids: Array | None = None, k_segment_ids: Array | None = None,
                      k_mask: Array | None = None, window: int | None = None, mesh,
                      context_axis: str = "context", batch_axes: tuple[str, ...] = (),
                      mode: str = "ring", block_q: int = 256, block_k: int = 256,
                      step: str = "auto", kernel_blocks: Any = None,
                      chunk_size: int | None = None, sinks: Array | None = None,
                      sink_tokens: int = 0) -> Array:
    """Attention of global arrays whose length axis is split over `context_axis` of `mesh`
    (a Mesh or AbstractMesh; inside `jax.jit` the one of `jax.set_mesh`).

    q [B, L, H, D], k, v [B, L, K, D] (already rotated at their positions), positions /
    segment ids / k_mask [B|1, L], window / chunk_size / sinks / sink_tokens as
    `posenc_jax.model.attention.attend` (sinks float [H], entering once); `step` and
    `kernel_blocks` as `ring_attention` (the same in both modes). The batch axis is
    split over `batch_axes`, the length over `context_axis`; heads are not split here (a
    tensor-sharded head axis is gathered for the call). Returns [B, L, H, D] in q.dtype.
    Raises ValueError for an unknown mode or step, an encoding or mask the step's backend
    cannot serve (the registry's reason; "auto" as on a CPU host), bad window / chunk_size /
    sink_tokens / sinks (as `attend`), or a length / batch not divisible by its axes.
    """
    check_mode(mode)
    window, chunk_size, sink_tokens = check_local(window=window, chunk_size=chunk_size,
                                                  sink_tokens=sink_tokens)
    sinks = check_sinks(sinks, q.shape[2])
    name = {"auto": backends.AUTO, "kernel": backends.PALLAS,
            "blockwise": backends.BLOCKWISE}[one_of("context_step", step, STEPS)]
    backends.check(name, encoding, causal=causal, lse=True,
                   shapes=_shapes(q, k, window, chunk_size, sink_tokens))
    size = int(mesh.shape[context_axis])
    batch_axes = tuple(batch_axes)
    rows = 1
    for a in batch_axes:
        rows *= int(mesh.shape[a])
    b, length = q.shape[0], q.shape[1]
    if length % size:
        raise ValueError(f"context parallelism over {context_axis!r} of size {size} needs the "
                         f"length divisible by it, got length={length}")
    if b % rows:
        raise ValueError(f"batch={b} is not divisible by the batch axes {batch_axes} "
                         f"(size {rows})")
    bspec = batch_axes or None
    heads = P(bspec, context_axis, None, None)

    def row_spec(x):
        return None if x is None else P(bspec if x.shape[0] == b else None, context_axis)

    metas = (q_positions, k_positions, q_segment_ids, k_segment_ids, k_mask)
    fn = ring_attention if mode == "ring" else all_gather_attention

    def body(q, k, v, params, metas, sinks):
        qp, kp, qs, ks, km = metas
        return fn(q, k, v, encoding=encoding, params=params, q_positions=qp, k_positions=kp,
                  causal=causal, q_segment_ids=qs, k_segment_ids=ks, k_mask=km, window=window,
                  axis_name=context_axis, axis_size=size, block_q=block_q, block_k=block_k,
                  step=step, kernel_blocks=kernel_blocks, chunk_size=chunk_size, sinks=sinks,
                  sink_tokens=sink_tokens)

    mapped = jax.shard_map(
        body, mesh=mesh, out_specs=heads, check_vma=False,
        in_specs=(heads, heads, heads, jax.tree.map(lambda _: P(), params),
                  tuple(row_spec(x) for x in metas), None if sinks is None else P()))
    return mapped(q, k, v, params, metas, sinks)
