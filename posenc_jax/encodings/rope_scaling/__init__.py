"""Context extension for RoPE: a registry of scaling methods, each a map from the base
frequencies to scaled ones (linear/PI, NTK, dynamic NTK, YaRN, LongRoPE, Llama 3.1).

    formulas.py   the pure functions, one per method (`linear(inv_freq, factor=4.0)`)
    registry.py   one record per method (`Method`): keys, required keys, length dependence,
                  function, aliases; `method(name)`, `methods()`, `register`, `stretch`
    validation.py `validate(scaling, rotary_dim=...)`, generic over the records

This module is the one entry point: `frequencies(scaling, ...)` takes a Hugging Face style dict
(validated here unless `validate` already returned it, so the RoPE encoding, which validates
once at construction, is never checked again), `is_length_dependent` and `regime` read the
record. `posenc_jax.encodings.hf_config` reads a whole transformers config.json. The sequence
length s is `max(k_positions) + 1`, exactly what Hugging Face's dynamic update uses
(`max(position_ids) + 1`); it may be a traced scalar.

KV-cache policy for the length-dependent methods (dynamic, LongRoPE)
--------------------------------------------------------------------
Their frequencies change as the sequence grows. `regime(scaling, seq_len=s)` is an int32 id
that changes exactly when the frequencies for s change (0 = the original frequencies;
LongRoPE 0 short / 1 long; dynamic 0 at or below L0, else s). The cache stores keys already
rotated, plus the regime they were rotated under. When a decode step's regime differs from
the cache's, the cache is rebuilt by re-running the whole prefix under the new regime; the
result is then exactly the full forward pass, for any number of layers.
Why not cache keys unrotated and re-rotate them? That is exact for ONE layer only: a deeper
layer's keys are computed from the earlier layers' attention outputs, which were computed
under the old regime, so re-rotating them does not give what a full forward pass computes.
Hugging Face keeps rotated keys and silently mixes regimes after a switch (transformers issue
25104); vLLM freezes the regime at start-up. The price of exactness: LongRoPE rebuilds once
(when s first exceeds L0); dynamic NTK rebuilds at every step past L0. A user who prefers
speed can freeze the frequencies by passing a fixed `seq_len` (e.g. the context length).
Our frequencies are a pure function of s. Hugging Face's dynamic module is not: once grown it
keeps the largest length seen until s drops back to L0 (so after a 6000-token call a
5000-token call uses the 6000 frequencies); we match a freshly built Hugging Face module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.checks import integer
from posenc_jax.encodings.frequencies import inv_freq_float64
from posenc_jax.encodings.rope_scaling.formulas import (
    Result,
    default,
    dynamic,
    get_mscale,
    linear,
    llama3,
    longrope,
    ntk,
    proportional,
    yarn,
    yarn_attention_factor,
    yarn_ramp,
)
from posenc_jax.encodings.rope_scaling.registry import (
    Method,
    method,
    methods,
    register,
    resolve_type,
    stretch,
)
from posenc_jax.encodings.rope_scaling.validation import Validated, check_theta, validate

__all__ = [
    "Method",
    "Validated",
    "check_seq_len",
    "check_theta",
    "default",
    "dynamic",
    "frequencies",
    "get_mscale",
    "is_length_dependent",
    "linear",
    "llama3",
    "longrope",
    "method",
    "methods",
    "ntk",
    "proportional",
    "regime",
    "register",
    "resolve_type",
    "stretch",
    "validate",
    "yarn",
    "yarn_attention_factor",
    "yarn_ramp",
]


def check_seq_len(seq_len):
    """`seq_len` if it is None, an int >= 1 or an integer array (>= 1 where concrete; a traced
    one is checked by dtype only). A float, bool or string is a TypeError and a concrete value
    below 1 a ValueError, instead of a silent truncation or the short regime."""
    if seq_len is None:
        return None
    if not isinstance(seq_len, (jax.Array, np.ndarray)):
        return integer("seq_len", seq_len, minimum=1)
    if not jnp.issubdtype(seq_len.dtype, jnp.integer):
        raise TypeError(f"seq_len must be an int or an integer array, got dtype {seq_len.dtype}")
    if not isinstance(seq_len, jax.core.Tracer) and np.size(seq_len) and np.min(
            np.asarray(seq_len)) < 1:
        raise ValueError(f"seq_len must be >= 1, got seq_len={np.asarray(seq_len).tolist()}")
    return seq_len


def frequencies(scaling: Mapping[str, Any] | None, *, rotary_dim: int, base: float,
                seq_len=None, max_position_embeddings: int | None = None) -> Result:
    """(inv_freq float32 [rotary_dim // 2], attention_factor np.float32) for a scaling dict.

    scaling: None or {"rope_type" (or legacy "type"): ..., hyperparameters}; validated here
    unless it is a `Validated` dict. seq_len: the current length, max(k_positions) + 1 (int or
    traced scalar); used by length-dependent methods only; None means "at or below the
    original length".
    """
    cfg = None if scaling is None else validate(
        scaling, rotary_dim=rotary_dim, max_position_embeddings=max_position_embeddings)
    check_theta(cfg, base=base)
    seq_len = check_seq_len(seq_len)
    inv_freq = inv_freq_float64(rotary_dim, base=base)  # host float64, rounded once
    if cfg is None:
        return default(inv_freq)
    return method(cfg["rope_type"])(inv_freq, cfg, base=base, seq_len=seq_len)


def is_length_dependent(scaling: Mapping[str, Any] | None) -> bool:
    """True when the frequencies of `scaling` change with the sequence length (dynamic NTK;
    LongRoPE when short_factor and long_factor differ)."""
    record = method(resolve_type(scaling))
    return record.length_dependent and record.varies(scaling)


def regime(scaling: Mapping[str, Any] | None, *, seq_len,
           max_position_embeddings: int | None = None) -> jax.Array:
    """int32 [] id that changes exactly when `frequencies(scaling, seq_len=seq_len)` changes.

    0 = the original frequencies; LongRoPE: 0 short / 1 long; dynamic: 0 at or below the
    original length L0, else seq_len. Jittable in seq_len. See the module docstring for the
    KV-cache policy built on it.
    """
    if check_seq_len(seq_len) is None or not is_length_dependent(scaling):
        return jnp.zeros((), jnp.int32)
    record = method(resolve_type(scaling))
    orig = scaling.get("original_max_position_embeddings")
    orig = max_position_embeddings if orig is None else orig
    if orig is None:
        raise ValueError(f"rope_type={record.name!r} needs "
                         "original_max_position_embeddings (or max_position_embeddings=)")
    s = jnp.asarray(seq_len).astype(jnp.int32).reshape(())
    return record.regime(s, s > int(orig))
