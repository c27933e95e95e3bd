"""The registry of RoPE scaling methods: one record per method, read by everything else.

A `Method` says what a method takes and how it behaves: the keys of its Hugging Face style
dict, the keys it cannot do without, whether its frequencies depend on the current sequence
length, its pure function (`formulas.py`), and its aliases ("su" -> "longrope"). Validation
(`validation.py`), the frequency dispatch, the KV-cache regime, Hugging Face config parsing
(`posenc_jax.encodings.hf_config`) and the length-extrapolation study all read these records;
none of them tests a method's name. A new method is one `register(Method(...))` call.

    method("yarn").keys          # ("factor", "original_max_position_embeddings", ...)
    methods()                    # ("default", "linear", "ntk", "dynamic", "yarn", ...)
    stretch("yarn", factor=4.0, original_max_position_embeddings=64, rotary_dim=16)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from posenc_jax.checks import warn
from posenc_jax.encodings.rope_scaling import formulas as fn

__all__ = ["Method", "method", "methods", "register", "resolve_type", "stretch"]

ORIGINAL = "original_max_position_embeddings"
_NO_DEFAULTS: Mapping[str, Any] = {}


def _original_only(s, above):  # regime id: 0 at or below L0, else the length itself
    return jnp.where(above, s, 0).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Method:
    """One RoPE scaling method.

    Attributes:
      name: the `rope_type` it answers to.
      function: `function(inv_freq, **hyperparameters) -> (inv_freq, attention_factor)`.
      keys: the hyperparameters it takes (Hugging Face names), besides the common ones
        (`rope_type`, `type`, `rope_theta`, `partial_rotary_factor`).
      required: of `keys`, the ones it cannot do without once defaults are filled in.
      length_dependent: its frequencies depend on the current length s; `function` then takes
        `seq_len=`, and `varies(cfg)` says whether a given dict really does (LongRoPE with equal
        short and long factors does not).
      aliases: other names for it in the wild (Phi-3's "su" for longrope).
      defaults: values `validate` fills in for missing keys (YaRN's betas, `truncate`).
      needs_base: `function` takes `base=` (YaRN's correction range depends on it).
      min_rotary_dim: smallest rotary dim it is defined for (NTK's exponent is d / (d - 2)).
      original_from_max: a missing `original_max_position_embeddings` is the model's
        `max_position_embeddings` (as Hugging Face does for dynamic, YaRN, LongRoPE).
      factor_from_ratio: a missing `factor` is max / original (transformers 5.x: YaRN, LongRoPE).
      hf_original_is_max: transformers ignores the dict's original length and always uses
        `max_position_embeddings` (dynamic NTK).
      check: cross-key checks on the normalised dict, after every key was checked alone; it
        may drop a key that the method ignores (YaRN's lone mscale), warning.
      regime: `regime(s, above) -> int32 []`, an id that changes exactly when the frequencies
        change (`above` = s > L0); length-dependent methods only.
      stretch: `stretch(factor, original, rotary_dim) -> dict`, the dict that stretches a model
        trained at length `original` to `factor * original` (what the study evaluates); None
        for a method that does not extend the context.
    """

    name: str
    function: Callable[..., Any]
    keys: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    length_dependent: bool = False
    varies: Callable[[Mapping[str, Any]], bool] = lambda cfg: True
    aliases: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=lambda: _NO_DEFAULTS)
    needs_base: bool = False
    min_rotary_dim: int = 2
    original_from_max: bool = False
    factor_from_ratio: bool = False
    hf_original_is_max: bool = False
    check: Callable[[dict[str, Any]], None] | None = None
    regime: Callable[[jax.Array, jax.Array], jax.Array] = _original_only
    stretch: Callable[[float, int, int], dict[str, Any]] | None = None

    def __call__(self, inv_freq, cfg: Mapping[str, Any], *, base: float, seq_len=None):
        """Applies the method to `inv_freq` with the hyperparameters of a validated dict."""
        kwargs = {k: cfg[k] for k in self.keys if cfg.get(k) is not None}
        if self.needs_base:
            kwargs["base"] = base
        if self.length_dependent:
            kwargs["seq_len"] = seq_len
        return self.function(inv_freq, **kwargs)


_METHODS: dict[str, Method] = {}
_ALIASES: dict[str, str] = {}


def register(record: Method) -> Method:
    """Adds a method (and its aliases); ValueError if the name or an alias is taken."""
    for name in (record.name, *record.aliases):
        if name in _METHODS or name in _ALIASES:
            raise ValueError(f"rope scaling method {name!r} is already registered")
    unknown = sorted(set(record.required) - set(record.keys))
    if unknown:
        raise ValueError(f"method {record.name!r}: required keys {unknown} are not in its keys")
    _METHODS[record.name] = record
    _ALIASES.update(dict.fromkeys(record.aliases, record.name))
    return record


def methods(*, stretchable: bool = False) -> tuple[str, ...]:
    """The registered method names, in registration order (aliases excluded); with
    `stretchable=True` only those with a `stretch` (the context extensions a study evaluates:
    every method but "default")."""
    return tuple(n for n, r in _METHODS.items() if r.stretch is not None or not stretchable)


def method(name: str) -> Method:
    """The record of `name` (an alias resolves); ValueError listing the valid names."""
    name = _ALIASES.get(name, name)
    if name not in _METHODS:
        raise ValueError(f"unknown rope_type={name!r}; valid: {', '.join(_METHODS)}")
    return _METHODS[name]


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
    return method(rope_type).name


def stretch(name: str, *, factor: float, original_max_position_embeddings: int,
            rotary_dim: int) -> dict[str, Any]:
    """The scaling dict of method `name` that stretches RoPE from L0 to factor * L0."""
    record = method(name)
    if record.stretch is None:
        raise ValueError(f"rope_type={name!r} does not extend the context; valid: "
                         f"{', '.join(methods(stretchable=True))}")
    return record.stretch(float(factor), int(original_max_position_embeddings), int(rotary_dim))


# --- the built-in methods ----------------------------------------------------------------


def _factor_only(factor, original, rotary_dim):
    return {"factor": factor}


def _with_original(name):
    def make(factor, original, rotary_dim):
        return {"rope_type": name, "factor": factor, ORIGINAL: original}
    return make


def _stretch_llama3(factor, original, rotary_dim):
    # Llama 3.1's band edges: wavelengths L0 (low_freq_factor 1) and L0 / 4 (high_freq_factor 4)
    return {"rope_type": "llama3", "factor": factor, ORIGINAL: original,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def _stretch_longrope(factor, original, rotary_dim):
    # LongRoPE's per-dimension factors are found by search; without one we use the NTK-aware
    # rescale long_factor_i = factor^(2i / (d - 2)) (the lowest frequency divided by exactly
    # `factor`: the frequencies of `ntk`), short_factor = 1, plus LongRoPE's attention factor.
    r = rotary_dim // 2
    long_factor = [factor ** (2 * i / (rotary_dim - 2)) if rotary_dim > 2 else factor
                   for i in range(r)]
    return {"rope_type": "longrope", "factor": factor, ORIGINAL: original,
            "short_factor": [1.0] * r, "long_factor": long_factor}


def _check_yarn(cfg):
    if cfg["beta_fast"] <= cfg["beta_slow"]:
        raise ValueError(f"beta_fast must be > beta_slow, got beta_fast={cfg['beta_fast']:g} "
                         f"and beta_slow={cfg['beta_slow']:g}")
    if "attention_factor" not in cfg and bool(cfg.get("mscale")) != bool(
            cfg.get("mscale_all_dim")):
        given = "mscale" if cfg.get("mscale") else "mscale_all_dim"
        warn(f"YaRN: {given}={cfg[given]:g} is ignored unless both mscale and "
                      "mscale_all_dim are non-zero (as in Hugging Face); the attention factor "
                      "is 0.1 ln(factor) + 1")
        del cfg[given]  # ignored, as in Hugging Face: the normalised dict says what is used


def _check_longrope(cfg):
    if "factor" not in cfg and "attention_factor" not in cfg:
        raise ValueError("rope_type='longrope' needs 'factor' or 'attention_factor' (or "
                         "max_position_embeddings= to infer factor = max / original)")


def _check_llama3(cfg):
    low, high = cfg["low_freq_factor"], cfg["high_freq_factor"]
    if low > high:  # equal: a step (Llama 4 Scout), see formulas.llama3
        raise ValueError(f"low_freq_factor must be <= high_freq_factor, got "
                         f"low_freq_factor={low:g} and high_freq_factor={high:g}")


register(Method("default", fn.default))
register(Method("linear", fn.linear, keys=("factor",), required=("factor",),
                stretch=lambda f, o, d: {"rope_type": "linear", **_factor_only(f, o, d)}))
register(Method("ntk", fn.ntk, keys=("factor",), required=("factor",), min_rotary_dim=4,
                stretch=lambda f, o, d: {"rope_type": "ntk", **_factor_only(f, o, d)}))
register(Method("dynamic", fn.dynamic, keys=("factor", ORIGINAL), required=("factor", ORIGINAL),
                length_dependent=True, min_rotary_dim=4, original_from_max=True,
                hf_original_is_max=True, stretch=_with_original("dynamic")))
register(Method(
    "yarn", fn.yarn,
    keys=("factor", ORIGINAL, "beta_fast", "beta_slow", "truncate", "mscale", "mscale_all_dim",
          "attention_factor"),
    required=("factor", ORIGINAL), defaults={"beta_fast": 32.0, "beta_slow": 1.0,
                                             "truncate": True},
    needs_base=True, original_from_max=True, factor_from_ratio=True, check=_check_yarn,
    stretch=_with_original("yarn")))
register(Method(
    "longrope", fn.longrope,
    keys=("factor", ORIGINAL, "short_factor", "long_factor", "attention_factor"),
    required=(ORIGINAL, "short_factor", "long_factor"), length_dependent=True,
    varies=lambda cfg: list(cfg.get("short_factor") or []) != list(cfg.get("long_factor") or []),
    regime=lambda s, above: above.astype(jnp.int32), aliases=("su",), original_from_max=True,
    factor_from_ratio=True, check=_check_longrope, stretch=_stretch_longrope))
register(Method(
    "llama3", fn.llama3, keys=("factor", ORIGINAL, "low_freq_factor", "high_freq_factor"),
    required=("factor", ORIGINAL, "low_freq_factor", "high_freq_factor"), check=_check_llama3,
    stretch=_stretch_llama3))
register(Method("proportional", fn.proportional, keys=("factor", "partial_rotary_factor")))
