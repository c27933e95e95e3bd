"""FIRE (Li et al. 2023): the progressive normalisation against float64, finite and in
[0, 1] far past the training length, the MLP against float64, the paper's initialisation,
the elementwise hook, and every param's gradient."""

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

import posenc_jax
from posenc_jax.encodings import fire

H = 4
ENC = posenc_jax.get("fire", num_heads=H)
BIAS = jax.jit(lambda p, qp, kp: ENC.bias(p, qp, kp))


def normalized64(i, j, c, l_mult, init_length=512.0):
    """psi(|i - j|) / (psi(max(i, |L_mult L0|)) + eps), psi(x) = log(|c x| + 1), float64."""
    i, j = np.asarray(i, np.float64), np.asarray(j, np.float64)
    norm = np.maximum(i, abs(l_mult * init_length))
    return np.log1p(abs(c) * np.abs(i - j)) / (np.log1p(abs(c) * norm) + fire.EPS)


def mlp64(x, params):
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    hidden = np.maximum(x[..., None] * p["w1"] + p["b1"], 0.0)
    return hidden @ p["w2"] + p["b2"]                                    # [..., H]


@given(c=st.floats(0.01, 3.0), l_mult=st.floats(0.05, 4.0), base=st.integers(0, 10**6))
def test_progressive_normalisation_matches_float64(c, l_mult, base):
    i = np.array([0, 1, 37, 511, 512, 513, 5000]) + base
    j = np.maximum(i - np.array([0, 1, 5, 511, 100, 513, 4999]), 0)
    got = fire.normalized_distance(jnp.asarray(np.abs(i - j), jnp.float32), jnp.asarray(i),
                                   jnp.float32(c), jnp.float32(l_mult), init_length=512.0)
    np.testing.assert_allclose(np.asarray(got, np.float64), normalized64(i, j, c, l_mult),
                               rtol=2e-6, atol=1e-7)


def test_bias_matches_float64_far_past_the_training_length():
    params = ENC.init(jax.random.key(0))
    qp = jnp.array([[0, 3, 511, 4096, 999_999]])
    kp = jnp.array([[0, 2, 300, 4000, 123, 999_999]])
    got = np.asarray(BIAS(params, qp, kp), np.float64)[0]                  # [H, 5, 6]
    i, j = np.asarray(qp)[0][:, None], np.asarray(kp)[0][None, :]
    want = np.moveaxis(mlp64(normalized64(i, j, 0.1, 1.0), params), -1, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_causal_input_stays_in_unit_interval_and_bias_is_finite_at_1e6():
    """Progressive interpolation: psi(i - j) <= psi(max(i, L)) for j <= i at any length."""
    i = jnp.array([10, 10**3, 10**5, 10**6 - 1])[:, None]
    j = jnp.array([0, 1, 9, 10**5, 10**6 - 1])[None, :]
    x = fire.normalized_distance(jnp.abs(i - j).astype(jnp.float32), i, 0.1, 1.0,
                                 init_length=512.0)
    causal = np.asarray(j <= i)
    assert np.all((np.asarray(x) >= 0)[causal]) and np.all((np.asarray(x) <= 1)[causal])
    b = BIAS(ENC.init(jax.random.key(1)), i[:, 0], j[0])
    assert np.all(np.isfinite(np.asarray(b)))


def test_init_is_the_papers():
    params = fire.init(jax.random.key(0), num_heads=8, mlp_width=32)
    assert float(params["c"]) == pytest.approx(0.1) and float(params["L_mult"]) == 1.0
    assert np.abs(np.asarray(params["w1"])).max() <= 1.0
    assert np.abs(np.asarray(params["w2"])).max() <= 1 / np.sqrt(32)
    chex.assert_shape([params["w1"], params["b1"], params["w2"], params["b2"]],
                      [(32,), (32,), (32, 8), (8,)])


def test_elementwise_hook_equals_the_bias():
    params = ENC.init(jax.random.key(2))
    qp, kp = jnp.arange(500, 508), jnp.arange(490, 506)
    block = jax.jit(ENC.elementwise_bias)(params, qp[:, None], kp[None, :], jnp.int32(3))
    chex.assert_trees_all_close(block, ENC.bias(params, qp, kp)[3], rtol=1e-5, atol=1e-6)


def test_every_param_gets_a_gradient_below_the_threshold():
    params = ENC.init(jax.random.key(3))
    pos = jnp.arange(12)
    grads = jax.jit(jax.grad(lambda p: jnp.sum(jnp.sin(ENC.bias(p, pos, pos)))))(params)
    for name, g in grads.items():
        assert float(jnp.abs(g).sum()) > 0, name
