"""Small input checks shared by the encoders (private).

Positions that index a table (learned absolute embeddings, T5 buckets, Shaw's clipped
relative embeddings) must be integers: a float position there is almost always a bug
(e.g. an interpolated RoPE position passed to the wrong encoder), so we raise instead of
silently truncating it.
"""

from __future__ import annotations

import numbers

import jax.numpy as jnp


def require_integer(positions, name: str = "positions"):
    """Return `positions` as a jax array; TypeError naming the dtype unless it is an integer.

    Args:
      positions: array-like of any shape (concrete or traced).
      name: the argument name used in the error message.
    """
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise TypeError(
            f"{name} must have an integer dtype (they index a table), got dtype={positions.dtype}"
        )
    return positions


def require_int(value, name: str, *, minimum: int) -> int:
    """Return `value` as a Python int; TypeError if not an integer, ValueError if < minimum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {name}={value!r} ({type(value).__name__})")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")
    return value


def positive_int(name: str, value) -> None:
    """ValueError naming the value unless it is an int >= 1 (bools are not ints here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {name}={value!r}")


def pair(q_positions, k_positions):
    """q [..., Lq] and k [..., Lk] -> ([..., Lq, 1], [..., 1, Lk]) of equal rank.

    Leading dims are padded with ones on the left so that the two broadcast explicitly under
    `jax_numpy_rank_promotion='raise'` (e.g. q [B, Lq] with k [Lk]).
    """
    q = jnp.asarray(q_positions)[..., :, None]
    k = jnp.asarray(k_positions)[..., None, :]
    rank = max(q.ndim, k.ndim)
    q = q.reshape((1,) * (rank - q.ndim) + q.shape)
    k = k.reshape((1,) * (rank - k.ndim) + k.shape)
    return q, k
