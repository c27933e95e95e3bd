"""A `TransformerConfig` -> the config.json of the transformers family that computes the same.

    model_type = choose_model_type(cfg)                # or the loaded checkpoint's own
    config = hf_config(cfg, model_type)                # a dict for config.json

This is the loader's table read backwards: the family records of
`posenc_jax.pretrained.families` (class, activation names, windows, Gemma features) give the
keys, and the result is checked by reading it forwards again (`families.config_kwargs`): when
the config read back is not the model's (a feature the family cannot hold), `hf_config` raises
a ValueError naming each field that differs. Before that, `check_expressible` refuses what no
family here can express at all -- the positional encodings other than RoPE (ALiBi, T5, KERPLE,
FIRE, CoPE, ...), NoPE layers (but Llama 4's), per-layer encodings outside Gemma 3's sliding /
full pattern, RoPE variants transformers has no key for (a layout other than the family's:
rotate-half, Llama 4's interleaved pairs; p-RoPE, Resonance, partial rotary in a full-rotary
family, a scaling method transformers lacks), bidirectional attention, the ungated GELU MLP,
and the features the family does not express (`export_features`, `Family.expresses`: gpt-oss's sinks and o_proj
bias; Llama 4's chunks, QK L2-norm, temperature and NoPE layers) -- with a message naming the
part. A family's own keys (MoE, layer pattern) are written by its record's `write_keys` and
checked by the same read-back (its `read_keys`), which compares the MoE settings too.

Format: transformers 5.x (`rope_parameters`, per layer type for Gemma 3); single-RoPE families
also get the 4.x keys (`rope_theta`, `rope_scaling`), which 5.x reads as the same values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from posenc_jax._frozen import thaw
from posenc_jax.encodings.hf.families import family_of
from posenc_jax.encodings.rope import RoPE
from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.features import embed_multiplier, softmax_scale
from posenc_jax.pretrained.export_features import unheld
from posenc_jax.pretrained.families import FAMILIES, Family, by_model_type, claimed, config_kwargs

__all__ = ["HF_ROPE_TYPES", "check_expressible", "choose_model_type", "hf_config"]

#: The `rope_type`s transformers' causal LMs compute (modeling_rope_utils, 4.57 and 5.24).
HF_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
# Fields a config read back must reproduce (the rest -- attention, dtypes, block sizes,
# scan_layers -- say how to run the model, not what it computes).
_SAME = ("vocab_size", "num_layers", "embed_dim", "num_heads", "mlp_dim", "num_kv_heads",
         "head_dim", "mlp_activation", "causal", "tie_embeddings", "norm_eps", "qkv_bias",
         "qk_norm", "post_norms", "sliding_window", "final_logit_softcap", "num_experts",
         "experts_per_token", "moe_mlp_dim", "router", "router_bias", "expert_bias",
         "shared_expert_mlp_dim", "moe_layers", "o_bias", "attention_sinks")


def _refuse(part: str, why: str) -> ValueError:
    return ValueError(f"cannot export this model as a transformers checkpoint: {part} {why}")


def _uses(enc, hook: str) -> bool:
    """Whether `enc` declares core hook `hook` ("embed", "rotate", "bias") in its `hooks`."""
    return hook in enc.hooks


def _what(enc) -> str:
    """What an encoding does, in words (for the refusal message)."""
    return ("adds position embeddings to the input" if _uses(enc, "embed") else
            "adds a bias to the attention scores" if _uses(enc, "bias") else
            "changes attention in a way no RoPE can express")


def _check_rope(enc: RoPE, where: str, partial: bool, layout: str = "half") -> None:
    if enc.layout != layout:
        raise _refuse(f"{where}: layout={enc.layout!r}", f"(this family rotates layout="
                      f"{layout!r}; transformers' Llama-style families rotate the two halves, "
                      "Llama 4 interleaved pairs)")
    if enc.p_rope != 1.0 or enc.resonance:
        raise _refuse(f"{where}: p_rope={enc.p_rope}, resonance={enc.resonance}",
                      "has no transformers rope_parameters key")
    if enc.rotary_dim != enc.head_dim and not partial:
        raise _refuse(f"{where}: rotary_dim={enc.rotary_dim} < head_dim={enc.head_dim}",
                      "(partial rotary): this family rotates the whole head (those that "
                      f"rotate part: {_names(f for f in FAMILIES if f.partial_rotary)})")
    if getattr(enc, "unscaled_start", 0) and enc.scaling is not None:
        raise _refuse(f"{where}: unscaled_start={enc.unscaled_start}", "(LongRoPE's first "
                      "positions at the unscaled frequencies) has no transformers rope_parameters "
                      "key; search with the start count kept at 0 to export")
    kind = (enc.scaling_dict or {}).get("rope_type", "default")
    if kind not in HF_ROPE_TYPES:
        raise _refuse(f"{where}: RoPE scaling rope_type={kind!r}",
                      f"is not a transformers rope_type (those: {', '.join(HF_ROPE_TYPES)})")


def _names(families) -> str:
    return ", ".join(f.model_type for f in families)


def check_expressible(cfg: TransformerConfig, family: Family | None = None) -> None:
    """ValueError naming the part of `cfg` that no exported family can express (see module);
    with `family`, also what that family cannot (partial rotary)."""
    if not isinstance(cfg, TransformerConfig):
        raise TypeError(f"cfg must be a TransformerConfig, got {type(cfg).__name__}")
    first = cfg.input_encoding
    if _uses(first, "embed"):
        raise _refuse(f"encoding={cfg.encoding!r}", f"({_what(first)}) has no transformers "
                      f"equivalent in the families exported here ({_names(FAMILIES)}: they all "
                      "rotate q and k with RoPE); only 'rope' can be exported")
    for i in range(cfg.num_layers):
        enc = cfg.layer_encoding(i)
        where = (f"encoding={cfg.encoding!r}" if cfg.layer_encodings is None
                 else f"layer_encodings[{i}]={enc.name!r}")
        if enc.name == "nope" and family is not None and "nope" in family.expresses:
            continue
        if not isinstance(enc, RoPE):
            what = "does not encode positions at all (NoPE)" if enc.name == "nope" else (
                f"({_what(enc)})")
            raise _refuse(where, f"{what}: transformers' families exported here "
                          f"({_names(FAMILIES)}) rotate q and k with RoPE in every layer (NoPE "
                          f"layers: {_names(f for f in FAMILIES if 'nope' in f.expresses)}); "
                          "only 'rope' layers can be exported")
        hf = family_of(family.model_type) if family is not None else None
        _check_rope(enc, where, partial=family is not None and family.partial_rotary,
                    layout=hf.layout if hf is not None else "half")
    if not cfg.causal:
        raise _refuse("causal=False", "(bidirectional attention): the families exported here "
                      "are causal LMs")
    if cfg.mlp_activation == "gelu":
        raise _refuse("mlp_activation='gelu'", "(an ungated MLP): the families exported here "
                      "have gated MLPs ('swiglu', 'geglu')")
    found = unheld(cfg, family)  # sinks, o_proj bias, chunks, L2-norm, temperature
    if found:
        raise _refuse(*found)
    scale = embed_multiplier(cfg)
    if scale is not None and cfg.embed_scale != "sqrt":
        raise _refuse(f"embed_scale={cfg.embed_scale!r}", "(a constant other than sqrt(E)): "
                      "Gemma scales by sqrt(hidden_size), the others not at all")


def choose_model_type(cfg: TransformerConfig, hint: str | None = None) -> str:
    """The family to export as: `hint` (the loaded checkpoint's model_type) when it is one, else
    the first family of `families.CHOICE` that claims `cfg`'s features (the most specific first:
    Gemma 3's post-norms, Gemma's sqrt(E) embedding scale, Qwen2's qkv bias, Qwen3's QK-norm,
    Mistral's window, else Llama)."""
    named = [f for f in FAMILIES if hint is not None and hint in (f.model_type, *f.aliases)]
    return named[0].model_type if named else claimed(cfg).model_type


def _rope_dict(enc: RoPE) -> dict[str, Any]:
    scaling = dict(thaw(enc.scaling_dict)) if enc.scaling_dict else {"rope_type": "default"}
    scaling.pop("type", None)
    return {**scaling, "rope_theta": float(enc.base)}


def _single_rope(cfg: TransformerConfig) -> RoPE:
    """The one RoPE of the rotating layers (NoPE layers, where the family has them, aside)."""
    encs = {cfg.layer_encoding(i) for i in range(cfg.num_layers)
            if cfg.layer_encoding(i).name != "nope"}
    if len(encs) > 1:
        raise _refuse("layer_encodings", f"gives {len(encs)} different RoPEs to the layers; "
                      "only Gemma 3 has per-layer RoPE (one for its sliding-window layers, one "
                      "for the full ones)")
    return next(iter(encs))


def _layer_ropes(cfg: TransformerConfig) -> tuple[list[str], dict[str, dict]]:
    """Gemma 3: (layer_types, rope_parameters keyed by layer type) from the windows."""
    windows = cfg.sliding_window or (None,) * cfg.num_layers
    types = ["full_attention" if w is None else "sliding_attention" for w in windows]
    params: dict[str, dict] = {}
    for i, layer_type in enumerate(types):
        rope = _rope_dict(cfg.layer_encoding(i))
        if params.setdefault(layer_type, rope) != rope:
            raise _refuse(f"layer_encodings[{i}]", f"differs from the other {layer_type} layers'"
                          " RoPE; Gemma 3 has one RoPE per layer type (sliding, full)")
    return types, params


def _windows(cfg: TransformerConfig, family: Family) -> dict[str, Any]:
    windows = cfg.sliding_window
    sizes = sorted({w for w in windows or () if w is not None})
    if len(sizes) > 1:
        raise _refuse(f"sliding_window={list(windows)}", "has several window sizes; a "
                      "transformers config has one `sliding_window`")
    size = sizes[0] if sizes else None
    kind = family.windows
    if kind == "all":
        return {"sliding_window": size}
    if kind == "qwen":  # windows from max_window_layers on; any other pattern: layer_types
        first = next((i for i, w in enumerate(windows or ()) if w is not None), cfg.num_layers)
        out = {"use_sliding_window": size is not None, "sliding_window": size,
               "max_window_layers": first}
        if any(w is None for w in (windows or ())[first:]):
            out["layer_types"] = ["full_attention" if w is None else "sliding_attention"
                                  for w in windows]
        return out
    if kind == "layer_types":
        return {"sliding_window": size}
    return {}


def _activation(family: Family, mlp_activation: str) -> dict[str, str]:
    names = {ours: theirs for theirs, ours in family.activations.items()}
    if mlp_activation not in names:
        raise _refuse(f"mlp_activation={mlp_activation!r}", f"is not an activation of "
                      f"model_type={family.model_type!r} (it has {sorted(names)})")
    return {family.activation_key: names[mlp_activation]}


def _draft(cfg: TransformerConfig, family: Family, base: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "architectures": [family.export_class], "model_type": family.model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.embed_dim,
        "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "dtype": cfg.param_dtype, **_activation(family, cfg.mlp_activation),
        **_windows(cfg, family)}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings"):
        if base.get(key) is not None:
            out[key] = base[key]
    if family.gemma:  # a RoPE per layer type
        out["layer_types"], out["rope_parameters"] = _layer_ropes(cfg)
        scalar = cfg.query_pre_attn_scalar or cfg.head_dim  # transformers wants an int
        out.update(query_pre_attn_scalar=int(scalar) if float(scalar).is_integer() else scalar,
                   final_logit_softcapping=cfg.final_logit_softcap,
                   attn_logit_softcapping=None)
    else:
        enc = _single_rope(cfg)
        rope = _rope_dict(enc)
        if family.partial_rotary:  # 5.x reads it in rope_parameters, 4.x at the top
            rope["partial_rotary_factor"] = out["partial_rotary_factor"] = (
                enc.rotary_dim / enc.head_dim)
        out["rope_parameters"] = rope
        out.update({k: rope[k] for k in family.rope_top_level if k in rope})
        out["rope_theta"] = rope["rope_theta"]
        scaling = {k: v for k, v in rope.items()
                   if k not in ("rope_theta", "partial_rotary_factor")}
        out["rope_scaling"] = scaling if scaling["rope_type"] != "default" else None
    # max_position_embeddings: the RoPE's own (a loaded checkpoint's), else the length a
    # scaled RoPE implies, else the caller's (a training run's seq_len)
    ropes = out["rope_parameters"]
    implied = {_implied_max(r) for r in (ropes.values() if family.gemma else [ropes])}
    implied.discard(None)
    if len(implied) == 1:
        out["max_position_embeddings"] = implied.pop()
    enc = cfg.layer_encoding(0) if family.gemma else _single_rope(cfg)
    if enc.max_position_embeddings is not None:
        out["max_position_embeddings"] = enc.max_position_embeddings
    if family.write_keys is not None:
        family.write_keys(cfg, out)
    return out


def _implied_max(rope: Mapping[str, Any]) -> int | None:
    """The max_position_embeddings transformers expects beside a scaled RoPE: the extended
    length factor * original (YaRN, LongRoPE, Llama 3; YaRN and LongRoPE derive their factor
    or attention factor from the ratio), the original itself for dynamic NTK (which reads
    its original length there); None when the dict does not say."""
    original, factor = rope.get("original_max_position_embeddings"), rope.get("factor")
    if original is None:
        return None
    if rope.get("rope_type") == "dynamic":
        return int(original)
    if rope.get("rope_type") in ("yarn", "longrope", "llama3") and factor:
        return round(float(factor) * int(original))
    return None


def _unrotated(enc):
    return dataclasses.replace(enc, max_position_embeddings=None) if isinstance(enc, RoPE) else enc


def _differences(cfg: TransformerConfig, back: TransformerConfig) -> list[str]:
    diff = [f"{k}={getattr(cfg, k)!r} (reads back as {getattr(back, k)!r})" for k in _SAME
            if getattr(cfg, k) != getattr(back, k)]
    for i, (a, b) in enumerate(zip(cfg.layer_specs, back.layer_specs)):
        mine = (a.window, a.chunk, a.qk_l2_norm, a.temperature, a.moe)
        theirs = (b.window, b.chunk, b.qk_l2_norm, b.temperature, b.moe)
        if mine != theirs:
            diff.append(f"layer {i}'s (window, chunk, qk_l2_norm, temperature, moe) {mine} "
                        f"(reads back as {theirs})")
            break
    for what, fn in (("embedding scale", embed_multiplier), ("softmax scale", softmax_scale)):
        if fn(cfg) != fn(back):
            diff.append(f"{what} {fn(cfg)!r} (reads back as {fn(back)!r})")
    for i in range(cfg.num_layers):
        if _unrotated(cfg.layer_encoding(i)) != _unrotated(back.layer_encoding(i)):
            diff.append(f"layer {i}'s RoPE {cfg.layer_encoding(i)!r} (reads back as "
                        f"{back.layer_encoding(i)!r})")
            break
    return diff


def hf_config(cfg: TransformerConfig, model_type: str, *,
              base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """config.json for `cfg` as `model_type` (see module); `base`: the loaded checkpoint's own
    config.json, whose token ids and max_position_embeddings are kept."""
    family = by_model_type(model_type, where="export")
    check_expressible(cfg, family)
    model_type = family.model_type
    base = dict(base or {})
    base.update(base.pop("text_config", None) or {})
    out = _draft(cfg, family, base)
    back = TransformerConfig(**config_kwargs(out, where=f"the exported {model_type} config"))
    diff = _differences(cfg, back)
    if diff:
        raise _refuse(f"as model_type={model_type!r},", "the config.json would not hold: "
                      + "; ".join(diff))
    return out
