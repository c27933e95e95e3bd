"""RoPE scaling in the study: which methods exist, which encodings take one, and the dicts.

The method list and each method's keys are posenc_jax's (`posenc_jax.encodings.rope_scaling`);
`methods` and `keys` are the only places the study reads them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from posenc_jax.encodings import rope_scaling, rope_scaling_validate


def methods() -> tuple[str, ...]:
    """The scaling methods a study can evaluate: every registered method except the identity
    (the method of no scaling dict)."""
    identity = rope_scaling.resolve_type(None)
    return tuple(m for m in rope_scaling.METHODS if m != identity)


def keys(method: str) -> frozenset[str]:
    """The hyperparameters `method` takes (besides rope_type, rope_theta, ...)."""
    return frozenset(rope_scaling_validate._KEYS[method])  # private until the method registry lands


def takes_scaling(encoding) -> bool:
    """True for an encoding that rotates and takes a `scaling` dict (with a `rotary_dim`)."""
    fields = {f.name for f in dataclasses.fields(encoding)}
    return encoding.has_rotate and {"scaling", "rotary_dim"} <= fields


def scaling_config(method: str, *, factor: float, train_len: int, rotary_dim: int,
                   overrides: dict | None = None) -> dict[str, Any]:
    """The Hugging Face style scaling dict for `method` stretching RoPE from L to factor * L.

    From the keys the method takes: `factor`; `original_max_position_embeddings` = L (YaRN's
    betas, truncation and attention factor stay at their defaults). Per-dimension factor lists
    (LongRoPE's) are normally found by search; we use no search but the NTK-aware rescale,
    long_factor_i = factor^(2i / (d - 2)) (the lowest frequency divided by exactly `factor`;
    the same frequencies as `ntk`), short_factor = 1, so with LongRoPE's attention factor
    sqrt(1 + ln(factor) / ln(L)) rope+longrope vs rope+ntk isolates that factor. Any other
    required key comes from `overrides` (config.scaling_overrides.<method>: the default
    study gives llama3 low_freq_factor 1 and high_freq_factor 4, as Llama 3.1, so its band
    edges are at L and L/4 wavelengths), which also replace any of the above.
    """
    takes = keys(method)
    cfg: dict[str, Any] = {"rope_type": method}
    if "factor" in takes:
        cfg["factor"] = float(factor)
    if "original_max_position_embeddings" in takes:
        cfg["original_max_position_embeddings"] = int(train_len)
    if {"short_factor", "long_factor"} <= takes:
        r = rotary_dim // 2
        cfg["short_factor"] = [1.0] * r
        cfg["long_factor"] = [float(factor) ** (2 * i / (rotary_dim - 2)) if rotary_dim > 2
                              else float(factor) for i in range(r)]
    cfg.update(dict(overrides or {}))
    return cfg
