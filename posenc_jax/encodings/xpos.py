"""xPos (Sun, Dong, Patra, Ma, Huang, Benhaim, Chaudhary, Song & Wei 2022, "A Length-
Extrapolatable Transformer", torchscale's `XPOS`): RoPE times an exponential decay.

Feature pair i of a query at position n and of a key at position m (RoPE's rotation by
n theta_i, m theta_i, theta_i = 10000^(-2i/d)) is also scaled:

    f_q(q, n) = R(n theta) q * zeta_i^(n / gamma),   f_k(k, m) = R(m theta) k * zeta_i^(-m / gamma)
    <f_q(q, n), f_k(k, m)> = sum_i zeta_i^((n - m) / gamma) <R((n - m) theta_i) q_i, k_i>

with zeta_i = (2i / d + 0.4) / 1.4 in (0, 1) (the paper's (i / (d/2) + gamma') / (1 + gamma'),
gamma' = 0.4; here `zeta_offset`) and gamma = 512 (`scale_base`). For n >= m the factor
decays with the distance: xPos is defined for causal attention only (`CausalOnly`).

Overflow: zeta_0^(n / gamma) = 0.286^(n / 512) underflows float32 below 1e-38 from n ~ 36k
(and the key's inverse overflows), although the product depends on n - m only. So the scale
is not applied in `rotate` (whose keys a KV cache stores) but in `block_transform`, which
attention calls on each block it scores after the cache: the exponent is re-centred on the
block's largest query position c,

    q * zeta^((n - c) / gamma),   k * zeta^((c - m) / gamma)        (same product)

computed as exp(((n - c) / gamma) ln zeta) from the exact integer n - c. Under a causal mask
every visible key has m <= c, so the key factor is <= 1 and only underflows where the true
factor is below ~1e-38 x the query factor; the query factor is >= 1 and bounded by the span
of the query block (dense attention: the whole query set; a decode step: 1 position, exact).
Exponents are clipped to +-80 so that padded or masked rows never make inf or NaN. torchscale
re-centres on the middle of the sequence for the same reason.

Shapes: B batch, L length, H heads, K kv heads, D head dim, R = D // 2 pairs.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.checks import finite_float, integer, integer_array, one_of
from posenc_jax.encodings.base import Encoding, register
from posenc_jax.encodings.capabilities import BlockTransform, CausalOnly
from posenc_jax.encodings.frequencies import inv_freq
from posenc_jax.encodings.rope import LAYOUTS, apply

__all__ = ["log_zeta", "rescale", "scale"]

Array = jax.Array
_CLIP = 80.0  # |exponent| bound: e^80 ~ 5.5e34 stays finite in float32


def log_zeta(head_dim: int, *, zeta_offset: float = 0.4) -> np.ndarray:
    """ln zeta_i, zeta_i = (2i / d + zeta_offset) / (1 + zeta_offset): float64 [R = d // 2]."""
    d = integer("head_dim", head_dim, minimum=2)
    zeta_offset = finite_float("zeta_offset", zeta_offset, above=0.0)
    return np.log((np.arange(0, d, 2) / d + zeta_offset) / (1.0 + zeta_offset))


def scale(offsets, log_z, *, scale_base: float, layout: str) -> Array:
    """zeta^(offset / gamma) per feature: float32 [..., L, 1, D] for int offsets [..., L].

    The offset (an exact integer) is cast to float32 once; the exponent is clipped to +-80.
    Pair i's factor is placed on both of its features (by `layout`).
    """
    one_of("layout", layout, LAYOUTS)
    off = jnp.asarray(offsets).astype(jnp.float32)[..., None]              # [..., L, 1]
    lz = jnp.asarray(log_z, jnp.float32)
    expo = jnp.clip(off * (lz / jnp.float32(scale_base)).reshape((1,) * (off.ndim - 1) + (-1,)),
                    -_CLIP, _CLIP)                                          # [..., L, R]
    factor = jnp.exp(expo)
    if layout == "half":
        factor = jnp.concatenate([factor, factor], axis=-1)
    else:
        factor = jnp.repeat(factor, 2, axis=-1)
    return factor[..., None, :]                                             # [..., L, 1, D]


def rescale(q, k, q_positions, k_positions, log_z, *, scale_base: float, layout: str):
    """The xPos scale re-centred on c = max(q_positions) per batch row: q [B, Lq, H, D] *
    zeta^((n - c)/gamma), k [B, Lk, K, D] * zeta^((c - m)/gamma); positions [B|1, L] ints.
    Returns (q, k) in their dtypes."""
    qp = integer_array("q_positions", q_positions).astype(jnp.int32)
    kp = integer_array("k_positions", k_positions).astype(jnp.int32)
    c = jnp.max(qp, axis=-1, keepdims=True)                                 # [B|1, 1]
    q_scale = scale(qp - c, log_z, scale_base=scale_base, layout=layout)
    k_scale = scale(c - kp, log_z, scale_base=scale_base, layout=layout)
    q_scale = q_scale.reshape((1,) * (q.ndim - q_scale.ndim) + q_scale.shape)
    k_scale = k_scale.reshape((1,) * (k.ndim - k_scale.ndim) + k_scale.shape)
    q_out = (q.astype(jnp.float32) * q_scale).astype(q.dtype)
    k_out = (k.astype(jnp.float32) * k_scale).astype(k.dtype)
    return q_out, k_out


@register("xpos")
@dataclasses.dataclass(frozen=True)
class XPos(Encoding, BlockTransform, CausalOnly):
    """xPos (Sun et al. 2022): RoPE with the decay `zeta_i^((n - m) / gamma)`; causal only."""

    hooks: ClassVar = frozenset({"rotate"})

    head_dim: int
    base: float = 10000.0
    scale_base: float = 512.0
    zeta_offset: float = 0.4
    layout: str = "half"

    def __post_init__(self):
        integer("head_dim", self.head_dim, minimum=2)
        if self.head_dim % 2:
            raise ValueError(f"xpos: head_dim must be even, got head_dim={self.head_dim}")
        finite_float("scale_base", self.scale_base, above=0.0)
        log_zeta(self.head_dim, zeta_offset=self.zeta_offset)
        one_of("layout", self.layout, LAYOUTS)
        inv_freq(self.head_dim, base=self.base)

    def rotate(self, params, q, k, q_positions, k_positions, *, seq_len=None):
        integer_array("q_positions", q_positions)
        integer_array("k_positions", k_positions)
        freqs = inv_freq(self.head_dim, base=self.base)
        return (apply(q, q_positions, freqs, layout=self.layout),
                apply(k, k_positions, freqs, layout=self.layout))

    def block_transform(self, params, q, k, q_positions, k_positions):
        return rescale(q, k, q_positions, k_positions,
                       log_zeta(self.head_dim, zeta_offset=self.zeta_offset),
                       scale_base=self.scale_base, layout=self.layout)
