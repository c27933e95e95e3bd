"""CoPE: contextual position encoding (Golovneva, Wang, Weston & Sukhbaatar 2024,
"Contextual Position Encoding: Learning to Count What's Important").

Positions are counts of gated keys rather than token indices. For query i and key j, with
the attention logit s_ij = q_i . k_j / sqrt(d) (masked keys at -inf, so their gate is 0):

    g_ij = sigmoid(s_ij)                         gate: does key j count for query i?
    p_ij = sum_{t = j}^{i} g_it                  contextual position of j seen from i
    p_ij <- min(p_ij, p_max - 1)                 (`npos_max` = p_max learned embeddings)
    e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]     interpolation
    a_ij = s_ij + q_i . e[p_ij]                  the logit CoPE adds (no 1/sqrt(d) on q . e)

computed as in the paper's code: z_i[n] = q_i . e[n] for the p_max integer positions first
([B, H, Lq, p_max]), then interpolated between z_i[floor p] and z_i[ceil p]. The embeddings
e[n] (width D, shared across heads, one table per layer) start at zero, as in the paper.
p_ij is a reverse cumulative sum over the key axis in slot order: keys must be stored in
position order (a KV cache and packed sequences are); under a causal mask that is the paper's
sum from j to i. p is non-decreasing towards earlier keys and differentiable in the gates
through the interpolation weight p - floor p.

CoPE reads whole rows of logits (a `RowBias`), so only dense attention supports it:
blockwise attention and the kernels raise ValueError naming the alternative.

Shapes: B batch, H heads, Lq/Lk query/key lengths, D head dim, P = npos_max.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from posenc_jax.checks import integer, integer_array
from posenc_jax.encodings.base import Encoding, register
from posenc_jax.encodings.capabilities import ParamAxes, RowBias

__all__ = ["bias", "positions"]

Array = jax.Array


def positions(logits, *, npos_max: int) -> Array:
    """Contextual positions p_ij = min(sum_{t >= j} sigmoid(s_it), P - 1): float32 [..., Lk].

    logits: float [..., Lq, Lk] with masked entries very negative (gate 0); the sum runs over
    the key axis from j to its end (slot order = position order).
    """
    gates = jax.nn.sigmoid(jnp.asarray(logits, jnp.float32))
    p = jnp.flip(jnp.cumsum(jnp.flip(gates, -1), axis=-1), -1)
    return jnp.minimum(p, jnp.float32(npos_max - 1))


def bias(pos_emb, q, logits) -> Array:
    """The CoPE logit term q_i . e[p_ij] (interpolated): float32 [B, H, Lq, Lk].

    Args:
      pos_emb: [P, D] position embeddings e[0 .. P-1].
      q: [B, Lq, H, D] queries (unscaled, as the paper's code).
      logits: float [B, H, Lq, Lk] attention logits, masked entries very negative.
    """
    pos_emb = jnp.asarray(pos_emb, jnp.float32)
    p = positions(logits, npos_max=pos_emb.shape[0])                       # [B, H, Lq, Lk]
    z = jnp.einsum("bqhd,nd->bhqn", jnp.asarray(q, jnp.float32), pos_emb)  # [B, H, Lq, P]
    lo = jnp.floor(p)
    w = p - lo
    lo = lo.astype(jnp.int32)
    hi = jnp.ceil(p).astype(jnp.int32)
    z_lo = jnp.take_along_axis(z, lo, axis=-1)
    z_hi = jnp.take_along_axis(z, hi, axis=-1)
    return z_hi * w + z_lo * (1.0 - w)


@register("cope")
@dataclasses.dataclass(frozen=True)
class CoPE(Encoding, RowBias, ParamAxes):
    """Contextual position encoding (Golovneva et al. 2024): gated counts, interpolated
    embeddings; dense attention only (a `RowBias`: its plain `bias` hook refuses)."""

    hooks: ClassVar = frozenset({"bias"})
    param_axes: ClassVar = {"pos_emb": ("table", "kv")}

    head_dim: int
    npos_max: int = 64

    def __post_init__(self):
        integer("head_dim", self.head_dim, minimum=1)
        integer("npos_max", self.npos_max, minimum=2)

    def init(self, key):
        del key
        return {"pos_emb": jnp.zeros((self.npos_max, self.head_dim), jnp.float32)}

    def bias(self, params, q_positions, k_positions, *, q=None):
        raise ValueError("cope: the bias reads the query and whole rows of attention logits; "
                         "call row_bias(..., q=q_scaled, logits=s) (dense attention does)")

    def row_bias(self, params, q_positions, k_positions, *, q, logits):
        integer_array("q_positions", q_positions), integer_array("k_positions", k_positions)
        q_unscaled = jnp.asarray(q, jnp.float32) * jnp.float32(math.sqrt(self.head_dim))
        return bias(params["pos_emb"], q_unscaled, logits)
