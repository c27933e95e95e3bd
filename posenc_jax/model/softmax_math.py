"""The online-softmax numerics every attention path shares (blockwise, explicit, the kernels).

One rule, written once (Milakov & Gimelshein 2018; Dao et al. 2022). For a block of logits s
(masked entries already `NEG`) and the running row state m (max), l (normaliser), both
shaped like s with its last axis kept as 1:

    m' = max(m, rowmax(s));   p = exp(s - m') (0 where masked);   alpha = exp(m - m')
    l' = alpha l + rowsum(p);  acc' = alpha acc + p v            (the caller's p v)

and at the end `normalise(acc, l)` = acc / l, with 0 for a row that saw no key (l == 0:
zeros, never NaN); `log_normaliser(m, l)` = m + log l (the lse the backward pass uses), 0
for such a row. A learned sink logit (gpt-oss) joins every row's denominator as one more
logit whose value vector is zero: the state then starts at (m, l) = (sink, 1) instead of
(NEG, 0) (`start`), and lse includes it. `NEG` is a finite "minus infinity": exp(NEG - m) underflows to 0, never NaN.

All of it is float32 and elementwise / row reductions over the last axis, so the same
functions run inside a Pallas kernel ([bq, bk] blocks) and in plain JAX ([..., bq, bk]).
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["NEG", "log_normaliser", "normalise", "online_max", "online_step", "start"]

NEG = -1e30
F32 = jnp.float32


def start(shape: tuple, sink=None):
    """(m, l) float32 of `shape` ([..., n, 1]) before any key: (NEG, 0), or (sink, 1) with a
    sink logit (broadcastable to `shape`): exp(sink - m) enters the normaliser once."""
    if sink is None:
        return jnp.full(shape, NEG, F32), jnp.zeros(shape, F32)
    return jnp.broadcast_to(jnp.asarray(sink, F32), shape), jnp.ones(shape, F32)


def online_max(m, s, keep=None):
    """The online step without the normaliser: (m', p, alpha), float32, for a caller that
    sums p itself (the blockwise loop gets rowsum(p) from its p v dot). Arguments as
    `online_step`."""
    m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
    p = jnp.exp(s - m_new)
    if keep is not None:
        p = jnp.where(keep, p, F32(0.0))
    return m_new, p, jnp.exp(m - m_new)


def online_step(m, l, s, keep=None):
    """One block of the online softmax: (m', l', p, alpha), float32.

    Args:
      m, l: the running max and normaliser, [..., n, 1].
      s: float32 logits [..., n, bk], NEG where masked.
      keep: bool [..., n, bk] (broadcastable) or None: p is 0 where not kept.
    """
    m_new, p, alpha = online_max(m, s, keep)
    return m_new, alpha * l + jnp.sum(p, axis=-1, keepdims=True), p, alpha


def normalise(acc, l):
    """acc / l where l > 0, else 0 (a row that sees no key gives zeros). l: [..., n, 1]."""
    seen = l > 0
    return jnp.where(seen, acc / jnp.where(seen, l, F32(1.0)), F32(0.0))


def log_normaliser(m, l):
    """m + log(l) where l > 0, else 0: the row's log-sum-exp, [..., n, 1] float32."""
    seen = l > 0
    return jnp.where(seen, m + jnp.log(jnp.where(seen, l, F32(1.0))), F32(0.0))
