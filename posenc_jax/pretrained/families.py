"""Pretrained families: a Hugging Face config.json -> `TransformerConfig` keyword arguments.

One record per architecture says what transformers' model class does beyond the shared
decoder (read in transformers 5.24's modeling files): the class defaults for keys a
config.json may omit, the norms ((1 + w), four per block), QK-norm, qkv bias, the embedding
scale, the activation and the sliding windows. The positional part (RoPE per layer, YaRN,
Llama 3 scaling) and the attention shapes come from `posenc_jax.encodings.hf`
(`transformer_config_kwargs`), the one reader of transformers' RoPE.

    llama        Llama 2 / 3 / 3.1 / 3.2, SmolLM2: no embedding scale, SwiGLU
    mistral      Llama + `sliding_window` on every layer (class default 4096)
    qwen2        Llama + qkv bias; windows on layers >= max_window_layers if use_sliding_window
    qwen3        Qwen2 without the bias, with QK-norm
    gemma        sqrt(E) embedding scale and (1 + w) norms (Gemma 1; a model trained here, whose
                 embeddings are scaled by sqrt(E), exports as this family)
    gemma3_text  (and gemma3's text_config) sqrt(E) embedding scale, (1 + w) norms before and
                 after attention and MLP, QK-norm, GeGLU, query_pre_attn_scalar, five sliding
                 layers then one full (`layer_types`), final logit soft-cap if configured
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from posenc_jax.checks import finite_float, json_count
from posenc_jax.encodings.hf.families import family_of
from posenc_jax.encodings.hf.layers import transformer_config_kwargs
from posenc_jax.encodings.hf.read import layer_types, resolve

__all__ = ["ARCHITECTURES", "Architecture", "architecture_of", "config_kwargs"]


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What a family's model class adds to the shared decoder (see the module docstring).

    norms: the Hugging Face names of a block's norms, in our order (attn_norm, mlp_norm,
    post_attn_norm, post_mlp_norm; the last two only with post_norms)."""

    defaults: Mapping[str, Any]
    activation_key: str = "hidden_act"
    activations: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: {"silu": "swiglu"})
    qkv_bias: bool = False             # biases on q, k, v only (Qwen2's fixed ones)
    qk_norm: bool = False
    gemma: bool = False                # (1 + w) norms, post norms, sqrt(E), query scalar
    scaled: bool = False               # Gemma (1): sqrt(E) and (1 + w) norms, nothing else
    windows: str = "none"              # "none", "all" (mistral), "qwen", "layer_types"
    norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")


_LLAMA_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu"}
_GEMMA = Architecture(
    defaults={"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "sliding_window": 4096,
              "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh",
              "final_logit_softcapping": None, "attn_logit_softcapping": None,
              "vocab_size": 262208, "intermediate_size": 9216, "num_key_value_heads": 4},
    activation_key="hidden_activation", activations={"gelu_pytorch_tanh": "geglu"},
    qk_norm=True, gemma=True, windows="layer_types",
    norms=("input_layernorm", "pre_feedforward_layernorm", "post_attention_layernorm",
           "post_feedforward_layernorm"))

ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(defaults=_LLAMA_DEFAULTS),
    "mistral": Architecture(defaults={**_LLAMA_DEFAULTS, "sliding_window": 4096},
                            windows="all"),
    "qwen2": Architecture(defaults={**_LLAMA_DEFAULTS, "use_sliding_window": False,
                                    "max_window_layers": 28}, qkv_bias=True, windows="qwen"),
    "qwen3": Architecture(defaults={**_LLAMA_DEFAULTS, "head_dim": 128,
                                    "use_sliding_window": False, "max_window_layers": 28},
                          qk_norm=True, windows="qwen"),
    "gemma": Architecture(  # Gemma (1); also what a model trained here exports as (sqrt(E))
        defaults={"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "head_dim": 256,
                  "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192},
        activations={"gelu": "geglu", "gelu_pytorch_tanh": "geglu", "silu": "swiglu"},
        scaled=True),
    "gemma3_text": _GEMMA,
    "gemma3": _GEMMA,
}


