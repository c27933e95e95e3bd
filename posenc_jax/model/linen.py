"""Thin Flax Linen modules over the same pure hooks, for models written in Linen.

Each module builds an encoding with `posenc_jax.get(encoding, **hyperparams)`, keeps its
params (if any) in the Linen "params" collection under the name "pe", and calls one hook:

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, positions):                       # x [B, L, E], positions [B, L]
            x = PositionEmbedding("sinusoidal", {"embed_dim": 64})(x, positions)
            q, k = ...                                           # [B, L, H, D]
            q, k = Rotary({"head_dim": 16})(q, k, positions)
            bias = ScoreBias("alibi", {"num_heads": 4})(positions, positions)  # [B, H, L, L]

Shapes: B batch, L length, H heads, D head dim, E embed dim.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.core import unfreeze

from posenc_jax.encodings.base import Encoding, get
from posenc_jax.encodings.capabilities import QueryBias, RowBias

__all__ = ["PositionEmbedding", "Rotary", "ScoreBias"]

Array = jax.Array


def _build(module: nn.Module, name: str, hyperparams: Any) -> tuple[Encoding, Any]:
    """The encoding and its params (created in the "params" collection when it has any)."""
    encoding = get(name, **unfreeze(dict(hyperparams or {})))
    if jax.tree.leaves(jax.eval_shape(encoding.init, jax.random.key(0))):
        return encoding, module.param("pe", encoding.init)
    return encoding, {}


class PositionEmbedding(nn.Module):
    """Additive position embedding (`embed` hook): x [B, L, E] -> x + PE(positions).

    encoding: "sinusoidal" or "learned" (any scheme with an embed hook); hyperparams: e.g.
    {"embed_dim": E, "max_len": 2048} for "learned".
    """

    encoding: str = "sinusoidal"
    hyperparams: Any = None

    @nn.compact
    def __call__(self, x: Array, positions: Array) -> Array:
        enc, params = _build(self, self.encoding, self.hyperparams)
        return enc.embed(params, x, positions)


class Rotary(nn.Module):
    """Rotary embedding of q [B, Lq, H, D] and k [B, Lk, K, D] (`rotate` hook).

    hyperparams: those of `posenc_jax.get("rope", ...)`, e.g. {"head_dim": 64, "scaling":
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}}.
    k_positions defaults to q_positions (self-attention).
    """

    hyperparams: Any = None
    encoding: str = "rope"

    @nn.compact
    def __call__(self, q: Array, k: Array, q_positions: Array,
                 k_positions: Array | None = None) -> tuple[Array, Array]:
        enc, params = _build(self, self.encoding, self.hyperparams)
        k_positions = q_positions if k_positions is None else k_positions
        return enc.rotate(params, q, k, q_positions, k_positions)


class ScoreBias(nn.Module):
    """Additive attention-score bias (`bias` hook) of any scheme that declares one: "alibi",
    "t5", "kerple", "sandwich", "fire", "shaw", "cope", ...

    Returns float [B, H, Lq, Lk] ([H, Lq, Lk] for 1-D positions of a query-independent
    scheme). A `QueryBias` scheme ("shaw") needs q [B, Lq, H, D] already multiplied by the
    softmax scale; a `RowBias` scheme ("cope") needs q and `logits` float32 [B, H, Lq, Lk],
    the masked scaled logits q.k * scale (masked entries very negative). Either left out is a
    ValueError naming the argument.
    """

    encoding: str = "alibi"
    hyperparams: Any = None

    @nn.compact
    def __call__(self, q_positions: Array, k_positions: Array, q: Array | None = None,
                 logits: Array | None = None) -> Array:
        enc, params = _build(self, self.encoding, self.hyperparams)
        if "bias" not in enc.hooks:
            raise ValueError(f"encoding {self.encoding!r} has no bias hook; ScoreBias takes an "
                             f"encoding that declares one (e.g. 'alibi', 't5', 'shaw', 'cope')")
        if isinstance(enc, RowBias):
            if q is None or logits is None:
                raise ValueError(f"encoding {self.encoding!r} reads the query and whole rows of "
                                 "logits: call ScoreBias(...)(q_positions, k_positions, q=q * "
                                 "scale, logits=s)")
            return enc.row_bias(params, q_positions, k_positions, q=q, logits=logits)
        if isinstance(enc, QueryBias):
            if q is None:
                raise ValueError(f"encoding {self.encoding!r} reads the query: call "
                                 "ScoreBias(...)(q_positions, k_positions, q=q * scale)")
            return enc.bias(params, q_positions, k_positions, q=q)
        return jnp.asarray(enc.bias(params, q_positions, k_positions))
