"""A GGUF file's RoPE scaling as config.json's `rope_parameters`: the `<arch>.rope.scaling.*` keys
and llama.cpp's `rope_freqs.weight`, read rather than dropped (transformers 5.24's GGUF loader
drops both for every architecture but gpt-oss, so a Llama 3.1 GGUF computes plain RoPE there).

    params = rope_parameters(fields, freqs, arch="llama", theta=5e5, rotary_dim=128,
                             context_length=131072, where="model.gguf")
    # {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    #  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

The keys (gguf's `Keys.Rope`, written by llama.cpp's convert_hf_to_gguf.py):
    rope.scaling.type                 none | linear | yarn | longrope; absent with a factor
                                      other than 0 / 1: linear (llama.cpp's default)
    rope.scaling.factor               -> factor (linear, yarn)
    rope.scaling.original_context_length  -> original_max_position_embeddings (yarn; llama3's
                                      L0 when rope_freqs is read); a yarn file without it: the
                                      context length (llama.cpp's n_ctx_orig_yarn default)
    rope.scaling.yarn_beta_fast / _slow   -> beta_fast / beta_slow
    rope.scaling.yarn_attn_factor a   -> attention_factor a (0.1 ln factor + 1): ggml's rope_yarn
                                      multiplies cos / sin by a (1 + 0.1 ln factor), and
                                      transformers by attention_factor; 1: nothing written
    rope.scaling.yarn_ext_factor      accepted when < 0 (llama.cpp's "auto", 1 for yarn) or 1;
                                      transformers' YaRN has no other extrapolation mix
    rope.scaling.attn_factor, .yarn_log_multiplier, .alpha: accepted only at their identity
                                      (1, 0, absent): no rope_parameters key says them
    rope.scaling.finetuned            not used by the computation, ignored (as llama.cpp does)

`rope_freqs.weight` [R] float32 (R = rotary_dim / 2): per-pair divisors of the inverse
frequencies, llama.cpp's form of Llama 3.1's rule (`LlamaModel.generate_extra_tensors`: 1 in
the high band, `factor` in the low band, 1 / ((1 - t) / factor + t) between, t linear in the
frequency). The rule depends on L0, low and high only through the two band-edge wavelengths
L0 / low and L0 / high, so the vector fixes factor (its last entry) and, with >= 2 entries in
the blend band, both edges; L0 is `original_context_length` when the file has it, else the
low edge rounded (low_freq_factor 1, Llama 3's own value). Without two blend entries the edges
are not fixed: the published rules are tried (1 / 4 / 8192 of Llama 3.1-3.3, the step 1 / 1 /
8192 of Llama 4 Scout; L0 from the key when present). Those parameters are accepted only
if llama.cpp's formula gives back the stored vector (relative 1e-5: float32 rounding of a fit),
and low / high are rounded to 3 decimals when that still holds. A vector that no llama3 rule
reproduces (too few blend entries and none of the published rules, or another shape)
becomes `{"rope_type": "longrope", "short_factor": r, "long_factor": r, "attention_factor": 1}`:
transformers divides the inverse frequencies by exactly those divisors, for every length, and
reads and exports it for every family. All ones: no scaling. A `rope.scaling.type` other than
none beside non-trivial rope_freqs is a contradiction (one rope_parameters holds one method)
and refused, naming the file, the tensor, its values and the type. Every error is ValueError
naming the file and the key or tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["KNOWN_TYPES", "ROPE_FREQS", "rope_parameters"]

ROPE_FREQS = "rope_freqs.weight"
#: gguf's RopeScalingType values, the types llama.cpp defines.
KNOWN_TYPES = ("none", "linear", "yarn", "longrope")
_IDENTITY_ONLY = {"rope.scaling.attn_factor": 1.0, "rope.scaling.yarn_log_multiplier": 0.0}
_RTOL = 1e-5


def _llama_cpp_divisors(inv32: np.ndarray, factor: float, low: float, high: float,
                        original: float) -> np.ndarray:
    """llama.cpp's rope_freqs for these llama3 parameters (float64 math on float32
    frequencies, stored float32)."""
    wavelen = 2 * math.pi / inv32.astype(np.float64)
    gap = high - low
    smooth = (original / wavelen - low) / (gap if gap > 0 else 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):  # outside the blend band: unused
        mid = 1.0 / ((1.0 - smooth) / factor + smooth)
    out = np.where(wavelen > original / low, factor, mid)
    return np.where(wavelen < original / high, 1.0, out).astype(np.float32)


def _reproduces(r: np.ndarray, inv32: np.ndarray, cand: dict) -> bool:
    got = _llama_cpp_divisors(inv32, cand["factor"], cand["low_freq_factor"],
                              cand["high_freq_factor"], cand["original_max_position_embeddings"])
    return bool(np.allclose(got, r, rtol=_RTOL, atol=0))


def _llama3_candidates(r: np.ndarray, inv32: np.ndarray, original: int | None) -> list[dict]:
    factor = float(r[-1])
    if factor <= 1.0:  # llama3 divides the low band by factor >= 1
        return []
    mid = (r > 1 + _RTOL) & (r < factor * (1 - _RTOL))
    out = []
    if mid.sum() >= 2:  # t = (x - p) / (q - p), x = 1 / wavelength: slope and intercept
        x = inv32[mid].astype(np.float64) / (2 * math.pi)
        t = (1 / r[mid] - 1 / factor) / (1 - 1 / factor)
        slope, intercept = np.polyfit(x, t, 1)
        if slope > 0 and intercept < 0:
            p = float(-intercept / slope)
            q = p + float(1 / slope)
            length = original if original is not None else int(round(1 / p))
            if length >= 1:
                low, high = length * p, length * q
                for lo, hi in ((round(low, 3), round(high, 3)), (low, high)):
                    out.append({"factor": factor, "low_freq_factor": lo, "high_freq_factor": hi,
                                "original_max_position_embeddings": length})
    for high in (4.0, 1.0):  # Llama 3.1-3.3's published rule; Llama 4 Scout's step
        out.append({"factor": factor, "low_freq_factor": 1.0, "high_freq_factor": high,
                    "original_max_position_embeddings": original or 8192})
    return out


def _from_rope_freqs(r: np.ndarray, inv32: np.ndarray, original: int | None,
                     context_length: int) -> dict:
    for cand in _llama3_candidates(r, inv32, original):
        if _reproduces(r, inv32, cand):
            return {"rope_type": "llama3", **cand}
    divisors = [float(v) for v in r]
    return {"rope_type": "longrope", "short_factor": divisors, "long_factor": divisors,
            "original_max_position_embeddings": original or context_length,
            "attention_factor": 1.0}


def _summary(r: np.ndarray) -> str:
    shown = ", ".join(f"{v:.6g}" for v in r[:8])
    return f"[{shown}{', ...' if len(r) > 8 else ''}]"


def _checked_freqs(freqs: np.ndarray, rotary_dim: int, where: str) -> np.ndarray:
    r = np.asarray(freqs, dtype=np.float64).reshape(-1)
    if np.shape(freqs) != (rotary_dim // 2,):
        raise ValueError(f"{where}: tensor {ROPE_FREQS!r} has shape {tuple(np.shape(freqs))}, "
                         f"expected ({rotary_dim // 2},): one divisor per rotary pair "
                         f"(rotary dim {rotary_dim})")
    if not (np.isfinite(r).all() and (r > 0).all()):
        raise ValueError(f"{where}: tensor {ROPE_FREQS!r} = {_summary(r)} must hold finite "
                         f"divisors > 0")
    return r


def _from_keys(fields: Mapping[str, Any], arch: str, context_length: int,
               where: str) -> dict | None:
    key = f"{arch}.rope.scaling.type"
    kind = fields.get(key)
    if kind is not None and kind not in KNOWN_TYPES:
        raise ValueError(f"{where}: GGUF metadata {key!r} = {kind!r} is not a RoPE scaling type "
                         f"(known: {', '.join(KNOWN_TYPES)})")
    factor = fields.get(f"{arch}.rope.scaling.factor", fields.get(f"{arch}.rope.scale_linear"))
    if kind is None:
        kind = "none" if factor in (None, 0.0, 1.0) else "linear"
    for suffix, identity in _IDENTITY_ONLY.items():
        value = fields.get(f"{arch}.{suffix}", identity)
        if value != identity:
            raise ValueError(f"{where}: GGUF metadata '{arch}.{suffix}' = {value!r} is not "
                             f"supported (only {identity!r}: no rope_parameters key says it)")
    if f"{arch}.rope.scaling.alpha" in fields:
        raise ValueError(f"{where}: GGUF metadata '{arch}.rope.scaling.alpha' is not supported "
                         f"(no rope_parameters key says it)")
    if kind == "none":
        return None
    if kind == "longrope":
        raise ValueError(f"{where}: GGUF metadata {key!r} = 'longrope' is not read (its factors "
                         f"are the tensors rope_factors_long / rope_factors_short); supported: "
                         f"none, linear, yarn")
    if factor is None:
        raise ValueError(f"{where}: GGUF metadata {key!r} = {kind!r} needs "
                         f"'{arch}.rope.scaling.factor', which the file lacks")
    if kind == "linear":
        return None if factor in (0.0, 1.0) else {"rope_type": "linear", "factor": factor}
    out = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": fields.get(
        f"{arch}.rope.scaling.original_context_length", context_length)}
    for suffix, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        if f"{arch}.rope.scaling.{suffix}" in fields:
            out[name] = fields[f"{arch}.rope.scaling.{suffix}"]
    ext = fields.get(f"{arch}.rope.scaling.yarn_ext_factor", -1.0)
    if not (ext < 0 or ext == 1.0):
        raise ValueError(f"{where}: GGUF metadata '{arch}.rope.scaling.yarn_ext_factor' = "
                         f"{ext!r} is not supported (only 1, or < 0 for llama.cpp's default 1: "
                         f"transformers' YaRN has no other extrapolation mix)")
    attn = fields.get(f"{arch}.rope.scaling.yarn_attn_factor", 1.0)
    if attn != 1.0:
        out["attention_factor"] = attn * (0.1 * math.log(factor) + 1.0)
    return out


def rope_parameters(fields: Mapping[str, Any], freqs: np.ndarray | None, *, arch: str,
                    theta: float, rotary_dim: int, context_length: int,
                    where: str) -> dict[str, Any]:
    """config.json's rope_parameters for a GGUF file (module docstring).

    fields: the file's checked metadata (gguf_metadata.checked_fields); freqs: the
    `rope_freqs.weight` tensor [rotary_dim / 2] float32, or None; theta: the RoPE base;
    rotary_dim: the rotated features per head; context_length: the file's context length.
    Raises ValueError naming `where` and the key or tensor.
    """
    params: dict[str, Any] = {"rope_theta": theta, "rope_type": "default"}
    scaling = _from_keys(fields, arch, context_length, where)
    if freqs is not None:
        r = _checked_freqs(freqs, rotary_dim, where)
        if not np.all(r == 1.0):
            if scaling is not None:
                key = f"{arch}.rope.scaling.type"
                said = (f"{key!r} = {fields[key]!r}" if key in fields else
                        f"'{arch}.rope.scaling.factor' = {scaling['factor']!r} (linear)")
                raise ValueError(
                    f"{where}: tensor {ROPE_FREQS!r} = {_summary(r)} holds per-pair frequency "
                    f"divisors (llama3 scaling) but GGUF metadata {said} declares another "
                    f"scaling; one file cannot have both")
            inv32 = (np.float32(1.0) / (np.float32(theta) ** (
                np.arange(0, rotary_dim, 2, dtype=np.float32) / np.float32(rotary_dim))))
            original = fields.get(f"{arch}.rope.scaling.original_context_length")
            scaling = _from_rope_freqs(r, inv32, original, context_length)
    return {**params, **(scaling or {})}
