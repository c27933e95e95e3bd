"""Relative position biases: T5's bucketed bias and Shaw et al.'s clipped embeddings.

* T5 (Raffel et al. 2020): the relative position k_pos - q_pos (memory minus query) is mapped
  to one of `num_buckets` buckets (`t5_bucket`); a learned [num_buckets, H] table gives one
  scalar bias per head and bucket (`t5_bias`).
* `distance`, `same_rank`, `head_values`: the pieces of an elementwise bias (KERPLE,
  Sandwich, FIRE), which a kernel evaluates on [Bq, 1] / [1, Bk] position blocks.
* Shaw, Uszkoreit & Vaswani (2018): 2K + 1 learned vectors a_r of width D, shared across
  heads, for the clipped relative position r = clip(k_pos - q_pos, -K, K); they enter the
  attention logits as q_i . a_{r(i, j)} (`shaw_bias`); the optional value-side vectors a^V_r
  enter the output as sum_j p_ij a^V_{r(i, j)} (`shaw_value_term`).

Positions must be integers here (they index tables): float positions raise TypeError.

Shapes: B batch, H heads, D head dim, Lq/Lk query/key lengths.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.checks import boolean, integer, integer_array, pair
from posenc_jax.encodings.lookup import take_head

Array = jax.Array

__all__ = [
    "distance",
    "head_values",
    "relative_positions",
    "same_rank",
    "saturating_difference",
    "shaw_bias",
    "shaw_init",
    "shaw_value_term",
    "t5_bias",
    "t5_bucket",
    "t5_init",
]


def relative_positions(q_positions, k_positions) -> jax.Array:
    """k_pos - q_pos (memory minus query, T5's convention): int32 [..., Lq, Lk].

    Args:
      q_positions: integer [..., Lq]; k_positions: integer [..., Lk] (leading dims broadcast,
        e.g. [B, Lq] with [Lk]).

    Near the int32 limits the difference saturates at them instead of wrapping (every
    consumer clips it to a much smaller range anyway). Concrete positions that do not fit in
    int32 are refused; traced ones must fit (they are cast).

    Raises:
      TypeError: non-integer positions (names the dtype).
      ValueError: concrete positions outside the int32 range.
    """
    _fits_int32("q_positions", q_positions)
    _fits_int32("k_positions", k_positions)
    q = integer_array("q_positions", q_positions)
    k = integer_array("k_positions", k_positions)
    q, k = pair(q.astype(jnp.int32), k.astype(jnp.int32))
    return saturating_difference(k, q)


def saturating_difference(k, q) -> jax.Array:
    """k - q in int32 (broadcast elementwise, e.g. a kernel block's [Bq, 1] and [1, Bk]),
    saturating at the int32 limits instead of wrapping (2^31 - 1 - (-2^31 + 5) is not a near
    key). 64-bit positions (under `jax_enable_x64`) are subtracted in int64 first, so
    positions past 2^31 that are near each other give their exact difference (a cast to int32
    first would wrap them)."""
    k, q = jnp.asarray(k), jnp.asarray(q)
    wide = jnp.int64 if max(k.dtype.itemsize, q.dtype.itemsize) > 4 else jnp.int32
    k, q = k.astype(wide), q.astype(wide)
    diff = k - q
    wrapped = ((k ^ q) & (k ^ diff)) < 0  # signs of k and q differ and the result's is wrong
    limits = np.iinfo(wide)
    diff = jnp.where(wrapped, jnp.where(k >= 0, limits.max, limits.min).astype(wide), diff)
    return jnp.clip(diff, _INT32.min, _INT32.max).astype(jnp.int32)


_INT32 = np.iinfo(np.int32)


def _fits_int32(name: str, positions) -> None:
    if isinstance(positions, jax.core.Tracer):
        return
    host = np.asarray(positions)
    if host.size and np.issubdtype(host.dtype, np.integer) and (
            host.min() < _INT32.min or host.max() > _INT32.max):
        raise ValueError(f"{name} must fit in int32 (relative positions are int32), got values "
                         f"in [{host.min()}, {host.max()}]")





def same_rank(*arrays) -> list[Array]:
    """The arrays with ones prepended to their shapes to a common rank (explicit broadcasting
    under `jax_numpy_rank_promotion='raise'`)."""
    arrays = [jnp.asarray(a) for a in arrays]
    rank = max(a.ndim for a in arrays)
    return [a.reshape((1,) * (rank - a.ndim) + a.shape) for a in arrays]


def distance(q_positions, k_positions) -> Array:
    """|m - n| as float32, elementwise over broadcastable integer positions (e.g. [Bq, 1] and
    [1, Bk]; use `checks.pair` first for [..., Lq] / [..., Lk] rows). Exact integer difference,
    then one rounding to float32."""
    q = integer_array("q_positions", q_positions).astype(jnp.int32)
    k = integer_array("k_positions", k_positions).astype(jnp.int32)
    q, k = same_rank(q, k)
    return jnp.abs(k - q).astype(jnp.float32)


def head_values(table: Array, head, like: Array) -> tuple[Array, Array]:
    """table[head] (float32; table a [H] array or a tuple of H floats) and `like`, brought to
    a common rank for elementwise use."""
    values, like = same_rank(take_head(table, head), like)  # kernel-safe (no gather)
    return values, like


def _check_t5(bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Validate T5 hyperparameters; return max_exact (buckets per direction // 2)."""
    bidirectional = boolean("bidirectional", bidirectional)
    num_buckets = integer("num_buckets", num_buckets, minimum=2)
    max_distance = integer("max_distance", max_distance, minimum=1)
    if bidirectional and (num_buckets < 4 or num_buckets % 2):
        raise ValueError(
            "bidirectional T5 buckets are split in two halves of >= 2 buckets, so num_buckets "
            f"must be even and >= 4, got num_buckets={num_buckets}"
        )
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_direction // 2
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance must exceed the {max_exact} exact buckets "
            f"(num_buckets={num_buckets}, bidirectional={bidirectional}), "
            f"got max_distance={max_distance}"
        )
    return max_exact


def t5_bucket(relative_position, *, bidirectional: bool, num_buckets: int = 32,
              max_distance: int = 128) -> jax.Array:
    """T5's `_relative_position_bucket`: int32 buckets in [0, num_buckets), same shape.

    With n buckets per direction (num_buckets, or num_buckets // 2 when bidirectional, the
    upper half for positive relative positions), distances below n // 2 get their own bucket
    and larger ones are log-spaced up to max_distance; beyond it they share the last bucket.
    Causal (bidirectional=False): positive relative positions (the future) map to bucket 0.
    The log is taken in float32, as in T5 and Hugging Face, so pretrained tables match.

    Args:
      relative_position: integer array (k_pos - q_pos, see `relative_positions`).
      bidirectional: encoder-style (True) or causal decoder-style (False).
      num_buckets: >= 2; when bidirectional, even and >= 4 (each direction needs >= 2
        buckets, and an odd count would leave the last bucket forever unused).
      max_distance: > the exact-bucket count (n // 2), hence >= 1.

    Raises:
      TypeError: non-integer relative_position or hyperparameters.
      ValueError: num_buckets < 2 (or odd / < 4 when bidirectional), max_distance < 1 or not
        above the exact-bucket count.
    """
    max_exact = _check_t5(bidirectional, num_buckets, max_distance)
    rel = integer_array("relative_position", relative_position).astype(jnp.int32)
    rel = jnp.maximum(rel, -_INT32.max)  # -(int32 min) wraps to itself: a far key looked near
    buckets = jnp.zeros_like(rel)
    n = num_buckets
    if bidirectional:
        n = num_buckets // 2
        buckets = buckets + jnp.where(rel > 0, n, 0).astype(jnp.int32)
        dist = jnp.abs(rel)
    else:
        dist = -jnp.minimum(rel, 0)
    # Clamp before the log so dist=0 (handled by the exact branch) never produces -inf.
    safe = jnp.maximum(dist, 1).astype(jnp.float32)
    # Same operation order as T5 / HF: log(d / max_exact) / log(max_distance / max_exact) * (n -
    # max_exact), all in float32, truncated toward zero.
    log_ratio = jnp.float32(math.log(max_distance / max_exact))
    frac = jnp.log(safe / jnp.float32(max_exact)) / log_ratio * jnp.float32(n - max_exact)
    large = max_exact + frac.astype(jnp.int32)
    large = jnp.minimum(large, n - 1)
    return buckets + jnp.where(dist < max_exact, dist, large)


def t5_init(key, *, num_buckets: int, num_heads: int, stddev: float = 0.02) -> jax.Array:
    """A fresh T5 bias table drawn from N(0, stddev^2): float32 [num_buckets, H]."""
    num_buckets = integer("num_buckets", num_buckets, minimum=2)
    num_heads = integer("num_heads", num_heads, minimum=1)
    return stddev * jax.random.normal(key, (num_buckets, num_heads), jnp.float32)


def t5_bias(table, q_positions, k_positions, *, bidirectional: bool, num_buckets: int,
            max_distance: int) -> jax.Array:
    """T5 relative position bias: table[bucket(k_pos - q_pos)] per head.

    Args:
      table: [num_buckets, H] (any float dtype).
      q_positions: integer [..., Lq]; k_positions: integer [..., Lk] (leading dims broadcast).
      bidirectional, num_buckets, max_distance: as in `t5_bucket`.

    Returns:
      [..., H, Lq, Lk] in table.dtype ([H, Lq, Lk] for 1-D positions, [B, H, Lq, Lk] for
      [B, L] positions).

    Raises:
      ValueError: table.shape[0] != num_buckets or a table that is not 2-D; see `t5_bucket`.
      TypeError: non-integer positions.
    """
    table = jnp.asarray(table)
    if table.ndim != 2 or table.shape[0] != num_buckets:
        raise ValueError(
            f"T5 table must be [num_buckets={num_buckets}, H], got shape {table.shape}"
        )
    buckets = t5_bucket(relative_positions(q_positions, k_positions),
                        bidirectional=bidirectional, num_buckets=num_buckets,
                        max_distance=max_distance)                 # [..., Lq, Lk]
    values = jnp.take(table.T, buckets, axis=1)                    # [H, ..., Lq, Lk]
    return jnp.moveaxis(values, 0, -3)                             # [..., H, Lq, Lk]


def shaw_init(key, *, max_relative_position: int, head_dim: int,
              stddev: float = 0.02) -> jax.Array:
    """Shaw et al.'s 2K + 1 relative embeddings from N(0, stddev^2): float32 [2K + 1, D].

    Row r holds a_{r - K}, the embedding of relative position r - K (k_pos - q_pos).

    Raises:
      ValueError: max_relative_position (K) < 1 or head_dim < 1.
    """
    k = integer("max_relative_position", max_relative_position, minimum=1)
    d = integer("head_dim", head_dim, minimum=1)
    return stddev * jax.random.normal(key, (2 * k + 1, d), jnp.float32)


def shaw_bias(table, q, q_positions, k_positions, *, max_relative_position: int) -> jax.Array:
    """Shaw et al.'s score term q_i . a_{clip(k_pos_j - q_pos_i, -K, K)}.

    Computed without materialising [Lq, Lk, D]: first qa = q . a_r for all 2K + 1 rows
    ([B, H, Lq, 2K + 1], one small matmul), then a gather with the clipped index.

    The caller passes q already multiplied by the softmax scale (e.g. 1 / sqrt(D)), so the
    result is exactly the term added to the attention logits.

    Args:
      table: [2K + 1, D] (from `shaw_init`).
      q: [B, Lq, H, D] (any leading dims [..., Lq, H, D]).
      q_positions: integer [Lq] or [B, Lq]; k_positions: integer [Lk] or [B, Lk].
      max_relative_position: K >= 1.

    Returns:
      [B, H, Lq, Lk] in the promoted dtype of q and table.

    Raises:
      ValueError: K < 1, table rows != 2K + 1, table width != D, q not [..., Lq, H, D].
      TypeError: non-integer positions.
    """
    k = integer("max_relative_position", max_relative_position, minimum=1)
    table, q = jnp.asarray(table), jnp.asarray(q)
    if table.ndim != 2 or table.shape[0] != 2 * k + 1:
        raise ValueError(
            f"Shaw table must have 2K+1={2 * k + 1} rows for max_relative_position={k}, "
            f"got shape {table.shape}"
        )
    if q.ndim < 3 or table.shape[1] != q.shape[-1]:
        raise ValueError(
            f"Shaw table width {table.shape[1]} must equal q's head dim D; q must be "
            f"[..., Lq, H, D], got q shape {q.shape}"
        )
    qa = jnp.einsum("...qhd,rd->...hqr", q, table)                # [..., H, Lq, 2K+1]
    idx = jnp.clip(relative_positions(q_positions, k_positions), -k, k) + k  # [.., Lq, Lk]
    idx = idx[..., None, :, :]                                    # [.., 1, Lq, Lk]
    rank = max(idx.ndim, qa.ndim)
    idx = idx.reshape((1,) * (rank - idx.ndim) + idx.shape)
    qa = qa.reshape((1,) * (rank - qa.ndim) + qa.shape)
    out_shape = jnp.broadcast_shapes(qa.shape[:-1], idx.shape[:-1]) + idx.shape[-1:]
    idx = jnp.broadcast_to(idx, out_shape)
    qa = jnp.broadcast_to(qa, out_shape[:-1] + qa.shape[-1:])
    return jnp.take_along_axis(qa, idx, axis=-1)                 # [..., H, Lq, Lk]


def shaw_value_term(table, weights, q_positions, k_positions, *,
                    max_relative_position: int) -> jax.Array:
    """Shaw et al.'s value-side term sum_j w_ij a^V_{clip(k_pos_j - q_pos_i, -K, K)}.

    Linear in `weights`: first the weight that each query puts on each of the 2K + 1 clipped
    relative positions (P [B, H, Lq, 2K + 1], one masked row sum per relative position, so no
    [Lq, Lk, 2K + 1] one-hot is built), then P @ table.

    Args:
      table: [2K + 1, D] (from `shaw_init`), row r = a^V_{r - K}.
      weights: float [B, H, Lq, Lk] attention weights (probabilities, or unnormalised block
        weights in blockwise attention).
      q_positions: integer [B|1, Lq]; k_positions: integer [B|1, Lk].
      max_relative_position: K >= 1.

    Returns:
      float32 [B, H, Lq, D].

    Raises:
      ValueError: K < 1, table rows != 2K + 1, weights not 4-D.
      TypeError: non-integer positions.
    """
    k = integer("max_relative_position", max_relative_position, minimum=1)
    table = jnp.asarray(table, jnp.float32)
    weights = jnp.asarray(weights, jnp.float32)
    if table.ndim != 2 or table.shape[0] != 2 * k + 1:
        raise ValueError(f"Shaw value table must have 2K+1={2 * k + 1} rows for "
                         f"max_relative_position={k}, got shape {table.shape}")
    if weights.ndim != 4:
        raise ValueError(f"weights must be [B, H, Lq, Lk], got shape {weights.shape}")
    idx = jnp.clip(relative_positions(q_positions, k_positions), -k, k) + k   # [B|1, Lq, Lk]
    idx = idx.reshape((-1, 1) + idx.shape[-2:])                               # [B|1, 1, Lq, Lk]
    zero = jnp.float32(0.0)
    per_rel = jnp.stack([jnp.sum(jnp.where(idx == r, weights, zero), axis=-1)
                         for r in range(2 * k + 1)], axis=-1)               # [B, H, Lq, 2K+1]
    return jnp.einsum("bhqr,rd->bhqd", per_rel, table)
