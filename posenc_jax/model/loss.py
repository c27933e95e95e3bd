"""Next-token cross-entropy from a model's hidden states, without the [B, L, V] logits.

    hidden = model.hidden_states(inputs, positions)               # [B, L, E]
    total, count = chunked_cross_entropy(model.head, hidden, targets, weights, chunk=1024)
    nll = token_nll(model.head, hidden, targets, chunk=1024)      # float32 [B, L]

At 32k tokens the logits of SmolLM2 (V = 49,152) are 6.4 GB in float32, and Gemma 3's (V =
262,144) 34 GB: more than the rest of a train step. Here the head is applied `chunk`
positions at a time inside a `lax.map`, each chunk's logits are reduced to one loss per
position at once, and the chunk body is rematerialised (`jax.checkpoint`), so the backward
pass recomputes a chunk's logits instead of keeping them: live memory is O(B * chunk * V)
whatever L is. Values and gradients equal `cross_entropy_sums(model.head(hidden), ...)` up to
float32 rounding (tests/model/test_loss.py).

`head` is any function [..., E] -> float32 [..., V] (`Transformer.head`: the tied or untied
projection and the logit soft-cap). Everything is float32 whatever the hidden dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from posenc_jax.checks import integer

__all__ = ["chunked_cross_entropy", "cross_entropy_sums", "token_nll"]

Array = jax.Array
Head = Callable[[Array], Array]


def _nll(logits: Array, targets: Array) -> Array:
    """-log softmax(logits)[target], float32 [...] for logits [..., V] and targets int [...]."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits, axis=-1) - picked


def cross_entropy_sums(logits: Array, targets: Array, weights: Array | None = None
                       ) -> tuple[Array, Array]:
    """(sum of w * CE, sum of w), float32 scalars, from full logits [B, L, V] and targets /
    weights [B, L] (weights None: all ones). The reference the chunked loss is tested against."""
    nll = _nll(logits, targets)
    w = jnp.ones_like(nll) if weights is None else weights.astype(jnp.float32)
    return jnp.sum(nll * w), jnp.sum(w)


def _chunks(x: Array, chunk: int) -> Array:
    """[B, L, ...] -> [N, B, chunk, ...] with L padded (zeros) to N * chunk."""
    b, length = x.shape[:2]
    pad = -length % chunk
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape(b, (length + pad) // chunk, chunk, *x.shape[2:])
    return jnp.moveaxis(x, 1, 0)


def _check(hidden: Array, targets: Array, chunk: int) -> int:
    chunk = integer("chunk", chunk, minimum=1)
    if hidden.ndim != 3 or targets.shape != hidden.shape[:2]:
        raise ValueError(f"hidden must be [B, L, E] and targets [B, L], got hidden "
                         f"{hidden.shape} and targets {targets.shape}")
    if not jnp.issubdtype(targets.dtype, jnp.integer):
        raise TypeError(f"targets must be integer token ids, got dtype {targets.dtype}")
    return min(chunk, hidden.shape[1])


def token_nll(head: Head, hidden: Array, targets: Array, *, chunk: int = 1024) -> Array:
    """-log p(target) float32 [B, L] from hidden [B, L, E] and targets int [B, L], with the
    head applied `chunk` positions at a time (never [B, L, V] at once)."""
    chunk = _check(hidden, targets, chunk)
    length = hidden.shape[1]

    @jax.checkpoint
    def one(args):
        h, t = args
        return _nll(head(h), t)

    out = jax.lax.map(one, (_chunks(hidden, chunk), _chunks(targets, chunk)))  # [N, B, c]
    return jnp.moveaxis(out, 0, 1).reshape(hidden.shape[0], -1)[:, :length]


def chunked_cross_entropy(head: Head, hidden: Array, targets: Array,
                          weights: Array | None = None, *, chunk: int = 1024
                          ) -> tuple[Array, Array]:
    """(sum of w * CE, sum of w), float32 scalars, as `cross_entropy_sums(head(hidden), ...)`
    but `chunk` positions at a time: hidden [B, L, E], targets int [B, L], weights [B, L] or
    None (all ones). Padded positions of the last chunk carry weight 0."""
    nll = token_nll(head, hidden, targets, chunk=chunk)
    w = jnp.ones_like(nll) if weights is None else weights.astype(jnp.float32)
    if w.shape != nll.shape:
        raise ValueError(f"weights must be [B, L] = {nll.shape}, got {w.shape}")
    return jnp.sum(nll * w), jnp.sum(w)
