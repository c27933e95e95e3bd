"""ALiBi: attention with linear biases (Press, Smith & Lewis 2022, "Train short, test long").

Head h adds -m_h * |i - j| to the attention logit of query i and key j. The slopes m_h are a
geometric sequence fixed by the head count (`slopes`). No parameters are learned.

Slopes for n heads, exactly as the paper's reference code (and BLOOM, MPT) define them:

* n a power of two: m_i = 2^(-8 i / n), i = 1..n (8 heads: 1/2, 1/4, ..., 1/256);
* otherwise, with c the largest power of two below n: the c slopes of the c-head sequence,
  followed by the first n - c of every other slope ([0::2]) of the 2c-head sequence.

For a non-power-of-two n the list is therefore NOT globally decreasing: the extra heads
interleave between the first c (e.g. 12 heads: 2^-1 ... 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5,
2^-3.5). All slopes are distinct and positive.

Shapes: B batch, H heads, Lq/Lk query/key lengths; positions are [..., Lq] / [..., Lk].
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.checks import integer, pair, position_array
from posenc_jax.encodings.base import Encoding, register
from posenc_jax.encodings.capabilities import ElementwiseBias, bias_from_elementwise
from posenc_jax.encodings.lookup import take_head

__all__ = ["bias", "check_num_heads", "slopes"]


def _power_of_two_slopes(n: int) -> list[float]:
    return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]


def _slopes(n: int) -> list[float]:
    if n & (n - 1) == 0:
        return _power_of_two_slopes(n)
    c = 2 ** math.floor(math.log2(n))
    return _power_of_two_slopes(c) + _slopes(2 * c)[0::2][: n - c]


def slopes(num_heads: int) -> jax.Array:
    """ALiBi slopes for `num_heads` heads: float32 [H] (computed in float64 on the host).

    Raises:
      TypeError: num_heads is not an int.
      ValueError: num_heads < 1.
    """
    n = integer("num_heads", num_heads, minimum=1)
    return jnp.asarray(np.asarray(_slopes(n), np.float64), jnp.float32)


def check_num_heads(slopes, num_heads: int) -> None:
    """ValueError naming both counts when the slopes' head count differs from num_heads."""
    h = jnp.shape(slopes)[0] if jnp.ndim(slopes) else None
    if jnp.ndim(slopes) != 1 or h != num_heads:
        raise ValueError(
            f"ALiBi slopes have shape {jnp.shape(slopes)} (H={h}) but the attention scores "
            f"have num_heads={num_heads}"
        )


def bias(slopes, q_positions, k_positions) -> jax.Array:
    """The additive logit bias -slope_h * |q_pos - k_pos|.

    Args:
      slopes: float [H] (from `slopes`).
      q_positions: int or float [..., Lq] (e.g. [Lq] or [B, Lq]).
      k_positions: int or float [..., Lk]; leading dims broadcast against q_positions'.

    Returns:
      float32 [..., H, Lq, Lk]: [H, Lq, Lk] for 1-D positions, [B, H, Lq, Lk] for [B, L].

    Raises:
      TypeError: bool positions. ValueError: slopes not 1-D; host integers past JAX's dtype.
    """
    slopes = jnp.asarray(slopes, jnp.float32)
    if slopes.ndim != 1:
        raise ValueError(f"slopes must be 1-D [H], got shape {slopes.shape}")
    q, k = pair(position_array("q_positions", q_positions, floats=True),  # [..., Lq, 1]
                position_array("k_positions", k_positions, floats=True))  # [..., 1, Lk]
    dist = distance(q, k)[..., None, :, :]                               # [..., 1, Lq, Lk]
    m = slopes.reshape((1,) * (dist.ndim - 3) + (-1, 1, 1))    # [1.., H, 1, 1]
    return 0.0 - m * dist                                      # +0.0 on the diagonal


def distance(q: jax.Array, k: jax.Array) -> jax.Array:
    """|k - q| as float32 (broadcast). Integer positions: exact max - min in their common
    type, which never wraps (k - q of unsigned positions would wrap to ~2^32 for every past
    key); float positions: in float32."""
    if jnp.issubdtype(q.dtype, jnp.integer) and jnp.issubdtype(k.dtype, jnp.integer):
        common = jnp.promote_types(q.dtype, k.dtype)
        q, k = q.astype(common), k.astype(common)
        return (jnp.maximum(k, q) - jnp.minimum(k, q)).astype(jnp.float32)
    return jnp.abs(k.astype(jnp.float32) - q.astype(jnp.float32))


@register("alibi")
@dataclasses.dataclass(frozen=True)
class ALiBi(Encoding, ElementwiseBias):
    """Attention with linear biases (Press et al. 2022): `-slope_h * |i - j|` on the scores."""

    hooks: ClassVar = frozenset({"bias"})

    num_heads: int

    def __post_init__(self):
        slopes(self.num_heads)  # validates

    def bias(self, params, q_positions, k_positions, *, q=None):
        q_positions = position_array("q_positions", q_positions, floats=True)
        k_positions = position_array("k_positions", k_positions, floats=True)
        return bias_from_elementwise(self, params, q_positions, k_positions,
                                     num_heads=self.num_heads)

    def elementwise_bias(self, params, q_positions, k_positions, head):
        """-slope_head * |q - k| from the block's positions (slopes as exact constants)."""
        slope = take_head(tuple(_slopes(self.num_heads)), head)
        return 0.0 - slope * distance(jnp.asarray(q_positions), jnp.asarray(k_positions))
