"""The rotary base frequencies, the one piece of math that RoPE, its scaling methods and the
sinusoidal table share (a floor below all three, so none of them imports another for it), and
the two maps from frequencies to frequencies that act after any scaling method:

    truncate(inv_freq, fraction=p)   p-RoPE (Barbero et al. 2024, "Round and Round We Go! What
                                     makes Rotary Positional Encodings useful?"): keep the
                                     floor(p R) highest frequencies, set the lowest to 0 (those
                                     pairs are not rotated). p = 1 is RoPE, p = 0 is NoPE. Gemma
                                     4's `proportional` rope type is the same map.
    resonance(inv_freq)              Resonance RoPE (Wang et al. 2024, "Resonance RoPE:
                                     Improving Context Length Generalization of Large Language
                                     Models"): theta~_i = 2 pi / round(2 pi / theta_i), every
                                     wavelength rounded to an integer number of positions.

Precision: the frequencies depend only on static hyperparameters, so they are computed on the
host in float64 and rounded ONCE to float32. The exponent 2i / d is first rounded to float32,
as transformers computes it (`arange(0, d, 2).float() / d`, a correctly rounded division), so
that a checkpoint's angles are reproduced; the power and the reciprocal are then exact to
float64. Computed in float32 on device instead, XLA:CPU turns `/ d` into a multiplication by
the reciprocal (exponents 1 ulp off for d = 80, 96, ...), and `base ** e` and the scaling
methods amplify that to several 1e-6 relative; see tests/encodings/test_hf_fuzz.py.

Shapes: R = rotary_dim // 2 frequencies.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.checks import finite_float, integer

__all__ = ["inv_freq", "inv_freq_float64", "kept_frequencies", "resonance", "truncate"]


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


def kept_frequencies(num_freq: int, *, fraction: float) -> int:
    """How many of R frequencies p-RoPE keeps: floor(p R), as Gemma 4's `proportional` type
    (`int(partial_rotary_factor * head_dim // 2)`).

    Raises:
      TypeError / ValueError: fraction not a number in [0, 1].
    """
    fraction = finite_float("fraction", fraction, minimum=0.0, maximum=1.0)
    return int(fraction * (2 * num_freq) // 2)


def truncate(inv_freq, *, fraction: float):
    """p-RoPE: the first floor(p R) frequencies (the highest) kept, the others set to 0.

    theta_i for i < floor(p R), else 0. A zero frequency leaves its feature pair unrotated,
    for every position and every scaling method (scalings multiply frequencies). [R] -> [R]:
    a host NumPy array stays NumPy float64 (the scaling methods' static path), anything else
    becomes float32 JAX. The one implementation of the map: RoPE's `p_rope` and the
    `proportional` scaling method (Gemma 4) both call it.
    """
    if isinstance(inv_freq, np.ndarray):
        inv, xp = inv_freq.astype(np.float64), np
    else:
        inv, xp = jnp.asarray(inv_freq, jnp.float32), jnp
    keep = kept_frequencies(inv.shape[0], fraction=fraction)
    return xp.where(np.arange(inv.shape[0]) < keep, inv, xp.zeros((), inv.dtype))


def resonance(inv_freq):
    """Resonance RoPE: theta~_i = 2 pi / round(2 pi / theta_i); zero frequencies stay zero.

    Every wavelength becomes an integer (at least 1 position), so the feature takes the same
    values at positions p and p + wavelength: positions beyond the training length repeat
    the rotations seen in training for these features. Applied to the final frequencies, it
    stacks with any scaling method (the paper pairs it with YaRN). [R] -> [R], NumPy float64
    or float32 JAX as `truncate`.
    """
    if isinstance(inv_freq, np.ndarray):
        inv, xp = inv_freq.astype(np.float64), np
    else:
        inv, xp = jnp.asarray(inv_freq, jnp.float32), jnp
    two_pi = inv.dtype.type(2.0 * math.pi)
    safe = xp.where(inv > 0, inv, xp.ones((), inv.dtype))
    wavelength = xp.maximum(xp.round(two_pi / safe), xp.ones((), inv.dtype))
    return xp.where(inv > 0, two_pi / wavelength, xp.zeros((), inv.dtype))
