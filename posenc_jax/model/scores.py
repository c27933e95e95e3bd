"""What enters the attention scores besides q.k: the visibility mask and the encoding's bias.

Shared by every attention implementation (dense, blockwise, the kernels), so that they agree
by construction. Every mask is built from explicit arrays, never from an implied arange.

Shapes: B batch, Lq / Lk query / key lengths, H query heads, D head dim.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from posenc_jax.checks import integer, integer_array, positive_int
from posenc_jax.encodings.base import Encoding
from posenc_jax.encodings.capabilities import QueryBias, RowBias

__all__ = ["as_2d", "build_mask", "check_local", "check_sinks", "encoding_bias",
           "split_positions"]

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
    with `axes` axes (`capabilities.position_axes`).

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


def check_local(*, window: Any = None, chunk_size: Any = None, sink_tokens: Any = 0
                ) -> tuple[int | None, int | None, int]:
    """(window, chunk_size, sink_tokens) validated: None or a positive int each, and an int
    >= 0. TypeError / ValueError naming the key and the value."""
    window = None if window is None else positive_int("window", window)
    chunk_size = None if chunk_size is None else positive_int("chunk_size", chunk_size)
    return window, chunk_size, integer("sink_tokens", sink_tokens, minimum=0)


def check_sinks(sinks: Any, num_heads: int) -> Array | None:
    """The learned sink logits as a float [H] array (None stays None); TypeError for an
    integer array, ValueError for another shape, naming `sinks` and what is allowed."""
    if sinks is None:
        return None
    sinks = jnp.asarray(sinks)
    if not jnp.issubdtype(sinks.dtype, jnp.floating):
        raise TypeError(f"sinks must be a float array of shape [H={num_heads}], got dtype "
                        f"{sinks.dtype}")
    if sinks.shape != (num_heads,):
        raise ValueError(f"sinks must have shape [H={num_heads}] (one logit per query head), "
                         f"got shape {sinks.shape}")
    return sinks


def build_mask(q_positions: Array, k_positions: Array, *, causal: bool,
               q_segment_ids: Array | None = None, k_segment_ids: Array | None = None,
               k_mask: Array | None = None, window: int | None = None,
               chunk_size: int | None = None, sink_tokens: int = 0) -> Array | None:
    """Boolean [B|1, 1, Lq, Lk] visibility mask (True = attend), or None when all visible.

    All inputs are 2-D [B|1, L] (see `attend`). The local rules, from positions:
    `window` (None: unlimited): a key is visible only when `q_position - k_position < window`
    (HF Mistral / Gemma sliding window); `chunk_size` c (None: no chunks): only when
    `k_position // c == q_position // c` (Llama 4's chunked attention, floor division);
    `sink_tokens` k: keys with `k_position < k` are exempt from the window and the chunk
    (StreamingLLM's attention sinks; with neither rule there is nothing to exempt from).
    Causality, segments and the key mask apply to every key.
    """
    mask = None

    def both(a, b):
        return b if a is None else jnp.logical_and(a, b)

    qp, kp = q_positions[:, None, :, None], k_positions[:, None, None, :]
    if causal:
        mask = kp <= qp
    if q_segment_ids is not None:
        mask = both(mask, q_segment_ids[:, None, :, None] == k_segment_ids[:, None, None, :])
    if k_mask is not None:
        mask = both(mask, k_mask.astype(bool)[:, None, None, :])
    local = None
    if window is not None:
        local = qp - kp < window
    if chunk_size is not None:
        local = both(local, jnp.floor_divide(qp, chunk_size) == jnp.floor_divide(kp, chunk_size))
    if local is not None and sink_tokens:
        local = jnp.logical_or(local, kp < sink_tokens)
    return mask if local is None else both(mask, local)


def encoding_bias(encoding: Encoding, params: Any, q_positions: Array, k_positions: Array,
                  q_scaled: Array, num_heads: int, *, logits: Array | None = None
                  ) -> Array | None:
    """The encoding's bias as float32 [B|1, H, Lq, Lk] (None without a bias hook).

    `q_scaled` [B, Lq, H, D] is the query times the softmax scale (only read by `QueryBias`
    and `RowBias` schemes); `logits` float32 [B, H, Lq, Lk], the masked q.k logits, only read
    by a `RowBias` (and required for it). Raises ValueError when the bias's head count is not
    `num_heads`.
    """
    if "bias" not in encoding.hooks:
        return None
    if isinstance(encoding, RowBias):
        if logits is None:
            raise ValueError(f"encoding {encoding.name!r} reads whole rows of attention logits "
                             "(a RowBias); only dense attention provides them")
        bias = encoding.row_bias(params, q_positions, k_positions, q=q_scaled, logits=logits)
    elif isinstance(encoding, QueryBias):
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
