"""Read one layer's RoPE from a transformers config.json dict, as transformers 5.x does.

`read_layer(config, layer_type)` returns a `LayerRope`: the posenc_jax encoding (name and
kwargs) that rotates like that layer, plus what transformers' apply function does around it
(head dims, DeepSeek's pass-through prefix and de-interleaved output). Reading order, in
transformers' priority (checked against 4.57.6 and 5.24.0 by tests/test_hf_*.py):

* the text model's settings: `text_config` (multimodal configs) over the top level; the
  model class's defaults (`families.FAMILIES`) for keys the file omits;
* the RoPE dict: per layer type for Gemma 3 (legacy `rope_theta` -> full_attention,
  `rope_local_base_freq` -> sliding_attention, `rope_scaling` merged into full_attention only)
  and Gemma 4, or any `rope_parameters` keyed by layer type; else `rope_scaling` if non-empty,
  else `rope_parameters`;
* base: the dict's `rope_theta`, else top-level `rope_theta` (GPT-NeoX: `rotary_emb_base`),
  else 10000; partial_rotary_factor: the dict's, else top level, else GPT-NeoX's `rotary_pct`;
* head_dim: `qk_rope_head_dim` (MLA), Gemma 4's `global_head_dim` on full_attention layers,
  `head_dim`, else hidden_size // num_attention_heads;
* original_max_position_embeddings for YaRN / LongRoPE / Llama-3: a TOP-LEVEL value wins
  over the dict's (Phi-3's class always has one, 4096 by default); dynamic NTK always uses
  max_position_embeddings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from posenc_jax.checks import boolean, finite_float, integer, json_count, warn
from posenc_jax.encodings.hf.families import Family, family_of
from posenc_jax.encodings.rope_scaling import method, resolve_type, validate

__all__ = ["LayerRope", "layer_types", "read_layer", "resolve", "text_config"]

_DEFAULT_THETA = 10000.0
_GEMMA3_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")
_PER_LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True)
class LayerRope:
    """One layer's rotation: `posenc_jax.get(encoding, **kwargs)` plus transformers' framing.

    q_head_dim: D of q and k in that layer; pass_dim: features before the rotary part
    (DeepSeek's qk_nope_head_dim, else 0); deinterleave: DeepSeek's apply returns the rotated
    pairs de-interleaved; full_apply: transformers applies cos/sin over the whole head dim."""

    model_type: str | None
    encoding: str
    kwargs: dict
    q_head_dim: int
    pass_dim: int = 0
    deinterleave: bool = False
    full_apply: bool = False


def text_config(config: Mapping[str, Any]) -> tuple[dict, str | None]:
    """(the text model's settings as one flat dict, model_type)."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict (a parsed config.json), got "
                        f"{type(config).__name__}")
    flat, model_type = dict(config), config.get("model_type")
    inner = config.get("text_config")
    if inner is not None:
        if not isinstance(inner, Mapping):
            raise TypeError(f"text_config must be a dict, got {inner!r}")
        flat.pop("text_config")
        flat.update(inner)
        model_type = inner.get("model_type") or model_type
    if model_type is not None and not isinstance(model_type, str):
        raise TypeError(f"model_type must be a str, got model_type={model_type!r} "
                        f"({type(model_type).__name__})")
    return flat, model_type


def resolve(config: Mapping[str, Any]) -> tuple[dict, str | None, Family | None]:
    """(the text model's settings with the model class's defaults filled in, model_type, its
    `Family` or None). A config without model_type but with GPT-NeoX's own `rotary_pct` key is
    read as gpt_neox."""
    flat, model_type = text_config(config)
    family = family_of(model_type)
    if model_type is None and "rotary_pct" in flat:  # GPT-NeoX's own key
        family, model_type = family_of("gpt_neox"), "gpt_neox"
    for key, value in (family.defaults if family else {}).items():
        flat.setdefault(key, value)
    return flat, model_type, family


def _nested(raw: Any) -> list[str]:
    return sorted(k for k, v in raw.items() if isinstance(v, Mapping)) if isinstance(
        raw, Mapping) else []


def layer_types(flat: Mapping[str, Any], family: Family | None) -> list[str] | None:
    """The per-layer RoPE keys, one per layer (None for a single-RoPE model)."""
    types = flat.get("layer_types")
    per_layer = family is not None and family.per_layer is not None
    if not per_layer and not _nested(flat.get("rope_parameters")):
        return None
    if types is None and per_layer:  # the class default: 5 sliding, then 1 full
        pattern = json_count("sliding_window_pattern", flat.get("sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(json_count("num_hidden_layers", flat["num_hidden_layers"]))]
        if family.per_layer == "gemma4":
            types[-1] = "full_attention"
    if types is None:
        raise ValueError(f"rope_parameters is keyed by layer type {_nested(flat['rope_parameters'])}"
                         " but the config has no layer_types")
    if isinstance(types, str) or not isinstance(types, Sequence) or not all(
            isinstance(t, str) for t in types):
        raise TypeError(f"layer_types must be a list of str, got layer_types={types!r}")
    nested = _nested(flat.get("rope_parameters"))
    known = nested or (_PER_LAYER_TYPES if per_layer else ())
    unknown = sorted({t for t in types if t not in known})
    if unknown:  # transformers fails too (its rope dict has no entry for that type)
        where = ("rope_parameters' keys" if nested else
                 f"the layer types of {family.per_layer} models")
        raise ValueError(f"layer_types has {unknown} (at layer {types.index(unknown[0])}), not "
                         f"one of {where} {sorted(known)}")
    num_layers = flat.get("num_hidden_layers")
    if num_layers is not None and len(types) != json_count("num_hidden_layers", num_layers):
        raise ValueError(f"layer_types has {len(types)} entries but num_hidden_layers="
                         f"{num_layers} (transformers requires one per layer)")
    return list(types)


def _layer_dict(flat: dict, family: Family | None, layer_type: str | None) -> dict:
    if layer_type is not None and not isinstance(layer_type, str):
        raise TypeError(f"layer_type must be a str or None, got layer_type={layer_type!r} "
                        f"({type(layer_type).__name__})")
    types = layer_types(flat, family)
    if types is None:
        if layer_type is not None:
            raise ValueError(f"layer_type={layer_type!r} given, but this config has one RoPE "
                             "for every layer (no per-layer rope_parameters); pass "
                             "layer_type=None")
        raw = flat.get("rope_scaling") or flat.get("rope_parameters") or {}
        if not isinstance(raw, Mapping):
            raise TypeError(f"rope_scaling / rope_parameters must be a dict, got {raw!r}")
        return dict(raw)
    if layer_type is None:
        raise ValueError(f"this config has per-layer RoPE (layer types {sorted(set(types))}); "
                         "pass layer_type= one of them")
    if layer_type not in types:
        raise ValueError(f"unknown layer_type={layer_type!r}; the config's layer_types are "
                         f"{sorted(set(types))}")
    nested = flat.get("rope_parameters") or {}
    if nested and not _nested(nested):
        raise ValueError(f"rope_parameters must be keyed by layer type {sorted(set(types))} "
                         f"for this model, got keys {sorted(nested)}")
    if nested and layer_type not in nested:  # transformers: a KeyError, not a default RoPE
        raise ValueError(f"rope_parameters is keyed by layer type {sorted(nested)} but has no "
                         f"entry for layer_type={layer_type!r}, which layer_types uses")
    raw = dict(nested.get(layer_type) or {"rope_type": "default"})
    if family is not None and family.per_layer == "gemma3":
        if layer_type == "full_attention" and flat.get("rope_scaling"):
            raw.update(flat["rope_scaling"])
        legacy = "rope_theta" if layer_type == "full_attention" else "rope_local_base_freq"
        raw.setdefault("rope_theta", flat.get(legacy, _GEMMA3_THETA.get(layer_type)))
    raw.setdefault("rope_theta", flat.get("rope_theta", _DEFAULT_THETA))
    return raw


def _head_dim(flat: Mapping[str, Any], family: Family | None, layer_type: str | None) -> int:
    keys = ["qk_rope_head_dim", "head_dim"]
    if family is not None and family.per_layer == "gemma4" and layer_type == "full_attention":
        keys.insert(1, "global_head_dim")
    for key in keys:
        if flat.get(key):  # 0 and null mean "not set", as in transformers' `or`
            return json_count(key, flat[key])
    missing = [key for key in ("hidden_size", "num_attention_heads") if key not in flat]
    if missing:
        raise ValueError(f"config needs head_dim (or hidden_size and num_attention_heads); "
                         f"missing {missing[0]!r}")
    return (json_count("hidden_size", flat["hidden_size"])
            // json_count("num_attention_heads", flat["num_attention_heads"]))


def _theta_and_fraction(flat: Mapping, raw: dict, family: Family | None) -> tuple[float, Any]:
    neox = family is not None and "rotary_pct" in family.defaults
    base = raw.pop("rope_theta", None)
    if base is None:
        base = flat.get("rotary_emb_base" if neox else "rope_theta")
    base = finite_float("rope_theta", _DEFAULT_THETA if base is None else base, above=0)
    prf = raw.pop("partial_rotary_factor", None)
    for key in (("rotary_pct",) if neox else ("partial_rotary_factor", "rotary_pct")):
        if prf is None:
            prf = flat.get(key)
    return base, prf


def _original_length(flat: Mapping, raw: dict, rope_type: str) -> None:
    key, max_len = "original_max_position_embeddings", flat.get("max_position_embeddings")
    record = method(rope_type)
    if record.hf_original_is_max and max_len is not None:
        if raw.get(key) not in (None, max_len):
            warn(f"dynamic NTK: transformers ignores rope_scaling's {key}="
                          f"{raw[key]} and uses max_position_embeddings={max_len}; so do we")
        raw[key] = max_len
    elif key in record.keys and flat.get(key) is not None:
        if raw.get(key) not in (None, flat[key]):
            warn(f"config has {key}={flat[key]} at the top level and "
                          f"{raw[key]} in its rope dict; the top-level value wins, as in "
                          "transformers 5.x")
        raw[key] = flat[key]


def _yarn_ratio(scaling: Mapping | None, max_len: int | None, rope_type: str) -> None:
    """Warn as transformers 5.24 does (`_validate_yarn_rope_parameters`), then keep the
    explicit factor as it does: YaRN's factor should be max_position_embeddings /
    original_max_position_embeddings (a ratio of 1 is taken as "not given")."""
    if rope_type != "yarn" or scaling is None or max_len is None:
        return
    factor, original = scaling.get("factor"), scaling.get("original_max_position_embeddings")
    if factor is None or not original or max_len / original in (1, factor):
        return
    above = (f"; original_max_position_embeddings={original} is above "
             f"max_position_embeddings={max_len}" if original > max_len else "")
    warn(f"yarn: factor={factor} but max_position_embeddings / "
         f"original_max_position_embeddings = {max_len} / {original} = {max_len / original}"
         f"{above}; the explicit factor is used, as transformers does (it warns too): "
         "correct max_position_embeddings or original_max_position_embeddings")


def _rotary_dim(head_dim: int, prf: Any, rope_type: str, family: Family | None,
                model_type: str | None) -> int:
    if rope_type == "proportional" or (family is not None and family.apply == "full"
                                       and rope_type == "default"):
        return head_dim  # proportional: prf stays in its dict; "full": default ignores prf
    if prf is not None and prf != 1 and family is None and rope_type == "default":
        which = ("without a model_type" if model_type is None else
                 f"with model_type={model_type!r} (not a family posenc_jax knows)")
        raise ValueError(f"partial_rotary_factor={prf!r} {which} is ambiguous: "
                         "transformers' llama-style models ignore it for the default RoPE and "
                         "phi3 / gpt_neox / stablelm rotate only that fraction; give the "
                         "config the \"model_type\" of one of those")
    prf = 1.0 if prf is None else finite_float("partial_rotary_factor", prf, above=0)
    rotary_dim = int(head_dim * prf)
    if rotary_dim % 2 or not 2 <= rotary_dim <= head_dim:
        raise ValueError(f"rotary dim int(head_dim * partial_rotary_factor) = int({head_dim} * "
                         f"{prf:g}) = {rotary_dim} must be even and in [2, {head_dim}]")
    return rotary_dim


def _mrope(raw: dict, flat: Mapping, family: Family | None) -> dict:
    """Pops the multimodal keys off the rope dict; the mrope kwargs ({} for other models)."""
    found = {k: raw.pop(k) for k in _MROPE_KEYS if k in raw}
    if "mrope" in (raw.get("rope_type"), raw.get("type")):
        if family is None or family.mrope is None:
            raise ValueError("rope_type='mrope' needs the model_type of a multimodal RoPE model "
                             "(qwen2_vl, qwen2_5_vl, qwen3_vl); add \"model_type\" to the config")
        raw.pop("type", None)
        raw["rope_type"] = "default"
    if family is None or family.mrope is None:
        return {}
    interleaved = family.mrope == "interleaved"
    said = found.get("mrope_interleaved", flat.get("mrope_interleaved"))
    if said is not None and boolean("mrope_interleaved", said) != interleaved:
        warn(f"mrope_interleaved={said!r} is ignored: transformers' {family.mrope} "
                      f"multimodal RoPE {'interleaves' if interleaved else 'does not interleave'}"
                      " the sections whatever the config says; so do we")
    section = found.get("mrope_section") or flat.get("mrope_section")
    if isinstance(section, str) or not isinstance(section, Sequence):
        raise TypeError(f"mrope_section must be a list of 3 ints, got mrope_section={section!r}")
    return {"mrope_section": tuple(section), "interleaved": interleaved}


def read_layer(config: Mapping[str, Any], layer_type: str | None = None) -> LayerRope:
    """How transformers rotates q and k in a layer of type `layer_type` (None for a model with
    one RoPE). Raises ValueError / TypeError naming the offending key and value."""
    flat, model_type, family = resolve(config)
    raw = _layer_dict(flat, family, layer_type)
    mrope = _mrope(raw, flat, family)
    base, prf = _theta_and_fraction(flat, raw, family)
    head_dim = _head_dim(flat, family, layer_type)
    rope_type = resolve_type(raw) if raw else "default"
    if rope_type == "proportional" and prf is not None:
        raw["partial_rotary_factor"] = prf
    rotary_dim = _rotary_dim(head_dim, prf, rope_type, family, model_type)
    _original_length(flat, raw, rope_type)
    max_len = flat.get("max_position_embeddings")
    max_len = None if max_len is None else json_count("max_position_embeddings", max_len)
    # validated once, here (it warns on stray keys); a method with no keys is plain RoPE
    scaling = validate(raw or {"rope_type": "default"}, rotary_dim=rotary_dim,
                       max_position_embeddings=max_len)
    scaling = scaling if method(rope_type).keys else None
    _yarn_ratio(scaling, max_len, rope_type)
    mla = family is not None and family.apply == "mla"
    interleave = flat.get("rope_interleave") if mla else None  # null: the half layout
    layout = "interleaved" if interleave is not None and boolean(
        "rope_interleave", interleave) else family.layout if family is not None else "half"
    kwargs = {"head_dim": head_dim, "rotary_dim": rotary_dim, "base": base, "scaling": scaling,
              "max_position_embeddings": max_len,
              "layout": layout, **mrope}
    pass_dim = integer("qk_nope_head_dim", flat.get("qk_nope_head_dim") or 0,
                       minimum=0) if mla else 0
    return LayerRope(model_type=model_type, encoding="mrope" if mrope else "rope",
                     kwargs=kwargs, q_head_dim=pass_dim + head_dim, pass_dim=pass_dim,
                     deinterleave=layout == "interleaved" and mla,
                     full_apply=family is None or family.apply == "full")

