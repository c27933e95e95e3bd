"""The RoPE scaling methods as pure functions: base frequencies -> scaled frequencies.

Every method is `method(inv_freq, *, hyperparameters) -> (inv_freq, attention_factor)` on the
plain RoPE frequencies `inv_freq = base^(-2i / d)` (float32 [R], R = d / 2, d = rotary_dim).
`attention_factor` multiplies both cos and sin, as Hugging Face applies it, so attention
logits scale by its square; it depends on hyperparameters only and is returned as a concrete
NumPy float32 scalar (never a tracer, even under jit). Hyperparameters carry Hugging Face's
names. The registry (`registry.py`) holds one record per method naming these functions.

    linear     inv_freq / factor                                 (Chen et al. 2023, PI)
    ntk        base -> base * factor^(d / (d - 2))               (NTK-aware, static)
    dynamic    base -> base * (factor s / L0 - (factor - 1))^(d / (d - 2)) for s > L0,
               plain RoPE for s <= L0 (s = current length, L0 = original length)
    yarn       per-frequency ramp between extrapolation (wavelengths shorter than
               L0 / beta_fast: untouched) and interpolation (longer than L0 / beta_slow:
               / factor); attention factor 0.1 ln(factor) + 1    (Peng et al. 2023)
    longrope   inv_freq / short_factor (s <= L0) or / long_factor (s > L0); attention
               factor sqrt(1 + ln(factor) / ln(L0))              (Ding et al. 2024)
    llama3     / factor for wavelengths > L0 / low_freq_factor, untouched below
               L0 / high_freq_factor, a smooth blend between      (Llama 3.1); equal
               low / high factors (Llama 4 Scout) make it a step at L0 / low_freq_factor
    proportional  frequencies over the whole head dim, the lowest-frequency pairs set to 0
               (p-RoPE; Gemma 4): `partial_rotary_factor` says how many pairs rotate

Precision: frequencies that depend only on static hyperparameters are computed on the host in
float64 (every method keeps float64 NumPy input so) and rounded once to float32 by `_out`;
only a traced `seq_len` (dynamic NTK, LongRoPE's choice under jit) runs in float32 on device.
See `posenc_jax.encodings.frequencies`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.checks import finite_float
from posenc_jax.encodings.frequencies import truncate

__all__ = [
    "default",
    "dynamic",
    "get_mscale",
    "linear",
    "llama3",
    "longrope",
    "ntk",
    "proportional",
    "yarn",
    "yarn_attention_factor",
    "yarn_ramp",
]

Array = jax.Array
Result = tuple[Array, np.float32]  # (inv_freq float32 [R], attention_factor float32 [])


def _out(inv_freq, attention_factor=1.0) -> Result:
    # The attention factor depends on hyperparameters only, never on traced values: keep it a
    # concrete NumPy float32 scalar, so callers may branch on it (== 1.0) even under jit.
    # Host float64 frequencies are rounded to float32 here, once.
    if isinstance(inv_freq, np.ndarray):
        inv_freq = inv_freq.astype(np.float32)
    return jnp.asarray(inv_freq, jnp.float32), np.float32(attention_factor)


def _freqs(inv_freq):
    """Host float64 NumPy frequencies stay so (static math, rounded once by `_out`); anything
    else becomes a float32 JAX array."""
    if isinstance(inv_freq, np.ndarray):
        return inv_freq.astype(np.float64)
    return jnp.asarray(inv_freq, jnp.float32)


def _xp(x):
    return np if isinstance(x, np.ndarray) else jnp


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check_factor(factor: float) -> float:
    return finite_float("factor", factor, minimum=1)


def default(inv_freq) -> Result:
    """Plain RoPE: `(inv_freq, 1.0)`."""
    return _out(inv_freq)


def linear(inv_freq, *, factor: float) -> Result:
    """Position interpolation: RoPE at positions / factor. inv_freq float32 [R] -> [R]."""
    return _out(_freqs(inv_freq) / _check_factor(factor))


def _ntk_scale(num_freq: int, growth, xp=jnp) -> Array:
    """growth^(-2i / (d - 2)) for i < R = d / 2: the effect of base -> base * growth^(d/(d-2)).
    xp=np: host float64 (growth a concrete number)."""
    if num_freq < 2:
        raise ValueError(f"NTK scaling needs rotary_dim >= 4, got rotary_dim={2 * num_freq}")
    if xp is np:
        return np.power(float(growth), -np.arange(num_freq, dtype=np.float64) / (num_freq - 1))
    exponent = jnp.arange(num_freq, dtype=jnp.float32) / jnp.float32(num_freq - 1)
    return jnp.exp(-exponent * jnp.log(jnp.asarray(growth, jnp.float32)))


def ntk(inv_freq, *, factor: float) -> Result:
    """NTK-aware (static): base -> base * factor^(d / (d - 2)). inv_freq float32 [R] -> [R]."""
    inv_freq = _freqs(inv_freq)
    return _out(inv_freq * _ntk_scale(inv_freq.shape[0], _check_factor(factor), _xp(inv_freq)))


def dynamic(inv_freq, *, factor: float, original_max_position_embeddings: int,
            seq_len=None) -> Result:
    """Dynamic NTK: base -> base * (factor s / L0 - (factor - 1))^(d / (d - 2)), s = max(seq_len,
    L0); plain RoPE at or below L0 and for seq_len None. seq_len: int or traced int scalar.

    Note (as in Hugging Face): with factor == 1 the base still grows as (s / L0)^(d / (d - 2))
    past L0; factor == 1 is the identity only up to L0.
    """
    inv_freq = _freqs(inv_freq)
    _check_factor(factor)
    if seq_len is None:
        return _out(inv_freq)
    length = float(original_max_position_embeddings)
    if _xp(inv_freq) is np and _is_concrete(seq_len):  # host float64, as transformers' base
        s = max(float(np.max(np.asarray(seq_len))), length)
        return _out(inv_freq * _ntk_scale(inv_freq.shape[0], factor * s / length - (factor - 1),
                                          np))
    if _xp(inv_freq) is np:
        inv_freq = jnp.asarray(inv_freq.astype(np.float32))
    s = jnp.maximum(jnp.asarray(seq_len).astype(jnp.float32), jnp.float32(length))
    growth = jnp.float32(factor) * s / jnp.float32(length) - jnp.float32(factor - 1.0)
    return _out(inv_freq * _ntk_scale(inv_freq.shape[0], growth))


def get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature 0.1 * mscale * ln(scale) + 1 (1 for scale <= 1)."""
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(*, factor: float, mscale: float | None = None,
                          mscale_all_dim: float | None = None,
                          attention_factor: float | None = None) -> float:
    """Hugging Face's rule: explicit attention_factor, else get_mscale(factor, mscale) /
    get_mscale(factor, mscale_all_dim) when both are non-zero, else get_mscale(factor)."""
    if attention_factor is not None:
        return float(attention_factor)
    if mscale and mscale_all_dim:
        return get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
    return get_mscale(factor)


