"""The rotary base frequencies, the one piece of math that RoPE, its scaling methods and the
sinusoidal table share (a floor below all three, so none of them imports another for it).

Shapes: R = rotary_dim // 2 frequencies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc_jax.checks import finite_float, integer

__all__ = ["inv_freq"]

def inv_freq(rotary_dim: int, *, base: float = 10000.0) -> jax.Array:
    """Inverse frequencies 1 / base^(2i / rotary_dim), i = 0..R-1: float32 [R = rotary_dim // 2].

    Raises:
      ValueError: odd rotary_dim, rotary_dim < 2, or base <= 0.
    """
    rotary_dim = integer("rotary_dim", rotary_dim)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even and >= 2, got rotary_dim={rotary_dim}")
    base = finite_float("base", base, above=0)
    exponents = jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / jnp.float32(rotary_dim)
    return 1.0 / (jnp.float32(base) ** exponents)
