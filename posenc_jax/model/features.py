"""The `TransformerConfig` fields that pretrained families need, validated in one place.

    embed_scale            "sqrt": token embeddings times sqrt(E) in the activation dtype (the
                           default, and Gemma's); None: unscaled (Llama, Mistral, Qwen); or a
                           positive number
    qkv_bias               biases on the q, k and v projections (Qwen2)
    qk_norm                RMSNorm over each head's q and k before the rotation (Qwen3, Gemma 3)
    norm_offset            every RMSNorm multiplies by (norm_offset + w): 0.0, or 1.0 for Gemma
    post_norms             RMSNorm on the attention output and on the MLP output before each
                           residual add (Gemma 2 / 3: four norms per block)
    query_pre_attn_scalar  softmax scale 1 / sqrt(query_pre_attn_scalar) instead of 1 / sqrt(D)
                           (Gemma)
    sliding_window         None (every layer attends fully), an int W (every layer), or one
                           entry per layer, an int or None: a key at position kp is visible to
                           a query at qp iff qp - kp < W (with the causal rule), from the
                           explicit positions. Gemma 3's pattern: `[512] * 5 + [None]` repeated
    final_logit_softcap    logits = cap * tanh(logits / cap) (Gemma 2 / 3 when configured)

The GeGLU MLP is `mlp_activation="geglu"` (see `posenc_jax.model.mlp`), the untied output head
`tie_embeddings=False`, the RMSNorm epsilon `norm_eps`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from posenc_jax.checks import boolean, finite_float, positive_int

__all__ = ["check_features", "embed_multiplier", "layer_window", "softmax_scale"]


def _optional_positive(name: str, value: Any) -> float | None:
    return None if value is None else finite_float(name, value, above=0.0)


def _windows(value: Any, num_layers: int) -> tuple | None:
    """None, or a tuple of num_layers entries (a positive int or None); None when no layer
    has a window."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not (isinstance(value, int) or hasattr(value, "__len__")):
        raise TypeError(f"sliding_window must be None, an int or a sequence of num_layers="
                        f"{num_layers} entries (int or None), got sliding_window={value!r}")
    if not hasattr(value, "__len__"):
        value = [value] * num_layers
    if len(value) != num_layers:
        raise ValueError(f"sliding_window has {len(value)} entries but num_layers={num_layers}")
    out = tuple(None if w is None else positive_int(f"sliding_window[{i}]", w)
                for i, w in enumerate(value))
    return None if all(w is None for w in out) else out


def check_features(config: Any, set_: Callable[[str, Any], None]) -> None:
    """Validates and normalises the fields above on a `TransformerConfig` under construction
    (`set_(name, value)` writes a frozen field). TypeError / ValueError naming the field."""
    scale = config.embed_scale
    if scale != "sqrt" and scale is not None:
        if isinstance(scale, str):
            raise ValueError(f"embed_scale must be 'sqrt', None or a positive number, got "
                             f"embed_scale={scale!r}")
        set_("embed_scale", finite_float("embed_scale", scale, above=0.0))
    for name in ("qkv_bias", "qk_norm", "post_norms"):
        boolean(name, getattr(config, name))
    set_("norm_offset", finite_float("norm_offset", config.norm_offset))
    set_("query_pre_attn_scalar",
         _optional_positive("query_pre_attn_scalar", config.query_pre_attn_scalar))
    set_("final_logit_softcap",
         _optional_positive("final_logit_softcap", config.final_logit_softcap))
    windows = _windows(config.sliding_window, config.num_layers)
    set_("sliding_window", windows)
    if windows is None:
        return
    if not config.causal:
        raise ValueError(f"sliding_window={list(windows)} needs causal=True (the window is "
                         "qp - kp < W under the causal rule)")
    if config.scan_layers and len(set(windows)) > 1:
        raise ValueError(f"scan_layers=True runs one traced block, but sliding_window differs "
                         f"between layers ({list(windows)}); set scan_layers=False")
    if config.attention == "pallas":
        raise ValueError("attention='pallas' has no sliding window yet; use 'dense', "
                         f"'blockwise' or 'auto' with sliding_window={list(windows)}")


def layer_window(config: Any, i: int) -> int | None:
    """Layer i's sliding window W (None: unlimited)."""
    return None if config.sliding_window is None else config.sliding_window[i]


def embed_multiplier(config: Any) -> float | None:
    """The factor the token embeddings are multiplied by (None: none)."""
    if config.embed_scale == "sqrt":
        return math.sqrt(config.embed_dim)
    return config.embed_scale


def softmax_scale(config: Any) -> float:
    """The attention logits' scale: 1 / sqrt(query_pre_attn_scalar or D)."""
    return 1.0 / math.sqrt(config.query_pre_attn_scalar or config.head_dim)