def yarn_ramp(*, rotary_dim: int, base: float, original_max_position_embeddings: int,
              beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True) -> np.ndarray:
    """Extrapolation weight per frequency, float64 [R]: 1 = keep, 0 = divide by factor.

    Frequency i makes r_i = L0 / wavelength_i turns over the original length. The correction
    dims are the (fractional) indices where r equals beta_fast (low) and beta_slow (high):
    i(r) = d ln(L0 / (2 pi r)) / (2 ln base); `truncate` floors low and ceils high; then both
    are clamped to [0, d - 1] (d, not R, as Hugging Face does).
    """
    def correction_dim(turns: float) -> float:
        return (rotary_dim * math.log(original_max_position_embeddings / (turns * 2 * math.pi))
                / (2 * math.log(base)))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # as Hugging Face, avoids 0 / 0
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    return 1.0 - ramp


def yarn(inv_freq, *, factor: float, original_max_position_embeddings: int, base: float,
         beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True,
         mscale: float | None = None, mscale_all_dim: float | None = None,
         attention_factor: float | None = None) -> Result:
    """YaRN: inv_freq * (keep + (1 - keep) / factor) with keep = `yarn_ramp(...)`; attention
    factor from `yarn_attention_factor`. inv_freq: float32 [R] plain RoPE frequencies of
    `base` (base is needed for the correction range)."""
    inv_freq = _freqs(inv_freq)
    _check_factor(factor)
    if not beta_fast > beta_slow:
        raise ValueError(f"beta_fast must be > beta_slow, got beta_fast={beta_fast} and "
                         f"beta_slow={beta_slow}")
    keep = yarn_ramp(rotary_dim=2 * inv_freq.shape[0], base=base, beta_fast=beta_fast,
                     beta_slow=beta_slow, truncate=truncate,
                     original_max_position_embeddings=original_max_position_embeddings)
    mix = keep + (1.0 - keep) / factor
    mix = mix if _xp(inv_freq) is np else jnp.asarray(mix, jnp.float32)
    return _out(inv_freq * mix, yarn_attention_factor(
        factor=factor, mscale=mscale, mscale_all_dim=mscale_all_dim,
        attention_factor=attention_factor))


