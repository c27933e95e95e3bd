"""The TransformerConfig fields pretrained families need (`posenc_jax.model.features`): each one
against a float64 NumPy forward written from the papers' / transformers' formulas, plus the
properties that pin it down (QK-norm's scale invariance, the (1 + w) norm's equivalence, the
soft-cap's bound), and their validation errors."""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax.model.kv_cache import init_cache
from posenc_jax.model.transformer import Transformer, TransformerConfig

V, L, E, H, K, D, F = 48, 10, 32, 4, 2, 16, 40


def config(**kw):
    base = {"vocab_size": V, "num_layers": 2, "embed_dim": E, "num_heads": H, "num_kv_heads": K,
            "head_dim": D, "mlp_dim": F, "encoding": "nope", "embed_scale": None}
    base.update(kw)
    return TransformerConfig(**base)


def randomized(cfg, seed=0):
    """A model whose every param (norm scales and biases included) is random, so that no
    feature hides behind an identity initialisation."""
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for _, p in nnx.iter_graph(model):
        if isinstance(p, nnx.Param):
            p[...] = jnp.asarray(rng.normal(0.0, 0.3, p[...].shape), p[...].dtype) + (
                1.0 if p[...].ndim == 1 and cfg.norm_offset == 0 else 0.0)
    return model


def _np(p):
    return np.asarray(p[...], np.float64)


def np_rms(x, w, cfg):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.norm_eps)
    return y * (cfg.norm_offset + _np(w.scale))