def architecture_of(config: Mapping[str, Any], where: Any) -> tuple[Architecture, dict, str]:
    """(the record, the text model's flat settings with the class defaults, model_type).

    ValueError naming `where` (the checkpoint's path) for a model_type not listed here."""
    flat, model_type, _ = resolve(config)
    if model_type not in ARCHITECTURES:
        raise ValueError(f"{where}: unsupported model_type={model_type!r}; supported: "
                         f"{', '.join(map(repr, ARCHITECTURES))}")
    arch = ARCHITECTURES[model_type]
    for key, value in arch.defaults.items():
        flat.setdefault(key, value)
    return arch, flat, model_type


def _windows(arch: Architecture, flat: dict, model_type: str, num_layers: int) -> list | None:
    """One sliding window (or None) per layer, as the family's attention class sets it."""
    if arch.windows == "none":
        return None
    if arch.windows == "all":
        w = flat.get("sliding_window")
        return None if w is None else [json_count("sliding_window", w)] * num_layers
    if arch.windows == "qwen":
        if not flat.get("use_sliding_window") or flat.get("sliding_window") is None:
            return None
        types = flat.get("layer_types") or [
            "sliding_attention" if i >= flat["max_window_layers"] else "full_attention"
            for i in range(num_layers)]
    else:
        types = layer_types(flat, family_of(model_type))
    w = flat.get("sliding_window")
    w = None if w is None else json_count("sliding_window", w)
    return [w if t == "sliding_attention" else None for t in types]


def _unsupported(where: Any, key: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{where}: config {key}={value!r} is not supported here ({allowed})")


def _tie(value: Any, where: Any) -> bool:
    """tie_word_embeddings: true / false (null: false); "no" or 0 is refused, not bool()-ed."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{where}: config.json tie_word_embeddings must be true or false, got "
                        f"{value!r} ({type(value).__name__})")
    return bool(value)


def config_kwargs(config: Mapping[str, Any], *, where: Any) -> dict[str, Any]:
    """Keyword arguments of `TransformerConfig` for a family's config.json dict.

    Raises ValueError naming `where` for an unsupported model_type, activation, attention
    soft-capping, bidirectional attention or MLP / output biases."""
    arch, flat, model_type = architecture_of(config, where)
    out = transformer_config_kwargs({**flat, "model_type": model_type})
    act = flat.get(arch.activation_key)
    if act not in arch.activations:
        raise _unsupported(where, arch.activation_key, act,
                           f"valid: {', '.join(map(repr, arch.activations))}")
    for key in ("mlp_bias", "attn_logit_softcapping", "use_bidirectional_attention"):
        if flat.get(key):
            raise _unsupported(where, key, flat[key], "only false / null")
    if flat.get("attention_bias"):  # o_proj would carry a bias too
        raise _unsupported(where, "attention_bias", flat["attention_bias"], "only false")
    out.update(mlp_activation=arch.activations[act], qkv_bias=arch.qkv_bias,
               qk_norm=arch.qk_norm,
               tie_embeddings=_tie(flat.get("tie_word_embeddings"), where),
               norm_eps=finite_float("rms_norm_eps", flat["rms_norm_eps"], above=0.0),
               sliding_window=_windows(arch, flat, model_type, out["num_layers"]))
    if arch.gemma:
        cap = flat.get("final_logit_softcapping")
        out.update(embed_scale="sqrt", norm_offset=1.0, post_norms=True,
                   query_pre_attn_scalar=finite_float(
                       "query_pre_attn_scalar", flat["query_pre_attn_scalar"], above=0.0),
                   final_logit_softcap=None if cap is None else finite_float(
                       "final_logit_softcapping", cap, above=0.0))
    elif arch.scaled:
        out.update(embed_scale="sqrt", norm_offset=1.0)
    else:
        out.update(embed_scale=None)
    return out
