"""What some families do to q, k and v between the projections and the rotation.

    q = x W_q (+ b_q)      k = x W_k (+ b_k)      v = x W_v (+ b_v)      qkv_bias (Qwen2)
    out = attn W_o (+ b_o)                                               o_bias (gpt-oss)
    q, k = rmsnorm_D(q), rmsnorm_D(k)                                    qk_norm (Qwen3, Gemma 3)
    q, k = q / rms_D(q), k / rms_D(k)              layer's qk_l2_norm (Llama 4, no weights)
    q = q * sqrt(D / query_pre_attn_scalar)                              query scale (Gemma)
    q = q * temperature(q_position)                layer's temperature (Llama 4's NoPE layers)

The query scale folds 1 / sqrt(query_pre_attn_scalar) into q, so attention keeps its
1 / sqrt(D) (exact when query_pre_attn_scalar = D, as in Gemma 3 270M); the rotation is
linear, so scaling before it is the same as scaling the logits. `add_qkv_features` creates
the params on an `Attention` module (names q_bias, k_bias, v_bias [H|K, D]; o_bias [E]; q_norm,
k_norm over D, logical axis "kv"); `apply_qkv_features` applies them to q [B, T, H, D] and
k, v [B, T, K, D]. The per-layer L2-norm and temperature (`posenc_jax.model.layer_pattern`)
act per position, so they commute with the rotation that follows (transformers' Llama 4
applies them after it).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from posenc_jax.model.features import softmax_scale
from posenc_jax.model.layer_pattern import LayerSpec, qk_l2_norm, query_temperature
from posenc_jax.model.norms import RMSNorm
from posenc_jax.model.params import param

__all__ = ["add_qkv_features", "apply_qkv_features"]

Array = jax.Array


def add_qkv_features(module: nnx.Module, config) -> None:
    """Sets the bias and QK-norm params the config asks for on an Attention `module`."""
    h, kh, d, pd = config.num_heads, config.num_kv_heads, config.head_dim, config.param_dtype
    if config.qkv_bias:
        module.q_bias = param(jnp.zeros((h, d)), ("heads", "kv"), pd)
        module.k_bias = param(jnp.zeros((kh, d)), ("kv_heads", "kv"), pd)
        module.v_bias = param(jnp.zeros((kh, d)), ("kv_heads", "kv"), pd)
    if config.o_bias:
        module.o_bias = param(jnp.zeros((config.embed_dim,)), ("embed",), pd)
    if config.qk_norm:
        kw = {"eps": config.norm_eps, "param_dtype": pd, "offset": config.norm_offset,
              "axis": "kv"}
        module.q_norm = RMSNorm(d, **kw)
        module.k_norm = RMSNorm(d, **kw)


def apply_qkv_features(module: nnx.Module, q: Array, k: Array, v: Array, *,
                       spec: LayerSpec, positions: Array) -> tuple[Array, Array, Array]:
    """(q, k, v) with the bias, the QK-norm and the query scale of `module.config`, and the
    layer's QK L2-norm and query temperature (`spec`; positions int [B|1, T], the queries')."""
    cfg = module.config
    if cfg.qkv_bias:
        q = q + module.q_bias[...].astype(q.dtype)[None, None]
        k = k + module.k_bias[...].astype(k.dtype)[None, None]
        v = v + module.v_bias[...].astype(v.dtype)[None, None]
    if cfg.qk_norm:
        q, k = module.q_norm(q), module.k_norm(k)
    if spec.qk_l2_norm:
        q, k = qk_l2_norm(q, eps=cfg.norm_eps), qk_l2_norm(k, eps=cfg.norm_eps)
    factor = softmax_scale(cfg) * math.sqrt(cfg.head_dim)
    if factor != 1.0:
        q = q * jnp.asarray(factor, q.dtype)
    if spec.temperature is not None:
        floor_scale, attn_scale = spec.temperature
        scale = query_temperature(positions, floor_scale=floor_scale, attn_scale=attn_scale)
        q = (q.astype(jnp.float32) * scale).astype(q.dtype)
    return q, k, v
