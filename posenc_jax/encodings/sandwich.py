"""Sandwich (Chi, Fan, Rudnicky & Ramadge 2023, "Dissecting Transformer Length Extrapolation
via the Lens of Receptive Field Analysis", ACL 2023): a parameter-free relative bias made of
the inner product of two sinusoidal position embeddings.

With p_m the sinusoidal embedding of position m in d' dimensions (frequencies
omega_i = 10000^(-2i / d'), i = 1 .. d'/2), p_m . p_n = sum_i cos((m - n) omega_i) depends on
m - n only. Sandwich shifts it so that it is 0 at m = n and compresses it per head as ALiBi's
slopes do, head h = 1 .. H dividing by r_h = 8h / H:

    b_h(m, n) = (sum_{i=1}^{d'/2} cos((m - n) omega_i) - d'/2) / r_h
              = -(2 / r_h) sum_{i=1}^{d'/2} sin^2((m - n) omega_i / 2)

The second form (used here) has no cancellation: every term is <= 0, so b_h <= 0 with
equality only at m = n. The bias decays like log|m - n| on average but is NOT monotone:
sum_i cos oscillates (for d' = 128 it first rises between distances 13 and 14); it stays
strictly below its value at 0. d' is `embed_dim` (the model width, as NeMo's implementation),
the shift and the head compression follow NeMo's `SandwichRelativePositionEmbedding`.

Angles in float32 from the exact integer distance; the sum is a static loop over d'/2
constant frequencies, elementwise, so `elementwise_bias` runs inside a kernel on a block;
`bias` runs the same float32 operations as a loop, so that XLA computes the sum once per
(query, key) instead of fusing all its sines into every head's loop.

Shapes: B batch, H heads, Lq/Lk query/key lengths.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.checks import integer
from posenc_jax.encodings.base import Encoding, register
from posenc_jax.encodings.capabilities import ElementwiseBias
from posenc_jax.encodings.relative import distance, head_values, same_rank

__all__ = ["compression", "frequencies", "kernel"]

Array = jax.Array


def frequencies(dim: int) -> np.ndarray:
    """omega_i = 10000^(-2i / d'), i = 1 .. d'/2: float64 [d'/2] (host constants).

    Raises:
      TypeError / ValueError: dim not an even int >= 2.
    """
    dim = integer("embed_dim", dim, minimum=2)
    if dim % 2:
        raise ValueError(f"sandwich: embed_dim (d') must be even, got embed_dim={dim}")
    return 10000.0 ** (-2.0 * np.arange(1, dim // 2 + 1) / dim)


def compression(num_heads: int) -> np.ndarray:
    """r_h = 8 h / H for h = 1 .. H: float64 [H]."""
    num_heads = integer("num_heads", num_heads, minimum=1)
    return 8.0 * np.arange(1, num_heads + 1) / num_heads


def kernel(dist: Array, *, dim: int) -> Array:
    """sum_i cos(d omega_i) - d'/2 = -2 sum_i sin^2(d omega_i / 2), elementwise, float32."""
    dist = jnp.asarray(dist, jnp.float32)
    acc = jnp.zeros(dist.shape, jnp.float32)
    for w in frequencies(dim):  # static: d'/2 elementwise terms, fused by XLA
        s = jnp.sin(dist * jnp.float32(w / 2.0))
        acc = acc - 2.0 * s * s
    return acc


def _kernel_once(dist: Array, *, dim: int) -> Array:
    """`kernel` as a loop over the frequencies, the same float32 operations in the same order.

    XLA fuses `kernel`'s d'/2 unrolled sines into every consumer's loop (each head's and
    each layer's bias, ~10-40x nope's step time here); a while loop's result is computed once.
    """
    half = jnp.asarray(frequencies(dim) / 2.0, jnp.float32)           # [d'/2] = float32(w / 2)

    def term(i, acc):
        s = jnp.sin(dist * half[i])
        return acc - 2.0 * s * s

    return jax.lax.fori_loop(0, half.shape[0], term, jnp.zeros(dist.shape, jnp.float32))


@register("sandwich")
@dataclasses.dataclass(frozen=True)
class Sandwich(Encoding, ElementwiseBias):
    """Sandwich (Chi et al. 2023): `(p_m . p_n - d'/2) / (8h / H)`, parameter free."""

    hooks: ClassVar = frozenset({"bias"})

    num_heads: int
    embed_dim: int

    def __post_init__(self):
        compression(self.num_heads)
        frequencies(self.embed_dim)

    def elementwise_bias(self, params, q_positions, k_positions, head):
        dist = distance(q_positions, k_positions)
        inv_r = tuple(float(x) for x in 1.0 / compression(self.num_heads))   # exact constants
        inv_r, base = head_values(inv_r, head, kernel(dist, dim=self.embed_dim))
        return base * inv_r

    def bias(self, params, q_positions, k_positions, *, q=None):
        """float32 [H, Lq, Lk] for 1-D positions, else [B, H, Lq, Lk]: the kernel once on
        [B|1, 1, Lq, Lk], then one multiply per head (the same values as `elementwise_bias`)."""
        del params, q
        qp, kp = same_rank(jnp.asarray(q_positions)[..., :, None],
                           jnp.asarray(k_positions)[..., None, :])          # [.., Lq|1, 1|Lk]
        base = _kernel_once(distance(qp, kp), dim=self.embed_dim)
        base = base[..., None, :, :]                                        # [.., 1, Lq, Lk]
        inv_r = jnp.asarray(1.0 / compression(self.num_heads), jnp.float32)   # [H]
        return base * inv_r.reshape((1,) * (base.ndim - 3) + (self.num_heads, 1, 1))
