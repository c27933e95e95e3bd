"""A float64 NumPy forward of the decoder with per-layer settings, written from transformers'
formulas (Llama 4's chunks, QK L2-norm and temperature; gpt-oss's sinks; Gemma's windows), for
tests/model/test_layer_pattern.py, test_scan_groups.py and test_layer_attention_combined.py
(with the cache-decoding and loop-vs-scan helpers they share). Layers use RoPE (half
layout, base 10000, full rotary) or NoPE; SwiGLU MLP, tied embeddings, no embedding scale."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc_jax.model.kv_cache import init_cache
from posenc_jax.model.transformer import Transformer


def randomized(cfg, seed=0):
    """A model whose every param is random (norm scales around 1), so that no feature hides
    behind an identity initialisation (sinks included)."""
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for _, p in nnx.iter_graph(model):
        if isinstance(p, nnx.Param):
            shift = 1.0 if p[...].ndim == 1 and p[...].shape[0] != cfg.num_heads else 0.0
            p[...] = jnp.asarray(rng.normal(0.0, 0.3, p[...].shape) + shift, p[...].dtype)
    return model


def _np(p):
    return np.asarray(p[...], np.float64)


def rms(x, scale, eps):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if scale is None else y * scale


def rope(x, pos, base=10000.0):
    """x [B, T, H, D] rotated at positions [T] (the half layout, `rotate_half`)."""
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[None, :, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[None, :, None, :]
    half = d // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def temperature(pos, floor_scale, attn_scale):
    """Llama 4's query temperature at positions [T] (transformers: log1p(floor((p + 1) /
    floor_scale)) * attn_scale + 1)."""
    return np.log1p(np.floor((pos + 1.0) / floor_scale)) * attn_scale + 1.0


def visible(pos, spec, sink_tokens):
    """bool [Tq, Tk]: causal, the window and the chunk, sink tokens exempt from both."""
    qp, kp = pos[:, None], pos[None, :]
    out = kp <= qp
    local = np.ones_like(out)
    if spec.window is not None:
        local &= qp - kp < spec.window
    if spec.chunk is not None:
        local &= kp // spec.chunk == qp // spec.chunk
    if spec.window is not None or spec.chunk is not None:
        local |= kp < sink_tokens
    return out & local


def forward(model, tokens, positions=None, *, use_sinks=True):
    """float64 logits [B, T, V] (use_sinks=False: as if the model had no sinks)."""
    cfg = model.config
    t = tokens.shape[1]
    pos = np.arange(t) if positions is None else np.asarray(positions)
    x = _np(model.embedding)[np.asarray(tokens)]
    for i, layer in enumerate(model.layers):
        spec, a = cfg.layer(i), layer.attn
        hx = rms(x, _np(layer.attn_norm.scale), cfg.norm_eps)
        q = np.einsum("bte,ehd->bthd", hx, _np(a.q_proj))
        k = np.einsum("bte,ekd->btkd", hx, _np(a.k_proj))
        v = np.einsum("bte,ekd->btkd", hx, _np(a.v_proj))
        if spec.encoding[0] == "rope":
            q, k = rope(q, pos), rope(k, pos)
        if spec.qk_l2_norm:  # transformers: after the rotation
            q, k = rms(q, None, cfg.norm_eps), rms(k, None, cfg.norm_eps)
        if spec.temperature is not None:
            q = q * temperature(pos, *spec.temperature)[None, :, None, None]
        g = cfg.num_heads // cfg.num_kv_heads
        k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
        s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(cfg.head_dim)
        s = np.where(visible(pos, spec, cfg.sink_tokens), s, -np.inf)
        m = s.max(-1, keepdims=True)
        if cfg.attention_sinks and use_sinks:  # gpt-oss: a per-head logit joins the denominator only
            sink = _np(a.sinks)[None, :, None, None]
            m = np.maximum(m, sink)
            e = np.exp(s - m)
            p = e / (e.sum(-1, keepdims=True) + np.exp(sink - m))
        else:
            e = np.exp(s - m)
            p = e / e.sum(-1, keepdims=True)
        x = x + np.einsum("bhqk,bkhd,hde->bqe", p, v, _np(a.o_proj))
        hx = rms(x, _np(layer.mlp_norm.scale), cfg.norm_eps)
        gate = hx @ _np(layer.mlp.gate)
        x = x + (gate / (1.0 + np.exp(-gate)) * (hx @ _np(layer.mlp.up))) @ _np(layer.mlp.down)
    x = rms(x, _np(model.final_norm.scale), cfg.norm_eps)
    return x @ _np(model.embedding).T


def decoded(model, tokens, prefill):
    """(logits [B, T, V] of a prefill of `prefill` tokens then one-token decode steps, the
    final cache): what must equal the full forward."""
    b, t = tokens.shape
    step = nnx.jit(lambda m, x, p, c: m(x, p, cache=c))
    logits, cache = step(model, tokens[:, :prefill], jnp.arange(prefill)[None],
                         init_cache(model, b, t))
    outs = [logits]
    for i in range(prefill, t):
        logits, cache = step(model, tokens[:, i:i + 1], jnp.full((b, 1), i), cache)
        outs.append(logits)
    return jnp.concatenate(outs, 1), cache


def assert_same_loss_and_grads(a, b, tokens):
    """Two models (e.g. loop and scan) give one loss (1e-5) and gradients (1e-4)."""
    def loss(model, tokens):
        return jnp.mean(jax.nn.log_softmax(model(tokens))[..., 0])

    grad = nnx.jit(nnx.value_and_grad(loss))
    (l1, g1), (l2, g2) = grad(a, tokens), grad(b, tokens)
    np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(g1, g2, rtol=1e-4, atol=1e-5)


def assert_matches_forward(cfg, length, seed=1):
    """A randomized model of `cfg` gives the float64 `forward`'s logits (2e-4) on random
    tokens [2, length]."""
    model = randomized(cfg)
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab_size, (2, length))
    got = nnx.jit(lambda m, t: m(t))(model, jnp.asarray(tokens))
    np.testing.assert_allclose(np.asarray(got, np.float64), forward(model, tokens),
                               rtol=2e-4, atol=2e-4)
