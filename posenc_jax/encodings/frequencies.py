"""The rotary base frequencies, the one piece of math that RoPE, its scaling methods and the
sinusoidal table share (a floor below all three, so none of them imports another for it).

Precision: the frequencies depend only on static hyperparameters, so they are computed on the
host in float64 and rounded ONCE to float32. The exponent 2i / d is first rounded to float32,
as transformers computes it (`arange(0, d, 2).float() / d`, a correctly rounded division), so
that a checkpoint's angles are reproduced; the power and the reciprocal are then exact to
float64. Computed in float32 on device instead, XLA:CPU turns `/ d` into a multiplication by
the reciprocal (exponents 1 ulp off for d = 80, 96, ...), and `base ** e` and the scaling
methods amplify that to several 1e-6 relative; see tests/test_hf_fuzz.py.

Shapes: R = rotary_dim // 2 frequencies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.checks import finite_float, integer

__all__ = ["inv_freq", "inv_freq_float64"]


def _check(rotary_dim, base) -> tuple[int, float]:
    rotary_dim = integer("rotary_dim", rotary_dim)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even and >= 2, got rotary_dim={rotary_dim}")
    return rotary_dim, finite_float("base", base, above=0)


def _powers(num: int, dim: int, base: float) -> np.ndarray:
    """1 / base^e_i in float64 for the float32-rounded exponents e_i = fl32(2i / dim), i < num."""
    exponents = np.arange(0, 2 * num, 2, dtype=np.float32) / np.float32(dim)   # fl32(2i / d)
    return 1.0 / np.power(np.float64(base), exponents.astype(np.float64))


def inv_freq_float64(rotary_dim: int, *, base: float = 10000.0) -> np.ndarray:
    """1 / base^(2i / rotary_dim), i = 0..R-1, as a host float64 NumPy array [R].

    Raises:
      TypeError: rotary_dim not an int. ValueError: odd rotary_dim, rotary_dim < 2, base <= 0.
    """
    rotary_dim, base = _check(rotary_dim, base)
    return _powers(rotary_dim // 2, rotary_dim, base)


def inv_freq(rotary_dim: int, *, base: float = 10000.0) -> jax.Array:
    """Inverse frequencies 1 / base^(2i / rotary_dim), i = 0..R-1: float32 [R = rotary_dim // 2],
    computed in float64 on the host and rounded once (module docstring).

    Raises:
      ValueError: odd rotary_dim, rotary_dim < 2, or base <= 0.
    """
    return jnp.asarray(inv_freq_float64(rotary_dim, base=base).astype(np.float32))
