"""Models built from Hugging Face config dicts: a tiny Gemma-3-like model (per-layer RoPE) and a
tiny Qwen2-VL-like model (multimodal RoPE, positions [3, B, L]) train, and their KV-cache
decode equals the full forward pass."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from posenc_jax import hf_config
from posenc_jax.model.transformer import Transformer, TransformerConfig, init_cache

GEMMA3_TINY = {"model_type": "gemma3_text", "vocab_size": 48, "hidden_size": 32,
               "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
               "head_dim": 16, "num_hidden_layers": 2, "sliding_window_pattern": 2,
               "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
               "rope_scaling": {"rope_type": "linear", "factor": 8.0},
               "max_position_embeddings": 512}
QWEN2_VL_TINY = {"model_type": "qwen2_vl", "vocab_size": 48, "hidden_size": 32,
                 "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
                 "num_hidden_layers": 2, "rope_theta": 1000000.0,
                 "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
                 "max_position_embeddings": 512}


def qwen_positions(b: int) -> jnp.ndarray:
    """[3, B, 12]: 3 text tokens, a 2 x 3 image, 3 text tokens (Qwen2-VL's rope index)."""
    t = [0, 1, 2] + [3] * 6 + [5, 6, 7]
    h = [0, 1, 2] + [3, 3, 3, 4, 4, 4] + [5, 6, 7]
    w = [0, 1, 2] + [3, 4, 5, 3, 4, 5] + [6, 7, 8]
    return jnp.broadcast_to(jnp.asarray([t, h, w], jnp.int32)[:, None], (3, b, 12))


def build(config_json, seed=0):
    cfg = TransformerConfig(**hf_config.transformer_config_kwargs(config_json))
    return Transformer(cfg, rngs=nnx.Rngs(seed))


def test_gemma3_config_gives_per_layer_rope():
    cfg = TransformerConfig(**hf_config.transformer_config_kwargs(GEMMA3_TINY))
    kinds = [(e.base, e.scaling_dict and e.scaling_dict["rope_type"])
             for e in map(cfg.layer_encoding, range(2))]
    assert kinds == [(10000.0, None), (1000000.0, "linear")]
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.position_axes) == (16, 1, 1)


def test_qwen2_vl_config_gives_mrope():
    cfg = TransformerConfig(**hf_config.transformer_config_kwargs(QWEN2_VL_TINY))
    enc = cfg.layer_encoding(0)
    assert (enc.name, enc.mrope_section, enc.interleaved, cfg.position_axes) == (
        "mrope", (2, 3, 3), False, 3)


def train(model, tokens, positions, steps=8):
    opt = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt):
        def loss_fn(m):
            logits = m(tokens[:, :-1], positions)
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss

    return [float(step(model, opt)) for _ in range(steps)]


@pytest.mark.parametrize("which", ["gemma3", "qwen2_vl"])
def test_tiny_models_from_hf_configs_train(which):
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 48, (2, 13)), jnp.int32)
    if which == "gemma3":
        model, positions = build(GEMMA3_TINY), jnp.arange(12)[None] + 3000
    else:
        model, positions = build(QWEN2_VL_TINY), qwen_positions(2)
    losses = train(model, tokens, positions)
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("which", ["gemma3", "qwen2_vl"])
def test_kv_cache_decode_equals_the_full_forward(which):
    model = build(GEMMA3_TINY if which == "gemma3" else QWEN2_VL_TINY, seed=1)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 48, (2, 12)), jnp.int32)
    positions = jnp.arange(12)[None] + 700 if which == "gemma3" else qwen_positions(2)
    full = nnx.jit(lambda m, t, p: m(t, p))(model, tokens, positions)
    step = nnx.jit(lambda m, t, p, c: m(t, p, cache=c))
    cache = init_cache(model, 2, 16)
    pieces = []
    for start, stop in ((0, 8), (8, 9), (9, 10), (10, 11), (11, 12)):
        logits, cache = step(model, tokens[:, start:stop], positions[..., start:stop], cache)
        pieces.append(logits)
    np.testing.assert_allclose(np.concatenate(pieces, 1), full, atol=2e-5, rtol=1e-5)


def test_mrope_model_positions():
    model = build(QWEN2_VL_TINY)
    tokens = jnp.zeros((2, 12), jnp.int32)
    forward = nnx.jit(lambda m, t, p: m(t, p))
    text = forward(model, tokens, jnp.arange(12)[None])  # text only: broadcast to the three axes
    same = forward(model, tokens, jnp.broadcast_to(jnp.arange(12), (3, 1, 12)))
    np.testing.assert_allclose(text, same, atol=1e-6)
    with pytest.raises(ValueError, match=r"positions must have shape \[12\], \[B=2, 12\] or "
                                         r"\[3, B=2, 12\], got shape \(2, 2, 12\)"):
        model(tokens, jnp.zeros((2, 2, 12), jnp.int32))
    plain = build({**GEMMA3_TINY, "model_type": "llama", "rope_scaling": None})
    with pytest.raises(ValueError, match=r"positions of shape \(3, 2, 12\) have 3 axes, but "
                                         r"this model's encodings take positions \[L\] or "
                                         r"\[B, L\] \(position_axes=1\)"):
        plain(tokens, qwen_positions(2))


def test_model_rotation_is_rotate_like_hf():
    """The layer's own encoding rotates q and k as transformers does for that layer type."""
    cfg = TransformerConfig(**hf_config.transformer_config_kwargs(GEMMA3_TINY))
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 5, 2, 16)).astype(np.float32)
    k = rng.standard_normal((1, 5, 1, 16)).astype(np.float32)
    pos = np.array([[0, 9, 99, 999, 9999]])
    for i, layer_type in enumerate(["sliding_attention", "full_attention"]):
        got = cfg.layer_encoding(i).rotate({}, q, k, pos, pos)
        want = hf_config.rotate_like_hf(GEMMA3_TINY, q, k, pos, layer_type=layer_type)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_gemma4_layers():
    gemma4 = {"model_type": "gemma4_text", "vocab_size": 48, "hidden_size": 32,
              "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 16, "num_hidden_layers": 2}
    with pytest.raises(ValueError, match=r"layer types need different head dims "
                                         r"\{'full_attention': 512, 'sliding_attention': 16\}"):
        hf_config.layer_encodings_from_hf(gemma4)
    layers = hf_config.layer_encodings_from_hf({**gemma4, "global_head_dim": 16})
    assert [name for name, _ in layers] == ["rope", "rope"]
    full = layers[1][1]  # the last layer is always full_attention
    assert (full["rotary_dim"], full["base"], dict(full["scaling"])) == (
        16, 1000000.0, {"rope_type": "proportional", "partial_rotary_factor": 0.25})
    cfg = TransformerConfig(**hf_config.transformer_config_kwargs({**gemma4,
                                                                   "global_head_dim": 16}))
    inv, _ = cfg.layer_encoding(1).frequencies()
    assert np.count_nonzero(np.asarray(inv)) == 2  # int(0.25 * 16 // 2) pairs rotate


def test_mla_has_no_transformer_config():
    deepseek = {"model_type": "deepseek_v3", "vocab_size": 48, "hidden_size": 64,
                "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1,
                "qk_rope_head_dim": 16, "qk_nope_head_dim": 32}
    with pytest.raises(ValueError, match=r"model_type='deepseek_v3' \(MLA: q/k head dim 48 "
                                         r"with a 32-dim pass-through part\) has no "
                                         r"TransformerConfig equivalent"):
        hf_config.transformer_config_kwargs(deepseek)
