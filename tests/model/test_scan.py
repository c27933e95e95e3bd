"""`scan_layers=True` is the same model as the Python loop: same params, logits, gradients and
KV-cache decoding (per-layer settings, scanned in groups: tests/model/test_scan_groups.py)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax.model.transformer import Transformer, TransformerConfig, init_cache

V = 40


def config(**kw):
    base = {"vocab_size": V, "num_layers": 3, "embed_dim": 32, "num_heads": 4,
            "num_kv_heads": 2, "mlp_dim": 48}
    return TransformerConfig(**{**base, **kw})


def pair(**kw):
    """(loop model, scan model) with identical parameters."""
    loop = Transformer(config(**kw), rngs=nnx.Rngs(0))
    scanned = Transformer(config(scan_layers=True, **kw), rngs=nnx.Rngs(0))
    return loop, scanned


def loss(model, tokens):
    return jnp.mean(jax.nn.log_softmax(model(tokens))[..., 0])


@pytest.mark.usefixtures("default_opt_level")  # blockwise gradients: NaN at O0 (conftest)
@pytest.mark.parametrize("encoding,attention", [("rope", "dense"), ("t5", "blockwise"),
                                                ("learned", "dense")])
def test_scan_matches_loop_values_and_gradients(encoding, attention):
    loop, scanned = pair(encoding=encoding, attention=attention, block_size=4)
    chex.assert_trees_all_equal(nnx.state(loop, nnx.Param), nnx.state(scanned, nnx.Param))
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, V)
    grad = nnx.jit(nnx.value_and_grad(loss))
    (l1, g1), (l2, g2) = grad(loop, tokens), grad(scanned, tokens)
    np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(g1, g2, rtol=1e-4, atol=1e-5)


def test_scan_traces_one_block():
    """The jaxpr of a scanned 6-layer model holds one block's matmuls, the loop's six."""
    def count_dots(model):
        jaxpr = jax.make_jaxpr(lambda t: nnx.merge(*nnx.split(model))(t))(
            jnp.zeros((1, 4), jnp.int32))
        return str(jaxpr).count("dot_general")

    loop, scanned = pair(num_layers=6)
    assert count_dots(loop) > 5 * count_dots(scanned) / 2
    assert count_dots(scanned) < count_dots(loop)


def test_scan_kv_cache_decoding_matches_full_forward():
    _, model = pair(encoding="alibi")
    tokens = jax.random.randint(jax.random.key(2), (2, 7), 0, V)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)
    step = nnx.jit(lambda m, t, p, c: m(t, p, cache=c))
    cache = init_cache(model, 2, 8)
    logits, cache = step(model, tokens[:, :3], jnp.arange(3)[None], cache)
    outs = [logits]
    for i in range(3, 7):
        logits, cache = step(model, tokens[:, i:i + 1], jnp.full((2, 1), i), cache)
        outs.append(logits)
    chex.assert_trees_all_close(jnp.concatenate(outs, 1), full, rtol=1e-4, atol=1e-4)
    assert len(cache.k) == 3 and int(cache.index) == 7


def test_scan_layers_must_be_a_bool():
    with pytest.raises(TypeError, match="scan_layers must be a bool"):
        config(scan_layers="yes")