def np_gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def np_forward(model, tokens, positions=None):
    """float64 logits [B, L, V] of a NoPE model, feature by feature as transformers writes it."""
    cfg = model.config
    _, t = tokens.shape
    pos = np.arange(t) if positions is None else np.asarray(positions)
    x = _np(model.embedding)[np.asarray(tokens)]
    if cfg.embed_scale == "sqrt":
        x = x * math.sqrt(cfg.embed_dim)
    elif cfg.embed_scale is not None:
        x = x * cfg.embed_scale
    for i, layer in enumerate(model.layers):
        a = layer.attn
        hx = np_rms(x, layer.attn_norm, cfg)
        q = np.einsum("bte,ehd->bthd", hx, _np(a.q_proj))
        k = np.einsum("bte,ekd->btkd", hx, _np(a.k_proj))
        v = np.einsum("bte,ekd->btkd", hx, _np(a.v_proj))
        if cfg.qkv_bias:
            q, k, v = q + _np(a.q_bias), k + _np(a.k_bias), v + _np(a.v_bias)
        if cfg.qk_norm:
            q, k = np_rms(q, a.q_norm, cfg), np_rms(k, a.k_norm, cfg)
        g = cfg.num_heads // cfg.num_kv_heads
        k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
        scale = (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5
        s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
        visible = pos[None, :] <= pos[:, None]
        window = None if cfg.sliding_window is None else cfg.sliding_window[i]
        if window is not None:
            visible &= pos[:, None] - pos[None, :] < window
        s = np.where(visible, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
        y = np.einsum("bhqk,bkhd,hde->bqe", p, v, _np(a.o_proj))
        if cfg.o_bias:
            y = y + _np(a.o_bias)
        if cfg.post_norms:
            y = np_rms(y, layer.post_attn_norm, cfg)
        x = x + y
        hx = np_rms(x, layer.mlp_norm, cfg)
        up = hx @ _np(layer.mlp.up)
        if cfg.mlp_activation == "swiglu":
            g = hx @ _np(layer.mlp.gate)
            h = g / (1.0 + np.exp(-g)) * up
        elif cfg.mlp_activation == "geglu":
            h = np_gelu_tanh(hx @ _np(layer.mlp.gate)) * up
        else:
            h = np_gelu_tanh(up)
        y = h @ _np(layer.mlp.down)
        if cfg.post_norms:
            y = np_rms(y, layer.post_mlp_norm, cfg)
        x = x + y
    x = np_rms(x, model.final_norm, cfg)
    out = _np(model.embedding).T if cfg.tie_embeddings else _np(model.unembed)
    logits = x @ out
    if cfg.final_logit_softcap is not None:
        logits = cfg.final_logit_softcap * np.tanh(logits / cfg.final_logit_softcap)
    return logits


@nnx.jit
def forward(model, tokens):
    return model(tokens)


TOKENS = np.random.default_rng(1).integers(0, V, (2, L))
FEATURES = {
    "baseline (Llama: no embedding scale, SwiGLU, tied)": {},
    "embed_scale sqrt(E) (the old default, Gemma)": {"embed_scale": "sqrt"},
    "embed_scale 2.5": {"embed_scale": 2.5},
    "qkv_bias (Qwen2)": {"qkv_bias": True},
    "q / k / v / o biases (gpt-oss's attention_bias)": {"qkv_bias": True, "o_bias": True},
    "qk_norm (Qwen3)": {"qk_norm": True},
    "Gemma norms (1 + w)": {"norm_offset": 1.0},
    "post_norms (Gemma 2/3)": {"post_norms": True},
    "GeGLU with tanh GELU": {"mlp_activation": "geglu"},
    "plain GELU": {"mlp_activation": "gelu"},
    "query_pre_attn_scalar": {"query_pre_attn_scalar": 7.0},
    "untied output head": {"tie_embeddings": False},
    "sliding window, all layers": {"sliding_window": 3},
    "sliding window per layer": {"sliding_window": [None, 2]},
    "final logit soft-cap": {"final_logit_softcap": 2.0},
    "Gemma 3 all at once": {"embed_scale": "sqrt", "qk_norm": True, "norm_offset": 1.0,
                            "post_norms": True, "mlp_activation": "geglu",
                            "query_pre_attn_scalar": 12.0, "sliding_window": [4, None],
                            "final_logit_softcap": 5.0, "norm_eps": 1e-6},
}


@pytest.mark.parametrize("features", FEATURES.values(), ids=FEATURES.keys())
def test_each_feature_matches_the_float64_reference(features):
    model = randomized(config(**features))
    got = np.asarray(forward(model, jnp.asarray(TOKENS)), np.float64)
    want = np_forward(model, TOKENS)
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("name", ["sliding window per layer", "Gemma 3 all at once"])
def test_blockwise_attention_matches_the_reference_with_windows(name):
    model = randomized(config(attention="blockwise", block_size=4, **FEATURES[name]))
    got = np.asarray(forward(model, jnp.asarray(TOKENS)), np.float64)
    want = np_forward(model, TOKENS)
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=2e-4)


def test_the_default_keeps_the_sqrt_embedding_scale():
    cfg = TransformerConfig(vocab_size=V, num_layers=1, embed_dim=E, num_heads=H, mlp_dim=F)
    assert cfg.embed_scale == "sqrt"
    model = randomized(dataclasses.replace(cfg, encoding="nope"))
    np.testing.assert_allclose(np.asarray(forward(model, jnp.asarray(TOKENS))),
                               np_forward(model, TOKENS), atol=2e-4, rtol=2e-4)


def test_qk_norm_makes_the_output_invariant_to_the_scale_of_q_and_k():
    model = randomized(config(qk_norm=True))
    before = forward(model, jnp.asarray(TOKENS))
    for layer in model.layers:
        layer.attn.q_proj[...] = layer.attn.q_proj[...] * 7.0
        layer.attn.k_proj[...] = layer.attn.k_proj[...] * 0.2
    np.testing.assert_allclose(forward(model, jnp.asarray(TOKENS)), before, atol=1e-4)


def test_one_plus_w_norms_equal_plain_norms_with_the_weight_plus_one():
    gemma = randomized(config(norm_offset=1.0, post_norms=True, qk_norm=True))
    plain = Transformer(config(post_norms=True, qk_norm=True), rngs=nnx.Rngs(0))
    nnx.update(plain, nnx.state(gemma, nnx.Param))
    for path, p in nnx.iter_graph(plain):
        if isinstance(p, nnx.Param) and path[-1] == "scale":
            p[...] = p[...] + 1.0
    np.testing.assert_allclose(forward(plain, jnp.asarray(TOKENS)),
                               forward(gemma, jnp.asarray(TOKENS)), atol=1e-5)


def test_gemma_norms_start_as_identity_scales():
    model = Transformer(config(norm_offset=1.0, post_norms=True), rngs=nnx.Rngs(0))
    assert float(jnp.abs(model.final_norm.scale[...]).max()) == 0.0
    assert float(jnp.abs(model.layers[0].post_mlp_norm.scale[...]).max()) == 0.0


def test_query_pre_attn_scalar_equal_to_head_dim_changes_nothing():
    model = randomized(config())
    same = Transformer(config(query_pre_attn_scalar=float(D)), rngs=nnx.Rngs(0))
    nnx.update(same, nnx.state(model, nnx.Param))
    np.testing.assert_array_equal(forward(same, jnp.asarray(TOKENS)),
                                  forward(model, jnp.asarray(TOKENS)))


def test_soft_cap_bounds_the_logits():
    model = randomized(config(final_logit_softcap=0.5))
    logits = forward(model, jnp.asarray(TOKENS))
    assert float(jnp.abs(logits).max()) <= 0.5 and float(jnp.abs(logits).min()) < 0.5


def test_sliding_window_hides_tokens_past_the_window_from_positions():
    """One layer, window 3: the logit at query position p does not depend on the token at
    p - 3 or earlier, and does depend on p - 2; packed positions restart the window."""
    model = randomized(config(num_layers=1, sliding_window=3))
    base = jnp.asarray(TOKENS[:1])
    out = forward(model, base)
    far = base.at[0, 2].set((base[0, 2] + 1) % V)         # position 2 is 3 before position 5
    changed = jnp.abs(forward(model, far) - out).max(-1)[0]
    assert float(changed[5:].max()) == 0.0 and float(changed[2:5].min()) > 0.0


def test_window_follows_explicit_positions_in_the_cache():
    """Prefill then token-by-token decode equals the full forward with a window (RoPE)."""
    model = randomized(config(encoding="rope", sliding_window=[3, None]))
    full = forward(model, jnp.asarray(TOKENS))
    step = nnx.jit(lambda m, t, p, c: m(t, p, cache=c))
    c = init_cache(model, 2, L)
    logits, c = step(model, jnp.asarray(TOKENS[:, :4]), jnp.arange(4)[None], c)
    steps = [logits]
    for i in range(4, L):
        logits, c = step(model, jnp.asarray(TOKENS[:, i:i + 1]), jnp.full((2, 1), i), c)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


@pytest.mark.parametrize("kw, error, text", [
    ({"embed_scale": "sqrtE"}, ValueError, "embed_scale must be 'sqrt', None or a positive"),
    ({"embed_scale": -1.0}, ValueError, "embed_scale must be > 0.0"),
    ({"qkv_bias": 1}, TypeError, "qkv_bias must be a bool"),
    ({"o_bias": "no"}, TypeError, "o_bias must be a bool"),
    ({"qk_norm": "yes"}, TypeError, "qk_norm must be a bool"),
    ({"post_norms": None}, TypeError, "post_norms must be a bool"),
    ({"norm_offset": float("nan")}, ValueError, "norm_offset must be finite"),
    ({"query_pre_attn_scalar": 0}, ValueError, "query_pre_attn_scalar must be > 0.0"),
    ({"final_logit_softcap": -3.0}, ValueError, "final_logit_softcap must be > 0.0"),
    ({"sliding_window": [4]}, ValueError, "sliding_window has 1 entries but num_layers=2"),
    ({"sliding_window": "4"}, TypeError, "sliding_window must be None, an int or a sequence"),
    ({"sliding_window": [4, 0]}, ValueError, "sliding_window[1] must be >= 1"),
    ({"sliding_window": 4, "causal": False}, ValueError, "sliding_window=[4, 4] needs causal"),
    ({"mlp_activation": "relu"}, ValueError, "valid: 'swiglu', 'geglu', 'gelu'"),
])
def test_feature_errors_name_the_field(kw, error, text):
    with pytest.raises(error) as info:
        config(**kw)
    assert text in str(info.value)


def test_a_window_on_a_backend_without_one_is_refused_by_the_registry():
    """The config asks the backend registry (`backends.check` with the layer's window), whose
    message names the backend, the window and the backends that have one."""
    with pytest.raises(ValueError) as info:
        config(sliding_window=4, attention="cudnn")
    text = str(info.value)
    assert "attention='cudnn'" in text and "window=4" in text
    assert "use attention='dense' or 'blockwise'" in text


def test_no_window_anywhere_normalises_to_none():
    assert config(sliding_window=[None, None]).sliding_window is None
    assert config(sliding_window=5).sliding_window == (5, 5)
