"""Kernel-safe lookups for `Encoding.elementwise_bias`: selects and reductions, no gather.

An attention kernel evaluates a scheme's elementwise bias on one block of scores at a time,
with `head` an int32 [1, 1] array and the params loaded as whole (small) arrays. Pallas
lowerings (Triton, Mosaic) have no gather on values, so a lookup by a traced index is written
as a chain of selects or a masked reduction; both are ordinary jnp ops (also under
autodiff, which is how a kernel gets a table's gradient: the transpose is a select too).
Outside a kernel (`bias_from_elementwise`, `head` [H, 1, 1]) the same functions work, and
`take_row_head` uses a plain gather there, which is cheaper for a whole [H, Lq, Lk] bias.

Shapes: H heads, N table rows (e.g. T5 buckets).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

__all__ = ["take_head", "take_row_head"]

Array = jax.Array


def take_head(values: Sequence[float] | Array, head: Array) -> Array:
    """`values[head]` elementwise, float32 of head's shape.

    Args:
      values: a sequence of H Python floats (constants: exact, a chain of H selects) or a
        float array [H] (a masked sum over H).
      head: int array of any shape (the query head index).
    """
    head = jnp.asarray(head, jnp.int32)
    if isinstance(values, (list, tuple)):
        out = jnp.zeros(head.shape, jnp.float32)
        for h, value in enumerate(values):
            out = jnp.where(head == h, jnp.float32(value), out)
        return out
    values = jnp.asarray(values).astype(jnp.float32)
    n = values.shape[-1]
    hot = head[..., None] == jax.lax.broadcasted_iota(jnp.int32, (1,) * head.ndim + (n,),
                                                       head.ndim)
    row = values.reshape((1,) * head.ndim + (n,))
    return jnp.sum(jnp.where(hot, row, 0.0), axis=-1)


def take_row_head(table: Array, row: Array, head: Array) -> Array:
    """`table[row, head]` elementwise, float32 of the broadcast shape of row and head.

    Args:
      table: float [N, H] (e.g. a T5 bias table); row: int in [0, N); head: int in [0, H);
        row and head of equal rank (broadcastable).
    """
    table = jnp.asarray(table).astype(jnp.float32)
    row, head = jnp.asarray(row, jnp.int32), jnp.asarray(head, jnp.int32)
    n, h = table.shape
    if head.size != 1:  # a whole bias outside a kernel: one gather
        shape = jnp.broadcast_shapes(row.shape, head.shape)
        return table[jnp.broadcast_to(row, shape), jnp.broadcast_to(head, shape)]
    head = head.reshape((1, 1))
    col = jnp.sum(jnp.where(jax.lax.broadcasted_iota(jnp.int32, (n, h), 1) == head, table,
                            0.0), axis=1, keepdims=True)                      # [N, 1]
    rows = jax.lax.broadcasted_iota(jnp.int32, (n, 1), 0)
    out = jnp.zeros(row.shape, jnp.float32)
    for i in range(n):
        value = jnp.sum(jnp.where(rows == i, col, 0.0), axis=0, keepdims=True)  # [1, 1]
        out = jnp.where(row == i, value.reshape((1,) * row.ndim), out)
    return out
