"""What enters the attention scores besides q.k: the visibility mask and the encoding's bias.

Shared by every attention implementation (dense, blockwise, the kernels), so that they agree
by construction. Every mask is built from explicit arrays, never from an implied arange.

Shapes: B batch, Lq / Lk query / key lengths, H query heads, D head dim.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from posenc_jax.checks import integer_array
from posenc_jax.encodings.base import Encoding

__all__ = ["as_2d", "build_mask", "check_capabilities", "encoding_bias", "split_positions"]

Array = jax.Array


def as_2d(x, length: int, batch: int, what: str) -> Array | None:
    """[L] or [B|1, L] -> [B|1, L] (None stays None)."""
    if x is None:
        return None
    x = jnp.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] != length or x.shape[0] not in (1, batch):
        raise ValueError(f"{what} must have shape [{length}] or [B={batch}, {length}], "
                         f"got shape {x.shape}")
    return x


def split_positions(positions, axes: int, length: int, batch: int, *, offset=0):
    """(mask positions [B|1, L], rotary positions) for a model whose encodings take positions
    with `axes` axes (`Encoding.position_axes`).

    [L] or [B|1, L]: both are the given positions. [axes, B|1, L] (axes > 1, e.g. multimodal
    RoPE's temporal/height/width): the rotary positions are as given and the masks follow the
    token order, `offset + arange(L)` (transformers' cache_position).
    """
    positions = integer_array("positions", positions)  # refuses floats and host ints JAX would wrap
    if positions.ndim != 3:
        positions = as_2d(positions, length, batch, "positions")
        return positions, positions
    if axes == 1:
        raise ValueError(f"positions of shape {positions.shape} have 3 axes, but this model's "
                         "encodings take positions [L] or [B, L] (position_axes=1)")
    if positions.shape[0] != axes or positions.shape[2] != length or positions.shape[1] not in (
            1, batch):
        raise ValueError(f"positions must have shape [{length}], [B={batch}, {length}] or "
                         f"[{axes}, B={batch}, {length}], got shape {positions.shape}")
    order = offset + jnp.arange(length, dtype=jnp.int32)[None, :]
    return order, positions


def build_mask(q_positions: Array, k_positions: Array, *, causal: bool,
               q_segment_ids: Array | None = None, k_segment_ids: Array | None = None,
               k_mask: Array | None = None, window: int | None = None) -> Array | None:
    """Boolean [B|1, 1, Lq, Lk] visibility mask (True = attend), or None when all visible.

    All inputs are 2-D [B|1, L] (see `attend`). `window` W (a sliding window, None for none):
    a key is visible only if `q_position - k_position < W`.
    """
    mask = None

    def both(a, b):
        return b if a is None else jnp.logical_and(a, b)

    if causal:
        mask = k_positions[:, None, None, :] <= q_positions[:, None, :, None]
    if window is not None:
        mask = both(mask, q_positions[:, None, :, None] - k_positions[:, None, None, :] < window)
    if q_segment_ids is not None:
        mask = both(mask, q_segment_ids[:, None, :, None] == k_segment_ids[:, None, None, :])
    if k_mask is not None:
        mask = both(mask, k_mask.astype(bool)[:, None, None, :])
    return mask


def check_capabilities(encoding: Encoding, *, implementation: str, causal: bool) -> None:
    """ValueError when the encoding's declared capabilities exclude this attention: a bias
    that `needs_full_rows` outside dense attention, a `causal_only` scheme without the mask."""
    if encoding.needs_full_rows and implementation not in ("dense", "auto"):
        raise ValueError(f"encoding {encoding.name!r} reads whole rows of attention logits "
                         f"(needs_full_rows), which attention={implementation!r} never has; use "
                         "attention='dense'")
    if encoding.causal_only and not causal:
        raise ValueError(f"encoding {encoding.name!r} is defined for causal attention only; got "
                         "causal=False (use causal=True or another encoding)")


def encoding_bias(encoding: Encoding, params: Any, q_positions: Array, k_positions: Array,
                  q_scaled: Array, num_heads: int, *, logits: Array | None = None
                  ) -> Array | None:
    """The encoding's bias as float32 [B|1, H, Lq, Lk] (None without a bias hook).

    `q_scaled` [B, Lq, H, D] is the query times the softmax scale (only read by schemes with
    `bias_needs_query`); `logits` float32 [B, H, Lq, Lk], the masked q.k logits, only read by
    schemes with `needs_full_rows` (and required for them). Raises ValueError when the bias's
    head count is not `num_heads`.
    """
    if not encoding.has_bias:
        return None
    if encoding.needs_full_rows:
        if logits is None:
            raise ValueError(f"encoding {encoding.name!r} reads whole rows of attention logits "
                             "(needs_full_rows); only dense attention provides them")
        bias = encoding.bias(params, q_positions, k_positions, q=q_scaled, logits=logits)
    elif encoding.bias_needs_query:
        bias = encoding.bias(params, q_positions, k_positions, q=q_scaled)
    else:
        bias = encoding.bias(params, q_positions, k_positions)
    if bias is None:
        return None
    if bias.ndim == 3:
        bias = bias[None]
    if bias.ndim != 4:
        raise ValueError(f"encoding {encoding.name!r} returned a bias of shape {bias.shape}; "
                         "expected [B, H, Lq, Lk] or [H, Lq, Lk]")
    if bias.shape[1] != num_heads:
        raise ValueError(f"encoding {encoding.name!r} gives a bias with {bias.shape[1]} heads "
                         f"but the attention scores have num_heads={num_heads} heads")
    return bias.astype(jnp.float32)
