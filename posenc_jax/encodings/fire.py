"""FIRE: functional interpolation for relative positions (Li, Yun, Qian, Chen, Sanghai,
Ainslie, Zaheer, Kumar & Bhojanapalli 2023, "Functional Interpolation for Relative Positions
Improves Long Context Transformers", ICLR 2024).

The bias of query position i and key position j is a small MLP of the log-transformed,
progressively normalised distance, one output per head:

    b(i, j) = f_theta( psi(|i - j|) / psi(max(i, L)) ),    psi(x) = log(c x + 1)

f_theta: R -> R^H is Linear(1, W) -> ReLU -> Linear(W, H) (W = `mlp_width` = 32), c > 0 a
learned scalar (init 0.1) and L = |L_mult * L0| a learned threshold (L0 = `init_length` =
512, L_mult init 1), exactly the paper's reference code (Appendix), which also adds eps = 1e-6
to the normaliser and takes |c x| inside the log; the MLP starts from PyTorch's default
Linear initialisation (U(+-1/sqrt(fan_in)) for weights and biases). Because the normaliser
grows with the query position, the MLP input stays in [0, 1] for causal attention at any
length ("progressive interpolation"): the bias is finite and well defined far past training.

Distances are exact integers cast to float32 once; psi uses log1p (the same function as
log(cx + 1), more accurate near 0).

`bias` evaluates the MLP on [..., Lq, Lk, W]; `elementwise_bias` evaluates one (query, key,
head) element with a static loop over the W hidden units (for kernels).

Shapes: B batch, H heads, Lq/Lk query/key lengths, W MLP width.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from posenc_jax.checks import finite_float, integer, integer_array, pair
from posenc_jax.encodings.base import Encoding, register
from posenc_jax.encodings.capabilities import ElementwiseBias, ParamAxes
from posenc_jax.encodings.relative import distance, head_values, same_rank

__all__ = ["EPS", "init", "mlp", "normalized_distance"]

Array = jax.Array
EPS = 1e-6


def init(key: Array, *, num_heads: int, mlp_width: int = 32, init_c: float = 0.1
         ) -> dict[str, Array]:
    """The paper's initial params: PyTorch-default MLP, c = init_c, L multiplier 1 (float32)."""
    num_heads = integer("num_heads", num_heads, minimum=1)
    mlp_width = integer("mlp_width", mlp_width, minimum=1)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    b2 = 1.0 / math.sqrt(mlp_width)

    def u(k, shape, bound):
        return jax.random.uniform(k, shape, jnp.float32, -bound, bound)

    return {"w1": u(k1, (mlp_width,), 1.0), "b1": u(k2, (mlp_width,), 1.0),
            "w2": u(k3, (mlp_width, num_heads), b2), "b2": u(k4, (num_heads,), b2),
            "c": jnp.asarray(init_c, jnp.float32), "L_mult": jnp.ones((), jnp.float32)}


def _psi(x: Array, c: Array) -> Array:
    return jnp.log1p(jnp.abs(c * x))


def normalized_distance(dist: Array, q_pos: Array, c, l_mult, *, init_length: float) -> Array:
    """psi(|i - j|) / (psi(max(i, |L_mult L0|)) + eps), elementwise (float32).

    dist: float32 |i - j|; q_pos: the query positions i broadcastable against it.
    """
    c = jnp.asarray(c, jnp.float32)
    threshold = jnp.abs(jnp.asarray(l_mult, jnp.float32) * jnp.float32(init_length))
    norm = jnp.maximum(jnp.asarray(q_pos).astype(jnp.float32), threshold)
    return _psi(dist, c) / (_psi(norm, c) + jnp.float32(EPS))


def mlp(x: Array, params) -> Array:
    """f_theta: float32 [...] -> [..., H] (Linear(1, W), ReLU, Linear(W, H))."""
    w1, b1 = (jnp.asarray(params[k], jnp.float32) for k in ("w1", "b1"))
    w2, b2 = (jnp.asarray(params[k], jnp.float32) for k in ("w2", "b2"))
    hidden = jax.nn.relu(x[..., None] * w1.reshape((1,) * x.ndim + (-1,))
                         + b1.reshape((1,) * x.ndim + (-1,)))                # [..., W]
    return jnp.einsum("...w,wh->...h", hidden, w2) + b2.reshape((1,) * x.ndim + (-1,))


@register("fire")
@dataclasses.dataclass(frozen=True)
class FIRE(Encoding, ElementwiseBias, ParamAxes):
    """FIRE (Li et al. 2023): `f_theta(psi(|i - j|) / psi(max(i, L)))`, psi(x) = log(cx + 1)."""

    hooks: ClassVar = frozenset({"bias"})
    param_axes: ClassVar = {"w2": (None, "heads"), "b2": ("heads",)}

    num_heads: int
    mlp_width: int = 32
    init_c: float = 0.1
    init_length: float = 512.0

    def __post_init__(self):
        integer("num_heads", self.num_heads, minimum=1)
        integer("mlp_width", self.mlp_width, minimum=1)
        finite_float("init_c", self.init_c, above=0.0)
        finite_float("init_length", self.init_length, above=0.0)

    def init(self, key):
        return init(key, num_heads=self.num_heads, mlp_width=self.mlp_width,
                    init_c=self.init_c)

    def bias(self, params, q_positions, k_positions, *, q=None):
        qp = integer_array("q_positions", q_positions).astype(jnp.int32)
        kp = integer_array("k_positions", k_positions).astype(jnp.int32)
        qb, kb = pair(qp, kp)                                               # [.., Lq, 1], [.., 1, Lk]
        x = normalized_distance(distance(qb, kb), qb, params["c"], params["L_mult"],
                                init_length=self.init_length)               # [..., Lq, Lk]
        return jnp.moveaxis(mlp(x, params), -1, -3)                         # [..., H, Lq, Lk]

    def elementwise_bias(self, params, q_positions, k_positions, head):
        dist = distance(q_positions, k_positions)
        qp, dist = same_rank(jnp.asarray(q_positions), dist)
        x = normalized_distance(dist, qp, params["c"], params["L_mult"],
                                init_length=self.init_length)
        out, x = head_values(params["b2"], head, x)
        w1, b1 = jnp.asarray(params["w1"], jnp.float32), jnp.asarray(params["b1"], jnp.float32)
        w2 = jnp.asarray(params["w2"], jnp.float32)
        for u in range(self.mlp_width):  # static loop over hidden units: elementwise only
            w2u, x = head_values(w2[u], head, x)
            out = out + jax.nn.relu(x * w1[u] + b1[u]) * w2u
        return out
