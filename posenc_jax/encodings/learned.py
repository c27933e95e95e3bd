"""Learned absolute position embeddings: a [max_len, E] table indexed by integer positions.

JAX gathers clamp out-of-range indices by default, so a position >= max_len would silently
reuse the last row. Here an out-of-range position is always loud:

* concrete positions (NumPy, lists, or jax arrays outside `jit`) are checked on the host and
  raise `ValueError` naming the first bad position, its value and the range [0, max_len);
* traced positions (inside `jit`/`vmap`/`grad`) cannot be checked at trace time, so `lookup`
  gathers with `mode="fill"` and returns NaN rows for them (never a clamp: the NaN
  propagates to the loss and is easy to spot);
* `checked_lookup` additionally emits a `jax.experimental.checkify` check, so wrapping the
  jitted function with `checkify.checkify` returns an error that names the bad position.

Shapes: L length, E embedding width; positions are integer [..., L].
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from posenc_jax.checks import finite_float, integer, integer_array, last_axis
from posenc_jax.encodings.base import Encoding, register
from posenc_jax.encodings.capabilities import MaxPositions, ModelDefaults, ParamAxes

__all__ = ["checked_lookup", "init", "lookup"]


def init(key, max_len: int, dim: int, *, stddev: float = 0.02, dtype=jnp.float32) -> jax.Array:
    """A fresh table drawn from N(0, stddev^2), shape [max_len, E] in `dtype`.

    Raises:
      ValueError: max_len < 1 or dim < 1 (TypeError if they are not ints).
    """
    max_len = integer("max_len", max_len, minimum=1)
    dim = integer("dim", dim, minimum=1)
    return (stddev * jax.random.normal(key, (max_len, dim), jnp.float32)).astype(dtype)


def _check_table(table) -> jax.Array:
    table = jnp.asarray(table)
    if table.ndim != 2:
        raise ValueError(f"table must be 2-D [max_len, E], got shape {table.shape}")
    if not jnp.issubdtype(table.dtype, jnp.floating):
        raise TypeError(f"table must be floating point, got dtype={table.dtype}")
    return table


def _host_check(positions, max_len: int) -> None:
    """Raise ValueError naming the first out-of-range position of a concrete array."""
    pos = np.asarray(positions)
    bad = (pos < 0) | (pos >= max_len)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"position out of range for a learned table of max_len={max_len}: "
            f"positions[{', '.join(map(str, index))}]={int(pos[index])}, allowed range is "
            f"[0, {max_len})"
        )


def _gather(table: jax.Array, positions: jax.Array) -> jax.Array:
    """table[positions] with NaN rows (not a clamp, not a wrap) for out-of-range positions."""
    max_len = table.shape[0]
    # Negative indices would otherwise wrap around NumPy-style; send them out of range too.
    idx = jnp.where(positions < 0, max_len, positions)
    return jnp.take(table, idx, axis=0, mode="fill", fill_value=jnp.nan)


def lookup(table, positions) -> jax.Array:
    """Rows of `table` at `positions`.

    Args:
      table: floating [max_len, E].
      positions: integer [..., L].

    Returns:
      [..., L, E] in table.dtype. Traced out-of-range positions give NaN rows (see module
      docstring); use `checked_lookup` under `checkify.checkify` to get an error instead.

    Raises:
      TypeError: non-integer positions (names the dtype) or a non-floating table.
      ValueError: a concrete position outside [0, max_len) (names it and its value).
    """
    table = _check_table(table)
    concrete = not isinstance(positions, jax.core.Tracer)
    positions = integer_array("positions", positions)
    if concrete:
        _host_check(positions, table.shape[0])
    return _gather(table, positions)


def checked_lookup(table, positions) -> jax.Array:
    """`lookup` plus a checkify range check for traced positions.

    Use it inside a function wrapped by `jax.experimental.checkify.checkify` (jitted or not):

        err, out = jax.jit(checkify.checkify(f))(table, positions)
        err.throw()   # ValueError-like JaxRuntimeError naming the first bad position

    A jitted function that calls `checked_lookup` on traced positions must be checkified
    (JAX refuses an un-functionalized check). Concrete positions are checked on the host
    exactly as in `lookup`.
    """
    table = _check_table(table)
    if not isinstance(positions, jax.core.Tracer):
        return lookup(table, positions)
    positions = integer_array("positions", positions)
    max_len = table.shape[0]
    bad = (positions < 0) | (positions >= max_len)
    flat = jnp.argmax(bad.reshape(-1))
    index = jnp.unravel_index(flat, positions.shape) if positions.ndim else ()
    value = positions.reshape(-1)[flat]
    where = ", ".join(["{}"] * len(index))
    checkify.check(
        ~jnp.any(bad),
        f"position out of range for a learned table of max_len={max_len}: "
        f"positions[{where}]={{}}, allowed range is [0, {max_len})",
        *index, value,
    )
    return _gather(table, positions)


@register("learned")
@dataclasses.dataclass(frozen=True)
class Learned(Encoding, MaxPositions, ModelDefaults, ParamAxes):
    """A learned table of `max_len` absolute positions added to the embeddings.

    A position outside [0, max_len) is an error (concrete positions) or NaN (traced ones),
    never a silent clamp.
    """

    hooks: ClassVar = frozenset({"embed"})
    param_axes: ClassVar = {"table": ("table", "embed")}
    # In a model, start the table at the scale of the sqrt(E)-scaled token embeddings.
    model_defaults: ClassVar = {"stddev": 1.0}

    embed_dim: int
    max_len: int = 2048
    stddev: float = 0.02

    def __post_init__(self):
        integer("max_len", self.max_len, minimum=1)
        integer("embed_dim", self.embed_dim, minimum=1)
        finite_float("stddev", self.stddev, minimum=0)

    @property
    def max_positions(self):
        return self.max_len

    def init(self, key):
        return {"table": init(key, self.max_len, self.embed_dim, stddev=self.stddev)}

    def embed(self, params, x, positions):
        last_axis("x", x, self.embed_dim, f"the {self.name} encoding's embed_dim")
        pe = lookup(params["table"], positions)
        return x + jnp.broadcast_to(pe, x.shape).astype(x.dtype)
