"""The study's entries: one per model of its tables, each a registered encoding or a variant.

An entry is what one line of the tables is named by (results.csv's `encoding` column): every
registered encoding (`posenc_jax.names()`) is one, as it is; `config.variants` adds more, each
a registered encoding trained with other attention settings (TransformerConfig fields):

    config.variants = {"rope-window-sinks": {"encoding": "rope", "model": {
                           "sliding_window": "L/2", "attention_sinks": True}}}

A variant is trained, scaled, fine-tuned and scored exactly as its encoding would be; only its
`model` keys differ. Lengths in those keys may be written over L (the length grammar of
`train.engine.lengths`: 'L/2', '2L', an int): `sliding_window` and `attention_chunk` (an int or
one per layer), a `layer_pattern` entry's `window` and `chunk`, and `attn_temperature`'s
`floor_scale`. Anything wrong is a ValueError / TypeError naming `config.variants.<name>`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import posenc_jax
from posenc_jax.model.config import TransformerConfig, freeze, thaw
from train.engine import lengths, names

__all__ = ["Entry", "entry", "entry_names", "notes", "variant_names"]

#: The TransformerConfig fields a variant may not set: what the study itself decides.
_FIXED = ("encoding", "encoding_kwargs", "vocab_size")
_MODEL_FIELDS = {f.name for f in dataclasses.fields(TransformerConfig)}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry: its name, the registered encoding it trains, and the model fields it sets
    (frozen, lengths resolved to ints; empty for a plain encoding)."""

    name: str
    encoding: str
    model: Any = ()

    @property
    def overrides(self) -> dict[str, Any]:
        return dict(thaw(self.model) or {})


def _variants(config) -> dict[str, Any]:
    raw = config.get("variants") or {}
    return dict(raw.to_dict() if hasattr(raw, "to_dict") else raw)


def variant_names(config) -> tuple[str, ...]:
    """The names of `config.variants`, in the order given."""
    return tuple(_variants(config))


def entry_names(config) -> tuple[str, ...]:
    """`config.encodings` as entries. 'all' is every registered encoding and every variant but
    those in `config.encodings_excluded`, those named in `config.encoding_order` first (in that
    order), then the rest alphabetically."""
    registered = posenc_jax.names()
    valid = (*registered, *(n for n in variant_names(config) if n not in registered))
    if isinstance(config.encodings, str) and config.encodings.strip() == "all":
        order = [n.strip() for n in str(config.get("encoding_order") or "").split(",")]
        skip = set(names.names(config.get("encodings_excluded") or "",
                               key="config.encodings_excluded", valid=valid))
        first = [n for n in order if n in valid and n not in skip]
        return tuple(first + sorted(set(valid) - set(first) - skip))
    return names.names(config.encodings, key="config.encodings", valid=valid)


def _length(value: Any, where: str, train_len: int) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)):
        return [_length(v, f"{where}[{i}]", train_len) for i, v in enumerate(value)]
    return lengths.length(value, base="L", value=train_len, what=where)


def _resolve(name: str, model: dict[str, Any], train_len: int) -> dict[str, Any]:
    """The variant's model keys with their lengths as ints."""
    where = f"config.variants.{name}.model"
    out = dict(model)
    for key in ("sliding_window", "attention_chunk"):
        if key in out:
            out[key] = _length(out[key], f"{where}.{key}", train_len)
    if out.get("layer_pattern") is not None:
        pattern = out["layer_pattern"]
        if not isinstance(pattern, (list, tuple)):
            raise TypeError(f"{where}.layer_pattern must be a list of dicts, got {pattern!r}")
        out["layer_pattern"] = [
            {k: (_length(v, f"{where}.layer_pattern[{i}].{k}", train_len)
                 if k in ("window", "chunk") else v) for k, v in dict(e).items()}
            if isinstance(e, Mapping) else e for i, e in enumerate(pattern)]
    temperature = out.get("attn_temperature")
    if isinstance(temperature, Mapping) and "floor_scale" in temperature:
        out["attn_temperature"] = {**temperature, "floor_scale": _length(
            temperature["floor_scale"], f"{where}.attn_temperature.floor_scale", train_len)}
    return out


def entry(config, name: str, *, train_len: int) -> Entry:
    """The entry called `name` (a variant when `config.variants` has it, else the registered
    encoding), its lengths resolved against L = `train_len`."""
    spec = _variants(config).get(name)
    if spec is None:
        return Entry(name=name, encoding=name)
    where = f"config.variants.{name}"
    if not isinstance(spec, Mapping):
        raise TypeError(f"{where} must be a dict {{'encoding': ..., 'model': {{...}}}}, got "
                        f"{spec!r}")
    unknown = sorted(set(spec) - {"encoding", "model"})
    if unknown:
        raise ValueError(f"{where} has unknown keys {unknown}; valid: 'encoding', 'model'")
    encoding = spec.get("encoding")
    if encoding not in posenc_jax.names():
        raise ValueError(f"{where}.encoding={encoding!r} is not a registered encoding; valid: "
                         f"{', '.join(posenc_jax.names())}")
    if name in posenc_jax.names():
        raise ValueError(f"{where}: {name!r} is a registered encoding's name; give the variant "
                         "another name")
    model = dict(spec.get("model") or {})
    bad = sorted(set(model) - _MODEL_FIELDS) + sorted(set(model) & set(_FIXED))
    if bad:
        raise ValueError(f"{where}.model has keys {bad} that a variant cannot set (a variant "
                         f"sets TransformerConfig fields other than {', '.join(_FIXED)}; its "
                         "encoding is 'encoding')")
    return Entry(name=name, encoding=encoding,
                 model=freeze(_resolve(name, model, train_len)))


def notes(config, names, *, train_len: int) -> list[str]:
    """report.md's line for each variant among `names`: its encoding and model keys."""
    out = []
    for name in (n for n in names if n in variant_names(config)):
        e = entry(config, name, train_len=train_len)
        out.append(f"- `{name}`: `{e.encoding}` trained and evaluated with the model keys "
                   f"{e.overrides} (`config.variants`; lengths resolved at L = {train_len}); "
                   f"everything else as `{e.encoding}`.")
    return out
