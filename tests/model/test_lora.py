"""posenc_jax.model.lora: LoRA adapters as transforms of the params pytree.

- `merge` is W + (alpha / r) A @ B reshaped to W's shape, against a float64 NumPy reference,
  for every projection kind (q/k/v [E, H, D], o [H, D, E], MLP [E, F] / [F, E]);
- fresh adapters (B = 0) leave the model's logits unchanged; nudged ones change them;
- gradients through `merge` reach the adapters and match a finite-difference check;
- errors name the bad target, rank and alpha.
"""

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings

from posenc_jax.model import lora
from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.transformer import Transformer

CONFIG = TransformerConfig(vocab_size=64, num_layers=2, embed_dim=16, num_heads=4,
                           num_kv_heads=2, mlp_dim=24)


def params_of(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


@pytest.fixture(scope="module")
def model():
    return Transformer(CONFIG, rngs=nnx.Rngs(0))


def nudged(adapters, key):
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(k, x.shape)
                                     for x, k in zip(leaves, keys)])


@settings(max_examples=8)  # each example compiles the merge anew
@given(rank=st.integers(1, 4), alpha=st.floats(0.5, 32.0), seed=st.integers(0, 2**16))
def test_merge_is_w_plus_scaled_ab_float64_reference(model, rank, alpha, seed):
    params = params_of(model)
    adapters = nudged(lora.init(params, rank=rank, targets=tuple(lora.TARGETS),
                                key=jax.random.key(seed)), jax.random.key(seed + 1))
    merged = jax.jit(lambda p, a: lora.merge(p, a, rank=rank, alpha=alpha))(params, adapters)
    for path in lora.targeted_paths(params, tuple(lora.TARGETS)):
        w = np.asarray(lora._get(params, path), np.float64)
        ab = lora._get(adapters, path)
        a, b = np.asarray(ab["a"], np.float64), np.asarray(ab["b"], np.float64)
        expected = w + alpha / rank * (a @ b).reshape(w.shape)
        np.testing.assert_allclose(np.asarray(lora._get(merged, path)), expected,
                                   rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_equal(merged["final_norm"], params["final_norm"])


def test_fresh_adapters_keep_the_logits_and_nudged_ones_change_them(model):
    graphdef, state = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(state)
    tokens = jnp.arange(12, dtype=jnp.int32)[None] % 64
    fresh = lora.init(params, rank=2, targets=("q_proj", "v_proj"), key=jax.random.key(0))
    assert lora.num_params(fresh) == 2 * ((16 * 2 + 2 * 16) + (16 * 2 + 2 * 8))  # q, v; 2 layers

    @jax.jit
    def logits(p):
        return nnx.merge(graphdef, p)(tokens)

    same = logits(lora.merge(params, fresh, rank=2, alpha=4.0))
    np.testing.assert_array_equal(np.asarray(same), np.asarray(logits(params)))
    moved = logits(lora.merge(params, nudged(fresh, jax.random.key(1)), rank=2, alpha=4.0))
    assert np.abs(np.asarray(moved) - np.asarray(same)).max() > 1e-3


def test_gradients_reach_the_adapters(model):
    graphdef, state = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(state)
    adapters = nudged(lora.init(params, rank=2, targets=("o_proj", "down"),
                                key=jax.random.key(2)), jax.random.key(3))
    tokens = jnp.arange(10, dtype=jnp.int32)[None]

    def loss(a):
        return jnp.mean(nnx.merge(graphdef, lora.merge(params, a, rank=2, alpha=2.0))(
            tokens) ** 2)

    grads = jax.jit(jax.grad(loss))(adapters)
    b = grads["layers"][0]["attn"]["o_proj"]["b"]
    assert np.abs(np.asarray(b)).max() > 0
    step = 1e-2
    bumped = jax.tree.map(lambda x: x, adapters)
    bumped["layers"][0]["attn"]["o_proj"]["b"] = adapters["layers"][0]["attn"]["o_proj"][
        "b"].at[0, 0].add(step)
    value = jax.jit(loss)  # one compile for both points
    finite = (value(bumped) - value(adapters)) / step
    np.testing.assert_allclose(float(finite), float(b[0, 0]), rtol=0.05, atol=1e-4)


def test_errors_name_the_value(model):
    params = params_of(model)
    with pytest.raises(ValueError, match=r"names 'qproj', which is not a projection LoRA "
                                         r"adapts; valid: q_proj, k_proj"):
        lora.init(params, rank=2, targets=("qproj",), key=jax.random.key(0))
    with pytest.raises(TypeError, match=r"targets must be a non-empty sequence"):
        lora.init(params, rank=2, targets="q_proj", key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"rank=9 exceeds the smaller side of "
                                         r"layers/0/attn/k_proj \(16 x 8\)"):
        lora.init(params, rank=9, targets=("k_proj",), key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"rank must be >= 1, got rank=0"):
        lora.init(params, rank=0, targets=("k_proj",), key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"alpha"):
        lora.merge(params, {}, rank=2, alpha=float("nan"))
