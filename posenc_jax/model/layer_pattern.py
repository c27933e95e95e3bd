"""Per-layer attention settings: one `LayerSpec` per layer, resolved once from the config.

Real configs describe their layers in several spellings; the config resolves them all here,
into one tuple of `LayerSpec`s (`TransformerConfig.layer(i)`), which is all a block, the scan
and the cache read:

    layer_encodings   one encoding per layer (name or (name, kwargs)): NoPE layers, per-layer
                      RoPE bases (Gemma 3), Llama 4's `no_rope_layers`
    sliding_window    None, an int W (every layer) or one int-or-None per layer: key kp is
                      visible to query qp iff qp - kp < W
    attention_chunk   None, an int C (every layer) or one int-or-None per layer: key kp is
                      visible to query qp iff kp // C == qp // C (Llama 4's chunked layers)
    layer_pattern     a group of per-layer dicts, repeated num_layers / len(group) times (its
                      length divides num_layers, or equals it); keys (all optional):
                        "encoding"    name or (name, kwargs)
                        "window"      int or None
                        "chunk"       int or None
                        "qk_l2_norm"  bool: q and k divided by their RMS over D, no weights
                                      (Llama 4's `use_qk_norm`, on its RoPE layers)
                        "temperature" bool: queries scaled by `attn_temperature` (below)

A setting comes from `layer_pattern` or from its own field, never both (ValueError naming the
two). Llama 4 (three chunked RoPE layers with QK L2-norm, then a global NoPE layer whose
queries are scaled by the temperature):

    TransformerConfig(..., encoding="rope", attn_temperature={"floor_scale": 8192,
                      "attn_scale": 0.1}, layer_pattern=[
                          {"chunk": 8192, "qk_l2_norm": True}] * 3 + [
                          {"encoding": "nope", "temperature": True}])

The temperature multiplies a query at position p by `log(floor((p + 1) / floor_scale) + 1) *
attn_scale + 1` (transformers' Llama 4, `log1p` of the floor). transformers takes p as the
token's index in the sequence (the cache's slot); here p is the query's explicit position,
which is the same for unpacked sequences (positions arange(L), or the cache's slots) and
restarts with each packed document. Both it and the L2-norm act per position (and per head
vector), so they commute with a rotation: the block applies them before the rotation, which
lets a kernel that rotates inside keep its raw q and k. `group_size` finds the smallest
repeating group of specs, the unit `scan_layers` scans.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from posenc_jax._frozen import _FrozenDict, freeze, thaw
from posenc_jax.checks import boolean, finite_float, positive_int
from posenc_jax.model.moe import is_moe_layer

__all__ = ["PATTERN_KEYS", "LayerSpec", "group_size", "qk_l2_norm", "query_temperature",
           "resolve_layers", "temperature_constants"]

Array = jax.Array
#: The keys a `layer_pattern` entry may hold, and the field each one replaces.
PATTERN_KEYS = {"encoding": "layer_encodings", "window": "sliding_window",
                "chunk": "attention_chunk", "qk_l2_norm": None, "temperature": None}


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer's attention settings (hashable; equal specs mean the same traced block).

    encoding: (name, frozen kwargs). window, chunk: int or None. qk_l2_norm: bool.
    temperature: (floor_scale, attn_scale) or None. moe: the layer's MLP is the mixture of
    experts (`posenc_jax.model.moe`; `moe_layers`)."""

    encoding: tuple
    window: int | None = None
    chunk: int | None = None
    qk_l2_norm: bool = False
    temperature: tuple[float, float] | None = None
    moe: bool = False


