"""`rotate_like_hf`: q and k rotated exactly as a transformers 5.x model rotates them.

The rotation itself is the library's own `rope` / `mrope` encoding built from the config
(`read.read_layer`), so a parity test of this function is a parity test of those schemes;
around it sits what transformers' apply function does: the whole head dim (llama-style
models) or the first rotary_dim features (phi3, gpt_neox, stablelm), DeepSeek's pass-through
prefix and de-interleaved output, Gemma 4's proportional global layers with their own head
dim, multimodal positions [3, B, L].

Shapes: B batch, L length, H query heads, K key/value heads, D head dim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.checks import integer_array
from posenc_jax.encodings import mrope as _mrope  # noqa: F401  (registers "mrope")
from posenc_jax.encodings.base import get
from posenc_jax.encodings.hf.read import LayerRope, read_layer, text_config

__all__ = ["check_layer", "encoding_for_layer", "rotate_like_hf"]

Array = jax.Array


def encoding_for_layer(config: Mapping[str, Any], layer_type: str | None = None):
    """(the `rope` or `mrope` encoding that rotates like that layer, its `LayerRope`)."""
    layer = read_layer(config, layer_type)
    return get(layer.encoding, **layer.kwargs), layer


def _check(layer: LayerRope, q, k, position_ids, layer_type) -> Array:
    for name, x in (("q", q), ("k", k)):
        if x.ndim != 4 or not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must be float [B, L, heads, D], got shape {x.shape} and "
                             f"dtype {x.dtype}")
        if x.shape[-1] != layer.q_head_dim:
            where = "" if layer_type is None else f" for layer_type={layer_type!r}"
            raise ValueError(f"{name} has head dim D={x.shape[-1]} but the config's head dim"
                             f"{where} is {layer.q_head_dim}")
    if q.shape[:2] != k.shape[:2]:
        raise ValueError(f"q and k must share [B, L], got {q.shape[:2]} and {k.shape[:2]}")
    pos = integer_array("position_ids", position_ids)
    if pos.ndim == 3 and layer.encoding != "mrope":
        raise ValueError(f"position_ids of shape {pos.shape} ([3, B, L]) are for multimodal "
                         f"RoPE models; model_type={layer.model_type!r} takes [B, L]")
    if pos.ndim == 3 and pos.shape[0] != 3:
        raise ValueError(f"position_ids must be [B, L] or [3, B, L], got shape {pos.shape}")
    if pos.ndim not in (2, 3) or pos.shape[-1] != q.shape[1] or pos.shape[-2] not in (
            1, q.shape[0]):
        raise ValueError(f"position_ids must be [B, L] = [{q.shape[0]}, {q.shape[1]}] (or "
                         f"[3, B, L] for multimodal RoPE) to match q, got shape {pos.shape}")
    return pos


def check_layer(config: Mapping[str, Any], layer: LayerRope) -> None:
    """ValueError for a layer transformers cannot rotate or posenc_jax cannot mirror: a
    partial rotary dim on a model that applies cos/sin over the whole head dim (llama + linear
    with partial_rotary_factor), MLA keys without deepseek_v3's model_type. `rotate_like_hf`
    and `transformer_config_kwargs` both ask it, so neither builds what the other refuses."""
    if layer.full_apply and layer.kwargs["rotary_dim"] != layer.kwargs["head_dim"]:
        raise ValueError(
            f"model_type={layer.model_type!r} applies cos/sin over the whole head dim "
            f"{layer.kwargs['head_dim']}, but partial_rotary_factor gives rotary dim "
            f"{layer.kwargs['rotary_dim']} (transformers fails on this config); remove "
            "partial_rotary_factor or use a model_type that rotates a fraction (phi3, "
            "gpt_neox, stablelm)")
    nope = text_config(config)[0].get("qk_nope_head_dim")
    if nope and not layer.pass_dim:
        raise ValueError(f"model_type={layer.model_type!r} has MLA keys (qk_nope_head_dim="
                         f"{nope}); rotate_like_hf mirrors deepseek_v3's MLA layout only: add "
                         "\"model_type\": \"deepseek_v3\" if the model uses it")


def rotate_like_hf(config: Mapping[str, Any], q, k, position_ids, *,
                   layer_type: str | None = None) -> tuple[Array, Array]:
    """q [B, L, H, D] and k [B, L, K, D] rotated as transformers 5.x rotates them in a layer.

    Args:
      config: the model's config.json as a dict: flat, or with the text model's settings under
        `text_config`; legacy keys or 5.x `rope_parameters` (possibly keyed by layer type).
      q, k: float [B, L, H, D], [B, L, K, D]; D is the layer's q/k head dim (DeepSeek:
        qk_nope_head_dim + qk_rope_head_dim; Gemma 4 full_attention: global_head_dim).
      position_ids: int [B, L], or [3, B, L] (temporal, height, width) for multimodal RoPE
        models, where [B, L] is broadcast to the three axes as transformers does.
      layer_type: an entry of config["layer_types"] for per-layer models (Gemma 3, Gemma 4),
        else None.

    Returns:
      (q_rot, k_rot) in the dtypes of q and k: the layer's rotary cos/sin (attention scaling
      included) applied by the model's own apply function; features outside the rotary part
      pass through where transformers passes them. Length-dependent scalings (dynamic NTK,
      LongRoPE) read max(position_ids) + 1 over the whole batch, as transformers does.

    Raises:
      ValueError: an unknown layer_type; a per-layer model without one; a layer_type on a
        single-RoPE model; an mrope_section whose sum is not rotary_dim / 2; [3, B, L]
        positions on a non-MRoPE model; [2, B, L] positions; a head dim that contradicts the
        config; a LongRoPE factor list of the wrong length; positions whose length differs
        from q's; a partial rotary factor on a model that rotates the whole head dim.
    """
    enc, layer = encoding_for_layer(config, layer_type)
    check_layer(config, layer)
    q, k = jnp.asarray(q), jnp.asarray(k)
    pos = _check(layer, q, k, position_ids, layer_type)
    seq_len = jnp.max(pos) + 1 if enc.is_length_dependent else None
    p = layer.pass_dim
    q_rot, k_rot = enc.rotate({}, q[..., p:], k[..., p:], pos, pos, seq_len=seq_len)
    if layer.deinterleave:  # DeepSeek: rotated pairs (2i, 2i+1) come back as halves
        order = np.concatenate([np.arange(0, q_rot.shape[-1], 2),
                                np.arange(1, q_rot.shape[-1], 2)])
        q_rot, k_rot = q_rot[..., order], k_rot[..., order]
    if p:
        q_rot = jnp.concatenate([q[..., :p], q_rot], axis=-1)
        k_rot = jnp.concatenate([k[..., :p], k_rot], axis=-1)
    return q_rot, k_rot
