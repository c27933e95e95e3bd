"""How the blocks run: a Python loop, or `jax.lax.scan` over repeating groups of layers.

A Python loop over L blocks traces and compiles L copies of the block, so compile time grows
with depth. With `scan_layers=True` the model keeps its blocks as they are (the same
parameters, names, logical axes and checkpoints as the loop), and at call time stacks each
parameter over the repeats of a group and runs ONE traced group under `jax.lax.scan`,
carrying the residual stream. The stacking is a copy of the block parameters inside the
jitted step (and an unstack of their gradients): cheap beside the matmuls, and the price of
keeping one parameter layout for both paths.

The group is the smallest repeating run of per-layer settings (`layer_pattern.group_size`
over `TransformerConfig.layer_specs`): one layer when every layer is alike; Gemma 3's five
sliding layers and one global layer; Llama 4's three chunked RoPE layers and one NoPE layer.
The group's layers are traced one after another inside the scan body (each with its own
settings and parameter structure); a last partial group (26 Gemma 3 layers = 4 x 6 + 2) runs
unrolled after the scan. A pattern that never repeats runs as the loop.

Measured on XLA:CPU (docs/performance.md, benchmarks/scan_compile.py): tracing is ~10x
faster and the program ~4x smaller, but XLA:CPU compiles the while loop more slowly than the
unrolled blocks, so the compile time of a whole train step does not drop on CPU.

A KV cache works as with the loop: the per-layer key/value buffers are stacked like the
parameters, scanned alongside them, and returned per layer. Rematerialisation
(`posenc_jax.model.remat`) wraps each block's pure call, in the loop and in the scan alike.

Shapes: B batch, T new tokens, E embed dim; S cache slots, K kv heads, D head dim.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from posenc_jax.model import remat as remat_
from posenc_jax.model.layer_pattern import group_size

__all__ = ["run_blocks", "scan_plan"]

Array = jax.Array


def _stack(trees: list) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def scan_plan(specs: tuple) -> tuple[int, int]:
    """(group size g, repeats r) of the scan over layers with settings `specs`: layers
    [0, g r) are scanned, the rest run unrolled. r < 2 means no scan (the loop)."""
    g = group_size(specs)
    return g, len(specs) // g


def _call(block, remat: str, *, in_scan: bool, layer: int):
    """block(x, positions, segment_ids, memory, layer, rotary) as a function of
    (state, x, positions, segment_ids, memory, rotary), under the remat policy."""
    if remat == "none" and not in_scan:
        return lambda _state, *args: block(*args[:4], layer, args[4])
    graphdef = nnx.graphdef(block)

    def pure(state, x, positions, segment_ids, memory, rotary):
        return nnx.merge(graphdef, state)(x, positions, segment_ids, memory, layer, rotary)

    return remat_.wrap(pure, remat, in_scan=in_scan)


def run_blocks(layers, specs: tuple, x: Array, positions: Array, segment_ids: Array | None,
               memory: Any, rotary: Array | None = None, *, scan: bool = False,
               remat: str = "none") -> tuple[Array, list]:
    """Runs the blocks `layers` (block i with settings specs[i]), looped or scanned in groups.

    Args:
      layers: the model's blocks; block i is called as `block(x, positions, segment_ids,
        memory, i, rotary)` (in the scan: with a memory holding only its own buffers, 0).
      specs: one `LayerSpec` per layer (equal specs: blocks of one structure).
      x: [B, T, E] residual stream; positions, segment_ids, rotary: as the blocks take them.
      memory: None, or a `kv_cache.Memory` whose `k`, `v` are per-layer [B, S, K, D] tuples.
      scan: scan over the repeating groups (else the Python loop). remat: a policy name.

    Returns:
      (x [B, T, E], per-layer list of (k, v) buffers, or of Nones without memory, the sum of
      the blocks' load-balancing losses: float32 scalar).
    """
    n = len(layers)
    g, reps = scan_plan(specs) if scan else (n, 1)
    new: list = [None] * n
    start = 0
    aux = jnp.zeros((), jnp.float32)
    if reps >= 2:
        x, scanned, aux = _scan_groups(layers, g, reps, x, positions, segment_ids, memory,
                                       rotary, remat)
        new[:g * reps] = scanned
        start = g * reps
    for i in range(start, n):
        block = layers[i]
        state = None if remat == "none" else nnx.state(block)
        x, new[i], layer_aux = _call(block, remat, in_scan=False, layer=i)(
            state, x, positions, segment_ids, memory, rotary)
        aux = aux + layer_aux
    return x, new, aux


def _scan_groups(layers, g: int, reps: int, x: Array, positions, segment_ids, memory,
                 rotary, remat: str) -> tuple[Array, list, Array]:
    """The scan over `reps` repeats of the first g layers' group: (x, per-layer (k, v) or
    Nones, the summed load-balancing losses)."""
    members = [[layers[r * g + j] for r in range(reps)] for j in range(g)]
    states = tuple(_stack([nnx.state(b) for b in blocks]) for blocks in members)
    calls = [_call(blocks[0], remat, in_scan=True, layer=0) for blocks in members]
    kv = None
    if memory is not None:
        kv = tuple((jnp.stack([memory.k[r * g + j] for r in range(reps)]),
                    jnp.stack([memory.v[r * g + j] for r in range(reps)])) for j in range(g))

    def body(carry, xs):
        h, aux = carry
        group_states, buffers = xs
        out = []
        for j in range(g):
            mem = None if buffers is None else dataclasses.replace(
                memory, k=(buffers[j][0],), v=(buffers[j][1],))
            h, new, layer_aux = calls[j](group_states[j], h, positions, segment_ids, mem,
                                         rotary)
            aux = aux + layer_aux
            out.append(new)
        return (h, aux), tuple(out)

    (x, aux), new = jax.lax.scan(body, (x, jnp.zeros((), jnp.float32)), (states, kv),
                                 length=reps)
    per_layer: list = [None] * (g * reps)
    if memory is not None:
        for j in range(g):
            for r in range(reps):
                per_layer[r * g + j] = (new[j][0][r], new[j][1][r])
    return x, per_layer, aux
