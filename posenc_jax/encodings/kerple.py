"""KERPLE: kernelized relative positional embedding (Chi, Fan, Ramadge & Rudnicky 2022,
"KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation", NeurIPS 2022).

Head h adds a conditionally positive definite kernel of the distance |m - n| between query
position m and key position n to the attention logits, with learned r1_h, r2_h > 0:

    log   (the paper's best):  b_h(m, n) = -r1_h * log(1 + r2_h * |m - n|)
    power:                     b_h(m, n) = -r1_h * |m - n|^(r2_h),   0 < r2_h <= 2

Initialisation as the authors' code (gpt-neox `ParallelKerpleLog`): r1 ~ U(0, 2) and
r2 ~ U(0, 1) per head (the same draw for the power variant). The authors clamp both to
>= eps = 0.01 before every forward pass (and r2 <= 2 for the power kernel); here the clamp is a
straight-through projection, `p + stop_gradient(clip(p) - p)`: the forward pass sees the
clamped value and the gradient reaches the raw parameter, as the in-place clamp does in PyTorch.

The distance is the exact integer |m - n| cast to float32, so the bias is a function of m - n
only, at any position (10^6 included). `elementwise_bias` evaluates one (query, key, head)
element with elementwise ops and two [H] lookups, so blockwise attention and the Pallas kernel
compute it on a block without materialising [H, Lq, Lk].

Shapes: B batch, H heads, Lq/Lk query/key lengths.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from posenc_jax.checks import integer, one_of
from posenc_jax.encodings.base import Encoding, register
from posenc_jax.encodings.capabilities import ElementwiseBias, ParamAxes, bias_from_elementwise
from posenc_jax.encodings.relative import distance, head_values

__all__ = ["EPS", "VARIANTS", "init", "kernel"]

Array = jax.Array
VARIANTS = ("log", "power")
EPS = 0.01  # the authors' clamp


def init(key: Array, *, num_heads: int) -> dict[str, Array]:
    """The paper's draw: {"r1": U(0, 2), "r2": U(0, 1)}, each float32 [H]."""
    num_heads = integer("num_heads", num_heads, minimum=1)
    k1, k2 = jax.random.split(key)
    return {"r1": 2.0 * jax.random.uniform(k1, (num_heads,), jnp.float32),
            "r2": jax.random.uniform(k2, (num_heads,), jnp.float32)}


def _clamp(p: Array, lo: float, hi: float | None = None) -> Array:
    """Straight-through clamp: forward clip(p), gradient as the identity."""
    p = jnp.asarray(p, jnp.float32)
    return p + jax.lax.stop_gradient(jnp.clip(p, lo, hi) - p)


def kernel(dist: Array, r1: Array, r2: Array, *, variant: str) -> Array:
    """The kernel value, elementwise: dist, r1, r2 broadcast together (float32).

    log: -r1 log(1 + r2 d); power: -r1 d^r2 (r2 clamped to [eps, 2]); r1, r2 >= eps.
    """
    one_of("variant", variant, VARIANTS)
    r1 = _clamp(r1, EPS)
    if variant == "log":
        return 0.0 - r1 * jnp.log1p(_clamp(r2, EPS) * dist)  # +0.0 at distance 0
    r2 = _clamp(r2, EPS, 2.0)
    # d^r2 with d = 0 -> 0 and a finite gradient in r2 (log 0 masked).
    safe = jnp.where(dist > 0, dist, jnp.float32(1.0))
    return jnp.where(dist > 0, 0.0 - r1 * jnp.exp(r2 * jnp.log(safe)), jnp.float32(0.0))


@register("kerple")
@dataclasses.dataclass(frozen=True)
class KERPLE(Encoding, ElementwiseBias, ParamAxes):
    """KERPLE (Chi et al. 2022): `-r1_h log(1 + r2_h |m - n|)` or `-r1_h |m - n|^r2_h`."""

    hooks: ClassVar = frozenset({"bias"})
    param_axes: ClassVar = {"r1": ("heads",), "r2": ("heads",)}

    num_heads: int
    variant: str = "log"

    def __post_init__(self):
        integer("num_heads", self.num_heads, minimum=1)
        one_of("variant", self.variant, VARIANTS)

    def init(self, key):
        return init(key, num_heads=self.num_heads)

    def elementwise_bias(self, params, q_positions, k_positions, head):
        dist = distance(q_positions, k_positions)
        r1, dist = head_values(params["r1"], head, dist)
        r2, dist = head_values(params["r2"], head, dist)
        return kernel(dist, r1, r2, variant=self.variant)

    def bias(self, params, q_positions, k_positions, *, q=None):
        return bias_from_elementwise(self, params, q_positions, k_positions,
                                     num_heads=self.num_heads)
