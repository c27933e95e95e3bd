"""A family's config.json dict -> `TransformerConfig` keyword arguments, through its record.

The record (`families.record.Family`) says what transformers' model class does beyond the
shared decoder: the class defaults for keys a config.json may omit, the activation, qkv bias,
QK-norm, the Gemma features and where the sliding windows go. The positional part (RoPE per
layer, YaRN, Llama 3 scaling, LongRoPE, partial rotary) and the attention shapes come from
`posenc_jax.encodings.hf` (`transformer_config_kwargs`), the one reader of transformers' RoPE.

Sliding windows per layer (`Family.windows`), as the family's attention class sets them:

    "all"          every layer gets `sliding_window` (Mistral, Phi-3); null: none
    "qwen"         only with `use_sliding_window`: layers i >= `max_window_layers` (or the
                   `layer_types` list when config.json has one) get `sliding_window`
    "layer_types"  the layers whose `layer_types` entry is "sliding_attention" (Gemma 3; the
                   list defaults to its 5-sliding-1-full pattern)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc_jax.checks import finite_float, json_count
from posenc_jax.encodings.hf.families import family_of
from posenc_jax.encodings.hf.layers import transformer_config_kwargs
from posenc_jax.encodings.hf.read import layer_types, resolve
from posenc_jax.pretrained.families.record import Family, refuse
from posenc_jax.pretrained.families.registry import by_model_type

__all__ = ["config_kwargs", "family_of_config", "layer_windows"]


def family_of_config(config: Mapping[str, Any], where: Any) -> tuple[Family, dict, str]:
    """(the record, the text model's flat settings with the class defaults, model_type).

    ValueError naming `where` (the checkpoint's path) for a model_type no record reads."""
    flat, model_type, _ = resolve(config)
    family = by_model_type(model_type, where=where)
    for key, value in family.defaults.items():
        flat.setdefault(key, value)
    return family, flat, model_type


def layer_windows(family: Family, flat: Mapping[str, Any], model_type: str,
                  num_layers: int) -> list | None:
    """One sliding window (or None) per layer, as the family's attention class sets them."""
    if family.windows == "none":
        return None
    w = flat.get("sliding_window")
    w = None if w is None else json_count("sliding_window", w)
    if family.windows == "all":
        return None if w is None else [w] * num_layers
    if family.windows == "qwen":
        if not flat.get("use_sliding_window") or w is None:
            return None
        types = flat.get("layer_types") or [
            "sliding_attention" if i >= flat["max_window_layers"] else "full_attention"
            for i in range(num_layers)]
    else:
        types = layer_types(flat, family_of(model_type))
    return [w if t == "sliding_attention" else None for t in types]


def _tie(value: Any, where: Any) -> bool:
    """tie_word_embeddings: true / false (null: false); "no" or 0 is refused, not bool()-ed."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{where}: config.json tie_word_embeddings must be true or false, got "
                        f"{value!r} ({type(value).__name__})")
    return bool(value)


def config_kwargs(config: Mapping[str, Any], *, where: Any) -> dict[str, Any]:
    """Keyword arguments of `TransformerConfig` for a family's config.json dict.

    Raises ValueError naming `where` for an unsupported model_type, activation, attention
    soft-capping, bidirectional attention, MLP biases or attention biases in a family whose
    class has none on o_proj; then the record's own `read_keys` (MoE, per-layer patterns)."""
    family, flat, model_type = family_of_config(config, where)
    out = transformer_config_kwargs({**flat, "model_type": model_type})
    act = flat.get(family.activation_key)
    if act not in family.activations:
        raise refuse(where, family.activation_key, act,
                           f"valid: {', '.join(map(repr, family.activations))}")
    for key in ("mlp_bias", "attn_logit_softcapping", "use_bidirectional_attention"):
        if flat.get(key):
            raise refuse(where, key, flat[key], "only false / null")
    bias = flat.get("attention_bias")
    if bias is not None and not isinstance(bias, bool):
        raise TypeError(f"{where}: config.json attention_bias must be true or false, got "
                        f"{bias!r} ({type(bias).__name__})")
    if bias and not family.attention_bias:  # o_proj would carry a bias too
        raise refuse(where, "attention_bias", bias, "only false")
    bias = bool(bias) and family.attention_bias
    out.update(mlp_activation=family.activations[act], qkv_bias=family.qkv_bias or bias,
               o_bias=bias, attention_sinks=family.sinks, qk_norm=family.qk_norm,
               tie_embeddings=_tie(flat.get("tie_word_embeddings"), where),
               norm_eps=finite_float("rms_norm_eps", flat["rms_norm_eps"], above=0.0),
               sliding_window=layer_windows(family, flat, model_type, out["num_layers"]))
    if family.gemma:
        cap = flat.get("final_logit_softcapping")
        out.update(embed_scale="sqrt", norm_offset=1.0, post_norms=True,
                   query_pre_attn_scalar=finite_float(
                       "query_pre_attn_scalar", flat["query_pre_attn_scalar"], above=0.0),
                   final_logit_softcap=None if cap is None else finite_float(
                       "final_logit_softcapping", cap, above=0.0))
    elif family.scaled:
        out.update(embed_scale="sqrt", norm_offset=1.0)
    else:
        out.update(embed_scale=None)
    if family.read_keys is not None:
        family.read_keys(flat, out, where)
    return out
