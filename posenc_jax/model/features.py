"""The `TransformerConfig` fields that pretrained families need, validated in one place.

    embed_scale            "sqrt": token embeddings times sqrt(E) in the activation dtype (the
                           default, and Gemma's); None: unscaled (Llama, Mistral, Qwen); or a
                           positive number
    qkv_bias               biases on the q, k and v projections (Qwen2)
    o_bias                 a bias on the output projection (param `o_bias` [E], logical axis
                           "embed"; gpt-oss's attention_bias: q, k, v and o all carry one)
    qk_norm                RMSNorm over each head's q and k before the rotation (Qwen3, Gemma 3)
    norm_offset            every RMSNorm multiplies by (norm_offset + w): 0.0, or 1.0 for Gemma
    post_norms             RMSNorm on the attention output and on the MLP output before each
                           residual add (Gemma 2 / 3: four norms per block)
    query_pre_attn_scalar  softmax scale 1 / sqrt(query_pre_attn_scalar) instead of 1 / sqrt(D)
                           (Gemma)
    final_logit_softcap    logits = cap * tanh(logits / cap) (Gemma 2 / 3 when configured)

    attention_sinks        a learned sink logit per layer and head (param `sinks` [H], logical
                           axis "heads", initialised to 0) that joins every softmax denominator
                           of `attend(sinks=...)` (gpt-oss)
    sink_tokens            k >= 0: keys at positions < k stay visible beside a sliding window
                           or a chunk (StreamingLLM); needs a layer with one

Per-layer settings (`sliding_window`, `layer_encodings`, `attention_chunk`, QK L2-norm, the
query temperature) are resolved in `posenc_jax.model.layer_pattern`. The GeGLU MLP is
`mlp_activation="geglu"` (see `posenc_jax.model.mlp`), the untied output head
`tie_embeddings=False`, the RMSNorm epsilon `norm_eps`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from posenc_jax.checks import boolean, finite_float, integer

__all__ = ["check_features", "embed_multiplier", "softmax_scale"]


def _optional_positive(name: str, value: Any) -> float | None:
    return None if value is None else finite_float(name, value, above=0.0)


def check_features(config: Any, set_: Callable[[str, Any], None]) -> None:
    """Validates and normalises the fields above on a `TransformerConfig` under construction
    (`set_(name, value)` writes a frozen field). TypeError / ValueError naming the field."""
    scale = config.embed_scale
    if scale != "sqrt" and scale is not None:
        if isinstance(scale, str):
            raise ValueError(f"embed_scale must be 'sqrt', None or a positive number, got "
                             f"embed_scale={scale!r}")
        set_("embed_scale", finite_float("embed_scale", scale, above=0.0))
    for name in ("qkv_bias", "o_bias", "qk_norm", "post_norms", "attention_sinks"):
        boolean(name, getattr(config, name))
    set_("norm_offset", finite_float("norm_offset", config.norm_offset))
    set_("query_pre_attn_scalar",
         _optional_positive("query_pre_attn_scalar", config.query_pre_attn_scalar))
    set_("final_logit_softcap",
         _optional_positive("final_logit_softcap", config.final_logit_softcap))
    set_("sink_tokens", integer("sink_tokens", config.sink_tokens, minimum=0))


def embed_multiplier(config: Any) -> float | None:
    """The factor the token embeddings are multiplied by (None: none)."""
    if config.embed_scale == "sqrt":
        return math.sqrt(config.embed_dim)
    return config.embed_scale


def softmax_scale(config: Any) -> float:
    """The attention logits' scale: 1 / sqrt(query_pre_attn_scalar or D)."""
    return 1.0 / math.sqrt(config.query_pre_attn_scalar or config.head_dim)
