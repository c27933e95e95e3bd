"""Shaw et al. (2018) clipped relative position embeddings as an encoding.

The table and the score term live in `posenc_jax.encodings.relative`; this module is the scheme.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from posenc_jax.checks import integer
from posenc_jax.encodings.base import Encoding, check_model_dim, register
from posenc_jax.encodings.relative import shaw_bias, shaw_init


@register("shaw")
@dataclasses.dataclass(frozen=True)
class Shaw(Encoding):
    """Shaw et al. (2018) relative position embeddings: `2K + 1` learned vectors, the score
    term `q_i . a_{clip(j - i, -K, K)}` with K = `max_relative_position`."""

    bias_needs_query: ClassVar[bool] = True
    param_axes: ClassVar = {"table": ("table", "kv")}

    head_dim: int
    max_relative_position: int = 16

    def __post_init__(self):
        integer("max_relative_position", self.max_relative_position, minimum=1)
        integer("head_dim", self.head_dim, minimum=1)

    def init(self, key):
        return {"table": shaw_init(key, max_relative_position=self.max_relative_position,
                                            head_dim=self.head_dim)}

    def bias(self, params, q_positions, k_positions, *, q=None):
        if q is None:
            raise ValueError("shaw: the bias depends on the query; call bias(..., q=q) with the "
                             "scaled query [B, Lq, H, D]")
        return shaw_bias(params["table"], q, q_positions, k_positions,
                                  max_relative_position=self.max_relative_position)

    def check_model(self, *, embed_dim, num_heads, head_dim):
        check_model_dim(self.name, "head_dim", self.head_dim, head_dim)