def per_layer(name: str, value: Any, num_layers: int) -> tuple | None:
    """None, or num_layers positive ints / Nones from None, an int or a sequence; None when no
    layer has one. TypeError / ValueError naming `name`."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not (isinstance(value, int) or hasattr(value, "__len__")):
        raise TypeError(f"{name} must be None, an int or a sequence of num_layers="
                        f"{num_layers} entries (int or None), got {name}={value!r}")
    if not hasattr(value, "__len__"):
        value = [value] * num_layers
    if len(value) != num_layers:
        raise ValueError(f"{name} has {len(value)} entries but num_layers={num_layers}")
    out = tuple(None if w is None else positive_int(f"{name}[{i}]", w)
                for i, w in enumerate(value))
    return None if all(w is None for w in out) else out


def temperature_constants(value: Any) -> _FrozenDict | None:
    """`attn_temperature` as a frozen {"floor_scale" > 0, "attn_scale" finite}, or None."""
    if value is None:
        return None
    value = thaw(freeze(value))
    if not isinstance(value, dict):
        raise TypeError(f"attn_temperature must be a dict {{'floor_scale': ..., 'attn_scale': "
                        f"...}} or None, got attn_temperature={value!r}")
    for key in ("floor_scale", "attn_scale"):
        if key not in value:
            raise ValueError(f"attn_temperature needs {key!r} (floor_scale > 0 and attn_scale: "
                             f"the temperature log(floor((p + 1) / floor_scale) + 1) * "
                             f"attn_scale + 1), got attn_temperature={value!r}")
    unknown = sorted(set(value) - {"floor_scale", "attn_scale"})
    if unknown:
        raise ValueError(f"attn_temperature has unknown keys {unknown}; valid: 'floor_scale', "
                         "'attn_scale'")
    return freeze({"floor_scale": finite_float("attn_temperature['floor_scale']",
                                               value["floor_scale"], above=0.0),
                   "attn_scale": finite_float("attn_temperature['attn_scale']",
                                              value["attn_scale"])})


def _pattern(value: Any, num_layers: int) -> tuple | None:
    """`layer_pattern` frozen: a tuple of frozen dicts whose length divides num_layers."""
    if value is None:
        return None
    value = thaw(freeze(value))
    if isinstance(value, (str, dict)) or not isinstance(value, list) or not value:
        raise TypeError(f"layer_pattern must be a non-empty sequence of dicts (one per layer of "
                        f"a repeating group), got layer_pattern={value!r}")
    if num_layers % len(value):
        raise ValueError(f"layer_pattern has {len(value)} entries, which neither divides nor "
                         f"matches num_layers={num_layers}")
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise TypeError(f"layer_pattern[{i}] must be a dict, got {entry!r}")
        unknown = sorted(set(entry) - set(PATTERN_KEYS))
        if unknown:
            raise ValueError(f"layer_pattern[{i}] has unknown keys {unknown}; valid: "
                             f"{', '.join(map(repr, PATTERN_KEYS))}")
    return tuple(freeze(entry) for entry in value)


def _from_pattern(config: Any, key: str, check: Callable[[str, Any], Any]) -> list | None:
    """One value per layer for `key` from `layer_pattern` (None when no entry names it; an
    entry without it gives None), each given value checked as `check(name, value)`."""
    pattern = config.layer_pattern or ()
    if not any(key in dict(entry) for entry in pattern):
        return None
    group = []
    for j, entry in enumerate(pattern):
        value = dict(entry).get(key)
        group.append(None if value is None else check(f"layer_pattern[{j}][{key!r}]", value))
    return group * (config.num_layers // len(pattern))


def _settle(config: Any, set_, key: str, values: tuple | None) -> None:
    """Writes what the pattern sets for `key` into the key's own field (so every reader of
    `sliding_window`, `attention_chunk` or `layer_encodings` sees the resolved layers); a
    field given with other values is refused, naming both."""
    field = PATTERN_KEYS[key]
    given = getattr(config, field)
    if given is not None and given != values:
        raise ValueError(f"{field}={given!r} differs from what layer_pattern sets for {key!r} "
                         f"({values!r}); give the per-layer {key} in one place")
    set_(field, values)


def resolve_layers(config: Any, set_) -> tuple[LayerSpec, ...]:
    """Validates and normalises the per-layer fields of a `TransformerConfig` under
    construction (`set_(name, value)` writes a frozen field) and returns one `LayerSpec` per
    layer. Layer encodings arrive already frozen as (name, kwargs) entries (or None); what
    `layer_pattern` sets is written into `sliding_window`, `attention_chunk` and
    `layer_encodings` too."""
    n = config.num_layers
    default = (config.encoding, config.encoding_kwargs)
    set_("layer_pattern", _pattern(config.layer_pattern, n))
    set_("sliding_window", per_layer("sliding_window", config.sliding_window, n))
    set_("attention_chunk", per_layer("attention_chunk", config.attention_chunk, n))
    set_("attn_temperature", temperature_constants(config.attn_temperature))
    encodings = _from_pattern(config, "encoding",
                              lambda name, entry: config.freeze_encoding(entry, name))
    if encodings is not None:
        _settle(config, set_, "encoding", tuple(e or default for e in encodings))
    for key in ("window", "chunk"):
        values = _from_pattern(config, key, positive_int)
        if values is not None:
            _settle(config, set_, key, None if all(v is None for v in values) else tuple(values))
    encodings = config.layer_encodings or [default] * n
    windows = config.sliding_window or [None] * n
    chunks = config.attention_chunk or [None] * n
    l2 = _from_pattern(config, "qk_l2_norm", boolean) or [False] * n
    temps = _from_pattern(config, "temperature", boolean) or [False] * n
    constants = dict(config.attn_temperature or ())
    specs = []
    for i in range(n):
        if temps[i] and not constants:
            raise ValueError(f"layer_pattern[{i % len(config.layer_pattern)}]['temperature']="
                             "True needs attn_temperature={'floor_scale': ..., 'attn_scale': "
                             "...} (the floor scale and the attention scale of the query "
                             "temperature)")
        specs.append(LayerSpec(
            encoding=encodings[i], window=windows[i], chunk=chunks[i],
            qk_l2_norm=bool(l2[i]),
            temperature=(constants["floor_scale"], constants["attn_scale"]) if temps[i]
            else None, moe=is_moe_layer(config, i)))
    if config.attn_temperature is not None and not any(s.temperature for s in specs):
        raise ValueError(f"attn_temperature={thaw(config.attn_temperature)!r} is set but no "
                         "layer asks for it: set 'temperature': True in layer_pattern")
    if not config.causal and any(s.window is not None for s in specs):
        windows = [s.window for s in specs]
        raise ValueError(f"sliding_window={windows} needs causal=True (the window is "
                         "qp - kp < W under the causal rule)")
    return tuple(specs)


def group_size(specs: tuple) -> int:
    """The smallest g such that layer i has the settings of layer i - g for every i >= g (the
    last partial group, the remainder, may be shorter): what a scan repeats. len(specs) when
    nothing repeats."""
    n = len(specs)
    for g in range(1, n + 1):
        if all(specs[i] == specs[i - g] for i in range(g, n)):
            return g
    return n


def qk_l2_norm(x: Array, *, eps: float) -> Array:
    """x / sqrt(mean(x^2 over D) + eps), in float32, cast back (transformers' Llama4TextL2Norm;
    eps is the config's norm_eps). x: [B, T, H|K, D]."""
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def query_temperature(positions: Array, *, floor_scale: float, attn_scale: float) -> Array:
    """float32 [B|1, T, 1, 1]: log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1 for
    positions int [B|1, T] (what Llama 4 multiplies its NoPE layers' queries by)."""
    p = positions.astype(jnp.float32)
    scale = jnp.log1p(jnp.floor((p + 1.0) / jnp.float32(floor_scale))) * jnp.float32(
        attn_scale) + 1.0
    return scale[:, :, None, None]
