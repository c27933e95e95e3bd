"""Llama 4's per-layer attention against transformers' own `Llama4TextAttention` (a golden
made in a throwaway venv by scripts/make_llama4_layer_golden.py, transformers 5.24): a RoPE
layer with the QK L2-norm (applied after the rotation there, before it here: they commute)
and a NoPE layer whose queries carry the temperature (floor_scale 3, attn_scale 0.5, so it
changes within the 11 tokens), each loaded with the golden's weights."""

import pathlib

import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc_jax.model.transformer import Transformer, TransformerConfig

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "data" / "llama4_layer_golden.npz"


def test_llama4_layers_match_transformers():
    g = np.load(GOLDEN)
    length, e = g["hidden"].shape[1:]
    h, kh, d = 4, 2, 8
    assert g["layer0_use_rope"] and not g["layer1_use_rope"]
    cfg = TransformerConfig(
        vocab_size=32, num_layers=2, embed_dim=e, num_heads=h, num_kv_heads=kh, head_dim=d,
        mlp_dim=16, embed_scale=None, norm_eps=1e-5, encoding="rope",
        encoding_kwargs={"layout": "interleaved", "base": 10000.0},
        attn_temperature={"floor_scale": 3, "attn_scale": 0.5},
        layer_pattern=[{"qk_l2_norm": True}, {"encoding": "nope", "temperature": True}])
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    x = jnp.asarray(g["hidden"])
    positions = jnp.arange(length)[None]
    worst = []
    for i, layer in enumerate(model.layers):
        a = layer.attn
        a.q_proj[...] = jnp.asarray(g[f"layer{i}_q_proj"].T.reshape(e, h, d))
        a.k_proj[...] = jnp.asarray(g[f"layer{i}_k_proj"].T.reshape(e, kh, d))
        a.v_proj[...] = jnp.asarray(g[f"layer{i}_v_proj"].T.reshape(e, kh, d))
        a.o_proj[...] = jnp.asarray(g[f"layer{i}_o_proj"].T.reshape(h, d, e))
        out, _ = nnx.jit(lambda a, x, i=i: a(x, positions, None, None, i))(a, x)
        np.testing.assert_allclose(np.asarray(out), g[f"layer{i}_out"], rtol=1e-4, atol=1e-4)
        worst.append(float(np.abs(np.asarray(out) - g[f"layer{i}_out"]).max()))
    print(f"worst |ours - transformers| per layer: {worst}")
