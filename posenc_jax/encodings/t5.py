"""The T5 relative-position bias as an encoding (Raffel et al. 2020).

The bucketing and the table live in `posenc_jax.encodings.relative`; this module is the scheme.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from posenc_jax.checks import integer, integer_array
from posenc_jax.encodings.base import Encoding, register
from posenc_jax.encodings.capabilities import ElementwiseBias, ParamAxes, bias_from_elementwise
from posenc_jax.encodings.lookup import take_row_head
from posenc_jax.encodings.relative import saturating_difference, t5_bucket, t5_init


@register("t5")
@dataclasses.dataclass(frozen=True)
class T5Bias(Encoding, ElementwiseBias, ParamAxes):
    """T5's learned bias per head over log-spaced relative-position buckets (Raffel et al.)."""

    hooks: ClassVar = frozenset({"bias"})
    param_axes: ClassVar = {"table": ("table", "heads")}

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = False

    def __post_init__(self):
        integer("num_heads", self.num_heads, minimum=1)
        t5_bucket(jnp.zeros((1,), jnp.int32), bidirectional=self.bidirectional,
                           num_buckets=self.num_buckets, max_distance=self.max_distance)

    def init(self, key):
        return {"table": t5_init(key, num_buckets=self.num_buckets,
                                          num_heads=self.num_heads)}

    def bias(self, params, q_positions, k_positions, *, q=None):
        table = jnp.asarray(params["table"])
        if table.ndim != 2 or table.shape != (self.num_buckets, self.num_heads):
            raise ValueError(f"T5 table must be [num_buckets={self.num_buckets}, "
                             f"H={self.num_heads}], got shape {table.shape}")
        integer_array("q_positions", q_positions)
        integer_array("k_positions", k_positions)
        return bias_from_elementwise(self, params, q_positions, k_positions,
                                     num_heads=self.num_heads).astype(table.dtype)

    def elementwise_bias(self, params, q_positions, k_positions, head):
        """table[bucket(k - q), head]: the bucket computed from the block's positions."""
        rel = saturating_difference(k_positions, q_positions)  # never wraps to a near key
        bucket = t5_bucket(rel, bidirectional=self.bidirectional,
                           num_buckets=self.num_buckets, max_distance=self.max_distance)
        return take_row_head(params["table"], bucket, head)
