"""Shaw et al. (2018) clipped relative position embeddings as an encoding.

The tables, the score term and the value term live in `posenc_jax.encodings.relative`; this
module is the scheme.

Shaw, Uszkoreit & Vaswani (2018), "Self-Attention with Relative Position Representations",
eqs. (3)-(4), with r(i, j) = clip(j - i, -K, K):

    e_ij = (x_i W^Q) . (x_j W^K + a^K_ij) / sqrt(d_z)        (the `bias` hook: q_i . a^K)
    z_i  = sum_j alpha_ij (x_j W^V + a^V_ij)                  (`value=True`: the `value_term`)

a^K and a^V are 2K + 1 learned vectors of width D each, shared across heads (as in the paper),
drawn from N(0, 0.02^2).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax

from posenc_jax.checks import boolean, integer
from posenc_jax.encodings.base import Encoding, register
from posenc_jax.encodings.capabilities import ParamAxes, QueryBias, ValueTerm
from posenc_jax.encodings.relative import shaw_bias, shaw_init, shaw_value_term

__all__ = ["Shaw", "ShawValue"]


@register("shaw")
@dataclasses.dataclass(frozen=True)
class Shaw(Encoding, QueryBias, ParamAxes):
    """Shaw et al. (2018) relative position embeddings: `2K + 1` learned vectors, the score
    term `q_i . a_{clip(j - i, -K, K)}` with K = `max_relative_position`; with `value=True`
    also the output term `sum_j p_ij a^V_{clip(j - i, -K, K)}`.

    `Shaw(..., value=True)` (and `posenc_jax.get("shaw", ..., value=True)`) builds a
    `ShawValue`, the same scheme with the `ValueTerm` capability, so that whether the scheme
    has a value term is its type's answer, as for every capability.
    """

    hooks: ClassVar = frozenset({"bias"})
    param_axes: ClassVar = {"table": ("table", "kv"), "value_table": ("table", "kv")}

    head_dim: int
    max_relative_position: int = 16
    value: bool = False

    def __new__(cls, *args, **kwargs):
        chosen = cls
        if cls in (Shaw, ShawValue):  # `value` (the third field) picks the class
            value = args[2] if len(args) > 2 else kwargs.get("value", cls is ShawValue)
            chosen = ShawValue if value is True else Shaw
        return super().__new__(chosen)

    def __post_init__(self):
        integer("max_relative_position", self.max_relative_position, minimum=1)
        integer("head_dim", self.head_dim, minimum=1)
        boolean("value", self.value)

    def init(self, key):
        out = {"table": shaw_init(key, max_relative_position=self.max_relative_position,
                                  head_dim=self.head_dim)}
        if self.value:
            out["value_table"] = shaw_init(jax.random.fold_in(key, 1), head_dim=self.head_dim,
                                           max_relative_position=self.max_relative_position)
        return out

    def bias(self, params, q_positions, k_positions, *, q=None):
        if q is None:
            raise ValueError("shaw: the bias depends on the query; call bias(..., q=q) with the "
                             "scaled query [B, Lq, H, D]")
        return shaw_bias(params["table"], q, q_positions, k_positions,
                         max_relative_position=self.max_relative_position)


@dataclasses.dataclass(frozen=True)
class ShawValue(Shaw, ValueTerm):
    """Shaw et al. with `value=True`: also the value term a^V (see `Shaw`)."""

    value: bool = True

    def value_term(self, params, weights, q_positions, k_positions):
        return shaw_value_term(params["value_table"], weights, q_positions, k_positions,
                               max_relative_position=self.max_relative_position)