def longrope(inv_freq, *, short_factor: Sequence[float], long_factor: Sequence[float],
             original_max_position_embeddings: int, seq_len=None, factor: float | None = None,
             attention_factor: float | None = None) -> Result:
    """LongRoPE: inv_freq / short_factor for seq_len <= L0 (or None), / long_factor above.

    The attention factor does not depend on seq_len: explicit `attention_factor`, else
    sqrt(1 + ln(factor) / ln(L0)) (1 for factor <= 1). seq_len: int or traced int scalar.
    """
    inv_freq = _freqs(inv_freq)
    xp = _xp(inv_freq)
    dtype = np.float64 if xp is np else jnp.float32
    short = xp.asarray(short_factor, dtype)
    long_ = xp.asarray(long_factor, dtype)
    if short.shape != inv_freq.shape or long_.shape != inv_freq.shape:
        raise ValueError(f"short_factor and long_factor must have R={inv_freq.shape[0]} entries, "
                         f"got {short.shape[0]} and {long_.shape[0]}")
    if attention_factor is None:
        if factor is None:
            raise ValueError("longrope needs factor or attention_factor, got neither")
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(
            1.0 + math.log(factor) / math.log(original_max_position_embeddings))
    if seq_len is None:
        return _out(inv_freq / short, attention_factor)
    if _is_concrete(seq_len):  # strict >, as transformers
        is_long = bool(np.max(np.asarray(seq_len)) > original_max_position_embeddings)
        return _out(inv_freq / (long_ if is_long else short), attention_factor)
    is_long = jnp.asarray(seq_len) > original_max_position_embeddings
    short_freq, _ = _out(inv_freq / short)
    long_freq, _ = _out(inv_freq / long_)
    return jnp.where(is_long, long_freq, short_freq), np.float32(attention_factor)


def llama3(inv_freq, *, factor: float, low_freq_factor: float, high_freq_factor: float,
           original_max_position_embeddings: int) -> Result:
    """Llama 3.1: wavelength w = 2 pi / inv_freq; w > L0 / low_freq_factor -> / factor;
    w < L0 / high_freq_factor -> untouched; between, a blend with weight
    t = (L0 / w - low_freq_factor) / (high_freq_factor - low_freq_factor) on the original.

    low_freq_factor == high_freq_factor (Llama 4 Scout's published config: 1.0 and 1.0) is a
    step: / factor above L0 / low_freq_factor, untouched below, as transformers 5.24 computes
    it (it only warns). At a wavelength exactly L0 / low_freq_factor transformers' blend is
    0 / 0 = NaN; here it is inv_freq / factor, what every high_freq_factor > low_freq_factor
    gives at that wavelength (t = 0)."""
    inv_freq = _freqs(inv_freq)
    xp = _xp(inv_freq)
    _check_factor(factor)
    if low_freq_factor > high_freq_factor:
        raise ValueError(f"low_freq_factor must be <= high_freq_factor, got low_freq_factor="
                         f"{low_freq_factor} and high_freq_factor={high_freq_factor}")
    length = float(original_max_position_embeddings)
    wavelen = (2 * math.pi if xp is np else jnp.float32(2 * math.pi)) / inv_freq
    gap = high_freq_factor - low_freq_factor  # 0: the blend is only the point t = 0
    t = (length / wavelen - low_freq_factor) / (gap if gap > 0 else 1.0)
    smooth = (1.0 - t) * inv_freq / factor + t * inv_freq
    out = xp.where(wavelen > length / low_freq_factor, inv_freq / factor, smooth)
    out = xp.where(wavelen < length / high_freq_factor, inv_freq, out)
    return _out(out)


def proportional(inv_freq, *, partial_rotary_factor: float = 1.0, factor: float = 1.0) -> Result:
    """Proportional RoPE (p-RoPE; Gemma 4's rope_type "proportional"). inv_freq: the plain
    frequencies base^(-2i / D) over the WHOLE head dim D = 2R (rotary_dim = head_dim); only the
    first int(partial_rotary_factor * D // 2) pairs rotate, the remaining (lowest-frequency)
    pairs get frequency 0 and pass through; all are divided by `factor`. [R] -> [R]."""
    fraction = finite_float("partial_rotary_factor", partial_rotary_factor, minimum=0, maximum=1)
    # the p-RoPE map (one implementation; transformers' count int(p * D // 2))
    return _out(truncate(_freqs(inv_freq), fraction=fraction) / _check_factor(factor))
