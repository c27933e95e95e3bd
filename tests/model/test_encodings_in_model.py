"""Every registered scheme (and each option of the newer ones) inside the transformer: every
parameter it declares receives a non-zero gradient, and the jitted model equals the eager one.
Schemes come from the registry, so a newly registered scheme is covered without a new line
(give it kwargs below only if its defaults do not fit a tiny model). To keep this fast, all
per-layer schemes share ONE model, one layer each (`layer_encodings`); additive schemes and
schemes with multi-axis positions get a model of their own."""

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import posenc_jax
from posenc_jax.encodings.capabilities import position_axes
from posenc_jax.model.transformer import Transformer, TransformerConfig

V, L, E, H = 24, 10, 16, 2
KWARGS = {"t5": {"num_buckets": 8, "max_distance": 16}, "shaw": {"max_relative_position": 3},
          "learned": {"max_len": 16}, "fire": {"init_length": 8.0},
          "xpos": {"scale_base": 8.0}, "cope": {"npos_max": 6}}
OPTIONS = [("shaw", {"max_relative_position": 3, "value": True}), ("kerple", {"variant": "power"}),
           ("rope", {"p_rope": 0.5, "resonance": True})]
CASES = [(n, KWARGS.get(n, {})) for n in posenc_jax.names()] + OPTIONS


def _per_layer(name, kw):
    enc = posenc_jax.for_model(name, kw, embed_dim=E, num_heads=H, head_dim=E // H)
    return "embed" not in enc.hooks and position_axes(enc) == 1


LAYERED = [c for c in CASES if _per_layer(*c)]
ALONE = [c for c in CASES if not _per_layer(*c)]


def config(layers, **kw):
    return TransformerConfig(vocab_size=V, num_layers=len(layers), embed_dim=E, num_heads=H,
                             num_kv_heads=1, mlp_dim=16, **kw)


def model_of(cfg):
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(0), (2, L), 0, V)
    return model, tokens


def _positions(cfg):
    """None (the default arange), or the same arange on every axis for multi-axis schemes."""
    if cfg.position_axes == 1:
        return None
    return jnp.broadcast_to(jnp.arange(L), (cfg.position_axes, 1, L))


def _grads(model, tokens, positions=None):
    graph, params, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def grads(params):
        def loss(params):
            logits = nnx.merge(graph, params, rest)(tokens, positions)
            return jnp.mean(jax.nn.log_softmax(logits)[..., 0] * jnp.arange(L)[None, :])
        return jax.grad(loss)(params)

    return nnx.to_pure_dict(grads(params))


def _check_pe(grads_pe, enc, what):
    assert set(grads_pe) == set(enc.init(jax.random.key(0))), what  # exactly the declared ones
    for name, g in grads_pe.items():
        assert float(jnp.abs(g).sum()) > 0, f"{what}: zero gradient for {name}"


def test_every_param_of_every_per_layer_scheme_gets_a_gradient():
    cfg = config(LAYERED, encoding="nope", layer_encodings=LAYERED)
    model, tokens = model_of(cfg)
    g = _grads(model, tokens)
    for i, case in enumerate(LAYERED):
        _check_pe(g["layers"][i]["attn"].get("pe", {}), cfg.layer_encoding(i), case)


@pytest.mark.parametrize("case", ALONE, ids=lambda c: c[0])
def test_every_param_of_every_other_scheme_gets_a_gradient(case):
    cfg = config([None], encoding=case[0], encoding_kwargs=case[1])
    model, tokens = model_of(cfg)
    g = _grads(model, tokens, _positions(cfg))
    enc = cfg.input_encoding
    pe = g.get("input_pe", {}) if "embed" in enc.hooks else g["layers"][0]["attn"].get("pe", {})
    _check_pe(pe, enc, case)


# The three new attention paths: whole rows (CoPE), a value term (Shaw a^V), a block
# transform (xPos). Every hook of every scheme is checked jit == eager in test_encoding.py.
NEWER = [("cope", KWARGS["cope"]), OPTIONS[0], ("xpos", KWARGS["xpos"])]


def test_jit_equals_eager_for_the_new_attention_paths():
    """The whole model, eager (the slow part) against jitted."""
    model, tokens = model_of(config(NEWER, encoding="nope", layer_encodings=NEWER))
    eager = model(tokens)
    jitted = nnx.jit(lambda m, t: m(t))(model, tokens)
    chex.assert_trees_all_close(jitted, eager, atol=2e-5, rtol=2e-5)
