"""Validation and normalisation of a RoPE scaling dict (`rope_scaling` / `rope_parameters`).

`validate` runs once, when an encoding is built; `posenc_jax.encodings.rope_scaling` re-exports it.
Hugging Face only logs warnings for most bad values; we raise `ValueError` (or `TypeError`
for a value of the wrong type) naming the key and the value, and warn (`UserWarning`) about
keys we do not know, naming them.

The normalised dict is a plain dict: `rope_type` resolved (from the legacy `type`, and
Phi-3's old name "su" -> "longrope"), every default filled in (YaRN's betas and `truncate`,
`original_max_position_embeddings` from `max_position_embeddings` where Hugging Face does
that, a missing LongRoPE or YaRN `factor` inferred as max / original as transformers 5.x
does), unknown keys dropped, a YaRN `mscale` that Hugging Face ignores dropped. Validating a
normalised dict again returns it unchanged.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

METHODS = ("default", "linear", "ntk", "dynamic", "yarn", "longrope", "llama3")
ALIASES = {"su": "longrope"}  # Phi-3's first checkpoints; transformers maps it the same way

_COMMON = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "ntk": {"factor"},
    "dynamic": {"factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate", "attention_factor"},
    "longrope": {"short_factor", "long_factor", "factor", "original_max_position_embeddings",
                 "attention_factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"},
}


def resolve_type(scaling: Mapping[str, Any] | None) -> str:
    """The method name of a scaling dict: `rope_type`, else legacy `type`, else "default"."""
    if scaling is None:
        return "default"
    if not isinstance(scaling, Mapping):
        raise TypeError(f"rope scaling must be a dict (or None), got {type(scaling).__name__}: "
                        f"{scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    legacy = scaling.get("type", rope_type)
    if "rope_type" in scaling and "type" in scaling and legacy != rope_type:
        raise ValueError(f"rope scaling has rope_type={rope_type!r} and type={legacy!r}; they "
                         "must agree (give one)")
    rope_type = ALIASES.get(rope_type, rope_type)
    if rope_type not in METHODS:
        raise ValueError(f"unknown rope_type={rope_type!r}; valid: {', '.join(METHODS)}")
    return rope_type


def number(key: str, value: Any, *, minimum: float | None = None,
           strict: bool = False) -> float:
    """`value` as a float; TypeError unless a real number, ValueError below `minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{key} must be a number, got {key}={value!r}")
    value = float(value)
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ValueError(f"{key} must be {'>' if strict else '>='} {minimum:g}, "
                         f"got {key}={value:g}")
    return value


def _length(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != int(value):
        raise TypeError(f"{key} must be an integer, got {key}={value!r}")
    if value < 1:
        raise ValueError(f"{key} must be >= 1, got {key}={value}")
    return int(value)


def _factors(key: str, value: Any, rotary_dim: int) -> list[float]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{key} must be a list of numbers, got {key}={value!r}")
    if len(value) != rotary_dim // 2:
        raise ValueError(f"{key} must have rotary_dim / 2 = {rotary_dim // 2} entries "
                         f"(rotary_dim={rotary_dim}), got {len(value)}")
    return [number(f"{key}[{i}]", v, minimum=0.0, strict=True) for i, v in enumerate(value)]


def _required(rope_type: str, scaling: Mapping[str, Any], key: str) -> Any:
    if scaling.get(key) is None:
        raise ValueError(f"rope_type={rope_type!r} requires the key {key!r}; got keys "
                         f"{sorted(scaling)}")
    return scaling[key]


def validate(scaling: Mapping[str, Any], *, rotary_dim: int,
             max_position_embeddings: int | None = None) -> dict[str, Any]:
    """Checks a scaling dict and returns it normalised (see the module docstring).

    Args:
      scaling: a Hugging Face style dict, `{"rope_type": "yarn", "factor": 4.0, ...}`.
      rotary_dim: number of rotated features (2R); LongRoPE's factor lists must have R entries.
      max_position_embeddings: the model's context length; fills a missing
        `original_max_position_embeddings` (dynamic, YaRN, LongRoPE, as Hugging Face does) and
        LongRoPE's missing `factor` (= max / original).

    Raises:
      ValueError: unknown rope_type, a missing required key, factor < 1, beta_fast <= beta_slow,
        low_freq_factor >= high_freq_factor, factor lists of the wrong length, attention_factor
        <= 0, rope_theta <= 0, an odd rotary_dim.
      TypeError: a value of the wrong type.
    """
    rope_type = resolve_type(scaling)
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"rotary_dim must be an int, got rotary_dim={rotary_dim!r}")
    smallest = 4 if rope_type in ("ntk", "dynamic") else 2  # their exponent is d / (d - 2)
    if rotary_dim % 2 or rotary_dim < smallest:
        raise ValueError(f"rotary_dim must be even and >= {smallest} for rope_type="
                         f"{rope_type!r}, got rotary_dim={rotary_dim}")
    unknown = sorted(set(scaling) - _COMMON - _KEYS[rope_type])
    if unknown:
        warnings.warn(f"rope_type={rope_type!r} ignores unknown key(s) {unknown}; it takes "
                      f"{sorted(_KEYS[rope_type])}", UserWarning, stacklevel=2)
    out: dict[str, Any] = {"rope_type": rope_type}
    if scaling.get("rope_theta") is not None:
        out["rope_theta"] = number("rope_theta", scaling["rope_theta"], minimum=0.0, strict=True)
    if scaling.get("partial_rotary_factor") is not None:
        prf = number("partial_rotary_factor", scaling["partial_rotary_factor"], minimum=0.0,
                     strict=True)
        if prf > 1.0:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got "
                             f"partial_rotary_factor={prf:g}")
        out["partial_rotary_factor"] = prf
    if rope_type == "default":
        return out

    original = scaling.get("original_max_position_embeddings")
    if original is None and rope_type in ("dynamic", "yarn", "longrope"):
        original = max_position_embeddings
    if original is not None and rope_type in ("dynamic", "yarn", "longrope", "llama3"):
        out["original_max_position_embeddings"] = _length("original_max_position_embeddings",
                                                          original)
    factor = scaling.get("factor")
    if factor is None and rope_type in ("yarn", "longrope") and original is not None and (
            max_position_embeddings is not None):
        factor = _length("max_position_embeddings", max_position_embeddings) / original
    if factor is not None:
        out["factor"] = number("factor", factor, minimum=1.0)

    if rope_type in ("linear", "ntk", "dynamic", "yarn", "llama3"):
        _required(rope_type, out, "factor")
    if rope_type in ("dynamic", "yarn", "longrope", "llama3") and original is None:
        hint = "" if rope_type == "llama3" else " (or pass max_position_embeddings=)"
        raise ValueError(f"rope_type={rope_type!r} requires the key "
                         f"'original_max_position_embeddings'{hint}; got keys {sorted(scaling)}")
    if scaling.get("attention_factor") is not None:
        out["attention_factor"] = number("attention_factor", scaling["attention_factor"],
                                         minimum=0.0, strict=True)
    if rope_type == "yarn":
        _validate_yarn(scaling, out)
    elif rope_type == "longrope":
        for key in ("short_factor", "long_factor"):
            out[key] = _factors(key, _required(rope_type, scaling, key), rotary_dim)
        if "factor" not in out and "attention_factor" not in out:
            raise ValueError("rope_type='longrope' needs 'factor' or 'attention_factor' (or "
                             "max_position_embeddings= to infer factor = max / original)")
    elif rope_type == "llama3":
        low = number("low_freq_factor", _required(rope_type, scaling, "low_freq_factor"),
                     minimum=0.0, strict=True)
        high = number("high_freq_factor", _required(rope_type, scaling, "high_freq_factor"))
        if low >= high:
            raise ValueError(f"low_freq_factor must be < high_freq_factor, got "
                             f"low_freq_factor={low:g} and high_freq_factor={high:g}")
        out.update(low_freq_factor=low, high_freq_factor=high)
    return out


def _validate_yarn(scaling: Mapping[str, Any], out: dict[str, Any]) -> None:
    beta_fast = scaling.get("beta_fast")
    beta_slow = scaling.get("beta_slow")
    beta_fast = 32.0 if beta_fast is None else number("beta_fast", beta_fast, minimum=0.0,
                                                      strict=True)
    beta_slow = 1.0 if beta_slow is None else number("beta_slow", beta_slow, minimum=0.0,
                                                     strict=True)
    if beta_fast <= beta_slow:
        raise ValueError(f"beta_fast must be > beta_slow, got beta_fast={beta_fast:g} and "
                         f"beta_slow={beta_slow:g}")
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise TypeError(f"truncate must be a bool, got truncate={truncate!r}")
    out.update(beta_fast=beta_fast, beta_slow=beta_slow, truncate=truncate)
    for key in ("mscale", "mscale_all_dim"):
        if scaling.get(key) is not None:
            out[key] = number(key, scaling[key], minimum=0.0)
    if "attention_factor" not in out and bool(out.get("mscale")) != bool(
            out.get("mscale_all_dim")):
        given = "mscale" if out.get("mscale") else "mscale_all_dim"
        warnings.warn(f"YaRN: {given}={out[given]:g} is ignored unless both mscale and "
                      "mscale_all_dim are non-zero (as in Hugging Face); the attention factor "
                      "is 0.1 ln(factor) + 1", UserWarning, stacklevel=3)
        del out[given]  # ignored, as in Hugging Face: the normalised dict says what is used
