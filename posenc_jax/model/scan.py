"""Scan over layers: trace one block, run it `num_layers` times (`TransformerConfig.scan_layers`).

A Python loop over L blocks traces and compiles L copies of the block, so compile time grows
with depth. With `scan_layers=True` the model keeps its blocks as they are (the same
parameters, names, logical axes and checkpoints as the loop), and at call time stacks each
parameter over the layers (a leading axis of size L) and runs ONE traced block under
`jax.lax.scan`, carrying the residual stream. The stacking is a copy of the block
parameters inside the jitted step (and an unstack of their gradients): cheap beside the
matmuls, and the price of keeping one parameter layout for both paths.

Measured on XLA:CPU (docs/performance.md): tracing is ~10x faster and the program ~4x
smaller, but XLA:CPU compiles the while loop more slowly than the unrolled blocks, so the
compile time of a whole train step does not drop on CPU; the per-layer stacking and the
optimizer's per-layer leaves still grow with depth.

Requires every layer to have the same encoding (a scan runs one program): `check_scannable`
raises ValueError naming the layers that differ. A KV cache works as with the loop: the
per-layer key/value buffers are stacked, scanned alongside the parameters, and returned
per layer.

Shapes: B batch, T new tokens, E embed dim; S cache slots, K kv heads, D head dim.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["check_scannable", "run_layers"]

Array = jax.Array


def check_scannable(layer_encodings: tuple | None) -> None:
    """ValueError unless every layer has the same encoding (None: one encoding for all)."""
    if layer_encodings is None or len(set(layer_encodings)) <= 1:
        return
    first = layer_encodings[0]
    i = next(i for i, e in enumerate(layer_encodings) if e != first)
    raise ValueError(
        f"scan_layers=True needs the same encoding in every layer (a scan runs one traced "
        f"block), but layer_encodings[0]={_show(first)} differs from "
        f"layer_encodings[{i}]={_show(layer_encodings[i])}; set scan_layers=False for "
        "per-layer encodings")


def _show(entry: tuple) -> str:
    name, kwargs = entry
    return repr(name) if not kwargs else f"({name!r}, {dict(kwargs)!r})"


def _stack(trees: list) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def run_layers(layers, x: Array, positions: Array, segment_ids: Array | None,
               memory: Any, rotary: Array | None = None) -> tuple[Array, list]:
    """Runs the blocks `layers` (an nnx.List of identical-structure Blocks) as one scan.

    Args:
      layers: the model's blocks; block i is called as `block(x, positions, segment_ids,
        memory_i, 0, rotary)` where memory_i holds only layer i's buffers.
      x: [B, T, E] residual stream; positions, segment_ids, rotary: as the blocks take them.
      memory: None, or a `kv_cache.Memory` whose `k`, `v` are per-layer [B, S, K, D] tuples.

    Returns:
      (x [B, T, E], per-layer list of (k, v) buffers, or of Nones without memory).
    """
    graphdef = nnx.graphdef(layers[0])
    stacked = _stack([nnx.state(block) for block in layers])
    n = len(layers)
    kv = None if memory is None else (jnp.stack(memory.k), jnp.stack(memory.v))

    def body(carry, xs):
        state, buffers = xs
        block = nnx.merge(graphdef, state)
        mem = None if buffers is None else dataclasses.replace(
            memory, k=(buffers[0],), v=(buffers[1],))
        carry, new = block(carry, positions, segment_ids, mem, 0, rotary)
        return carry, new

    x, new = jax.lax.scan(body, x, (stacked, kv), length=n)
    if new is None:
        return x, [None] * n
    return x, [(new[0][i], new[1][i]) for i in range(n)]
