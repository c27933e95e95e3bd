"""Validation and normalisation of a RoPE scaling dict (`rope_scaling` / `rope_parameters`).

Generic: it reads the method's record (`registry.Method`) and tests no method's name. Hugging
Face only logs warnings for most bad values; we raise `ValueError` (or `TypeError` for a value
of the wrong type) naming the key and the value (`posenc_jax.checks`), and warn
(`UserWarning`) about keys the method does not take, naming them.

The result is a `Validated` dict: `rope_type` resolved (from the legacy `type`, and aliases
such as Phi-3's "su" -> "longrope"), every default filled in (YaRN's betas and `truncate`,
`original_max_position_embeddings` from `max_position_embeddings` where Hugging Face does that,
a missing LongRoPE or YaRN `factor` inferred as max / original as transformers 5.x does),
unknown keys dropped, a YaRN `mscale` that Hugging Face ignores dropped. `validate` returns a
`Validated` dict as it is, so a dict is checked once however many layers pass it on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from posenc_jax.checks import boolean, finite_float, integer, json_count, warn
from posenc_jax.encodings.rope_scaling.registry import ORIGINAL, Method, method, resolve_type

__all__ = ["Validated", "check_theta", "validate"]

COMMON = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


class Validated(dict):
    """A scaling dict that `validate` returned: checked and normalised. Compares equal to the
    plain dict with the same items. Build one only through `validate` (or from a dict that
    `validate` returned, as the RoPE encoding does after freezing it)."""


def _factors(key: str, value: Any, rotary_dim: int) -> list[float]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{key} must be a list of numbers, got {key}={value!r}")
    if len(value) != rotary_dim // 2:
        raise ValueError(f"{key} must have rotary_dim / 2 = {rotary_dim // 2} entries "
                         f"(rotary_dim={rotary_dim}), got {len(value)}")
    return [finite_float(f"{key}[{i}]", v, above=0) for i, v in enumerate(value)]


def _as_is(key: str, value: Any, rotary_dim: int) -> Any:
    return value


# One check per key (Hugging Face names mean the same thing in every method).
KEYS = {
    "factor": lambda k, v, d: finite_float(k, v, minimum=1),
    ORIGINAL: lambda k, v, d: json_count(k, v),
    "attention_factor": lambda k, v, d: finite_float(k, v, above=0),
    "beta_fast": lambda k, v, d: finite_float(k, v, above=0),
    "beta_slow": lambda k, v, d: finite_float(k, v, above=0),
    "truncate": lambda k, v, d: boolean(k, v),
    "mscale": lambda k, v, d: finite_float(k, v, minimum=0),
    "mscale_all_dim": lambda k, v, d: finite_float(k, v, minimum=0),
    "short_factor": _factors,
    "long_factor": _factors,
    "low_freq_factor": lambda k, v, d: finite_float(k, v, above=0),
    "partial_rotary_factor": lambda k, v, d: finite_float(k, v, above=0, maximum=1),
    "high_freq_factor": lambda k, v, d: finite_float(k, v),
}


def check_theta(cfg: Mapping[str, Any] | None, *, base: float) -> None:
    """ValueError when a validated scaling dict carries a rope_theta that is not `base`."""
    if cfg is not None and "rope_theta" in cfg and cfg["rope_theta"] != float(base):
        raise ValueError(f"scaling has rope_theta={cfg['rope_theta']:g} but base={base!r}; "
                         "they must agree")


def _common(scaling: Mapping[str, Any], out: dict[str, Any]) -> None:
    if scaling.get("rope_theta") is not None:
        out["rope_theta"] = finite_float("rope_theta", scaling["rope_theta"], above=0)
    if scaling.get("partial_rotary_factor") is not None:
        prf = finite_float("partial_rotary_factor", scaling["partial_rotary_factor"], above=0)
        if prf > 1.0:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got "
                             f"partial_rotary_factor={prf:g}")
        out["partial_rotary_factor"] = prf


def _inferred(record: Method, scaling: Mapping[str, Any], max_len: int | None) -> dict:
    """The original length and factor that Hugging Face infers when they are missing."""
    raw = {k: scaling.get(k) for k in record.keys}
    original_given = raw.get(ORIGINAL) is not None
    if ORIGINAL in raw and raw[ORIGINAL] is None and record.original_from_max:
        raw[ORIGINAL] = max_len
    if (raw.get("factor") is None and record.factor_from_ratio and raw.get(ORIGINAL) is not None
            and max_len is not None):
        longest = json_count("max_position_embeddings", max_len)
        original = json_count(ORIGINAL, raw[ORIGINAL])
        said = (f"no factor given, so factor = max_position_embeddings / {ORIGINAL} = "
                f"{longest} / {original}")
        # both lengths max_position_embeddings: factor 1 (YaRN: plain RoPE; LongRoPE's factor
        # lists still scale, so a factor of 1 there is a real setting)
        if not original_given and "long_factor" not in record.keys:
            raise ValueError(f"rope_type={record.name!r}: {said} (no {ORIGINAL} either, so it is "
                             "max_position_embeddings too) = 1, which scales nothing; give "
                             f"factor or {ORIGINAL}")
        if longest < original:
            raise ValueError(f"rope_type={record.name!r}: {said} = {longest / original:g} < 1 "
                             f"(a shorter context than the original); give factor >= 1 or fix "
                             "the lengths")
        raw["factor"] = longest / original
    return raw


def validate(scaling: Mapping[str, Any], *, rotary_dim: int,
             max_position_embeddings: int | None = None) -> Validated:
    """Checks a scaling dict and returns it normalised (see the module docstring).

    Args:
      scaling: a Hugging Face style dict, `{"rope_type": "yarn", "factor": 4.0, ...}`; a
        `Validated` dict is returned as it is.
      rotary_dim: number of rotated features (2R); LongRoPE's factor lists must have R entries.
      max_position_embeddings: the model's context length; fills a missing
        `original_max_position_embeddings` and `factor` where the method's record says so.

    Raises:
      ValueError: unknown rope_type (the message lists the valid ones), a missing required key,
        factor < 1, beta_fast <= beta_slow, low_freq_factor > high_freq_factor, factor lists
        of the wrong length, attention_factor <= 0, rope_theta <= 0, an odd rotary_dim.
      TypeError: a value of the wrong type.
    """
    if isinstance(scaling, Validated):
        return scaling
    record = method(resolve_type(scaling))
    name = record.name
    rotary_dim = integer("rotary_dim", rotary_dim)
    if rotary_dim % 2 or rotary_dim < record.min_rotary_dim:
        raise ValueError(f"rotary_dim must be even and >= {record.min_rotary_dim} for rope_type="
                         f"{name!r}, got rotary_dim={rotary_dim}")
    unknown = sorted(set(scaling) - set(COMMON) - set(record.keys))
    if unknown:
        warn(f"rope_type={name!r} ignores unknown key(s) {unknown}; it takes "
                      f"{sorted(record.keys)}")
    out: dict[str, Any] = {"rope_type": name}
    _common(scaling, out)
    raw = _inferred(record, scaling, max_position_embeddings)
    for key in record.required:
        if raw.get(key) is None:
            hint = (" (or pass max_position_embeddings=)"
                    if key == ORIGINAL and record.original_from_max else "")
            raise ValueError(f"rope_type={name!r} requires the key {key!r}{hint}; got keys "
                             f"{sorted(scaling)}")
    for key, value in raw.items():
        if value is not None:  # a key no check knows is the method's `check` to test
            out[key] = KEYS.get(key, _as_is)(key, value, rotary_dim)
    for key, value in record.defaults.items():
        out.setdefault(key, value)
    if record.check is not None:
        record.check(out)
    return Validated(out)
