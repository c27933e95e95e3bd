"""Every registered scheme (and each option of the newer ones) inside the transformer: every
parameter it declares receives a non-zero gradient, and the jitted model equals the eager one.
Schemes come from the registry, so a newly registered scheme is covered without a new line
(give it kwargs below only if its defaults do not fit a tiny model)."""

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import posenc_jax
from posenc_jax.model.transformer import Transformer, TransformerConfig

V, L = 24, 10
KWARGS = {"t5": {"num_buckets": 8, "max_distance": 16}, "shaw": {"max_relative_position": 3},
          "learned": {"max_len": 16}, "fire": {"init_length": 8.0},
          "xpos": {"scale_base": 8.0}, "cope": {"npos_max": 6}}
OPTIONS = {"shaw_value": ("shaw", {"max_relative_position": 3, "value": True}),
           "kerple_power": ("kerple", {"variant": "power"}),
           "rope_p_resonance": ("rope", {"p_rope": 0.5, "resonance": True})}
CASES = {**{n: (n, KWARGS.get(n, {})) for n in posenc_jax.names()}, **OPTIONS}


def model_for(case):
    name, kw = CASES[case]
    cfg = TransformerConfig(vocab_size=V, num_layers=1, embed_dim=16, num_heads=2,
                            num_kv_heads=1, mlp_dim=16, encoding=name, encoding_kwargs=kw)
    return Transformer(cfg, rngs=nnx.Rngs(0))


TOKENS = jax.random.randint(jax.random.key(0), (2, L), 0, V)


def _pe_params(model):
    return {path: p for path, p in nnx.iter_graph(model)
            if isinstance(p, nnx.Param) and any(s in ("pe", "input_pe") for s in path)}


@pytest.mark.parametrize("case", list(CASES))
def test_every_encoding_param_gets_a_nonzero_gradient_in_the_model(case):
    model = model_for(case)
    declared = _pe_params(model)
    graph, params, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def grads(params):
        def loss(params):
            m = nnx.merge(graph, params, rest)
            logits = m(TOKENS)
            return jnp.mean(jax.nn.log_softmax(logits)[..., 0] * jnp.arange(L)[None, :])
        return jax.grad(loss)(params)

    g = grads(params)
    flat = {path: leaf for path, leaf in jax.tree_util.tree_flatten_with_path(
        nnx.to_pure_dict(g))[0]}
    names = {tuple(str(getattr(k, "key", k)) for k in path): leaf for path, leaf in flat.items()}
    enc = model.config.layer_encoding(0)
    assert len(declared) == len(enc.init(jax.random.key(0)))  # one module holds each table
    for path in declared:
        key = tuple(str(s) for s in path)
        assert key in names, (key, list(names))
        assert float(jnp.abs(names[key]).sum()) > 0, f"{case}: zero gradient for {key}"


@pytest.mark.parametrize("case", ["kerple", "sandwich", "fire", "xpos", "cope", "shaw_value",
                                  "rope_p_resonance"])
def test_jit_equals_eager(case):
    model = model_for(case)
    eager = model(TOKENS)
    jitted = nnx.jit(lambda m, t: m(t))(model, TOKENS)
    chex.assert_trees_all_close(jitted, eager, atol=2e-5, rtol=2e-5)
