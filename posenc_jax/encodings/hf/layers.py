"""A transformers config.json -> the per-layer encodings of a `TransformerConfig`.

    kwargs = transformer_config_kwargs(gemma3_config_json)
    model = Transformer(TransformerConfig(**kwargs), rngs=nnx.Rngs(0))

Per-layer models (Gemma 3, Gemma 4) get one `(name, kwargs)` entry per layer from
`layer_types`; single-RoPE models get `encoding` + `encoding_kwargs`; multimodal RoPE models
get the `mrope` encoding (the model then takes positions [3, B, L]). Only the positional part
and the attention shapes are read: norms, soft-capping, sliding windows, MoE and the like
are not part of posenc_jax's model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc_jax.checks import json_count
from posenc_jax.encodings.hf.read import layer_types, read_layer, resolve
from posenc_jax.encodings.hf.rotate import check_layer

__all__ = ["layer_encodings_from_hf", "transformer_config_kwargs"]


def _entry(config: Mapping[str, Any], layer_type: str | None) -> tuple[str, dict, int]:
    layer = read_layer(config, layer_type)
    check_layer(config, layer)  # never a model that rotate_like_hf refuses
    if layer.pass_dim or layer.deinterleave:
        raise ValueError(f"model_type={layer.model_type!r} (MLA: q/k head dim "
                         f"{layer.q_head_dim} with a {layer.pass_dim}-dim pass-through part) has "
                         "no TransformerConfig equivalent; use rope_kwargs_from_hf_config for its "
                         "rotary part")
    kwargs = {k: v for k, v in layer.kwargs.items() if v is not None}
    return layer.encoding, kwargs, layer.q_head_dim


def layer_encodings_from_hf(config: Mapping[str, Any]) -> list[tuple[str, dict]] | None:
    """One (name, kwargs) per layer for a per-layer RoPE config (`layer_types`), else None.

    Raises ValueError when the layer types need different head dims (Gemma 4's
    global_head_dim): a TransformerConfig has one head_dim."""
    flat, _, family = resolve(config)
    types = layer_types(flat, family)
    if types is None:
        return None
    entries = {t: _entry(config, t) for t in sorted(set(types))}
    dims = {t: e[2] for t, e in entries.items()}
    if len(set(dims.values())) > 1:
        raise ValueError(f"layer types need different head dims {dims} (e.g. Gemma 4's "
                         "global_head_dim); a TransformerConfig has one head_dim: set "
                         "global_head_dim equal to head_dim for a model built here")
    return [(entries[t][0], entries[t][1]) for t in types]


def transformer_config_kwargs(config: Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """Keyword arguments of `TransformerConfig` for a transformers config.json dict: vocab,
    layers, widths, heads and the positional encoding(s); `overrides` replace any of them, and
    supply those the config lacks (a trimmed config without vocab_size, say)."""
    flat, _, _ = resolve(config)
    keys = {"vocab_size": "vocab_size", "num_layers": "num_hidden_layers",
            "embed_dim": "hidden_size", "num_heads": "num_attention_heads",
            "mlp_dim": "intermediate_size"}
    for mine, theirs in keys.items():
        if theirs not in flat and mine not in overrides:
            raise ValueError(f"config needs {theirs!r} to build a TransformerConfig (or pass "
                             f"{mine}= as an override)")
    out = {mine: json_count(theirs, flat[theirs]) for mine, theirs in keys.items()
           if mine not in overrides}
    if flat.get("num_key_value_heads") is not None:  # 0 is refused, not read as absent
        out["num_kv_heads"] = json_count("num_key_value_heads", flat["num_key_value_heads"])
    layers = layer_encodings_from_hf(config)
    if layers is None:
        name, kwargs, head_dim = _entry(config, None)
        out.update(encoding=name, encoding_kwargs=kwargs)
    else:
        name, kwargs = layers[0]
        head_dim = kwargs["head_dim"]
        out.update(encoding="nope", layer_encodings=layers)
    out["head_dim"] = head_dim
    out.update(overrides)
    return out
