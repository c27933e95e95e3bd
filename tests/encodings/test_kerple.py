"""KERPLE (Chi et al. 2022): translation invariance, non-increasing in distance at
initialisation, float64 parity of both kernels, the elementwise hook, the clamp, errors."""

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

import posenc_jax
from posenc_jax.encodings import kerple

H = 6


_JITTED = {}


def _bias(enc):
    """One compiled bias per scheme (hypothesis calls it many times)."""
    if enc not in _JITTED:
        _JITTED[enc] = jax.jit(lambda p, qp, kp: enc.bias(p, qp, kp))
    return _JITTED[enc]


@pytest.mark.parametrize("variant", kerple.VARIANTS)
@given(offset=st.integers(0, 10**6), seed=st.integers(0, 2**16))
def test_bias_is_translation_invariant(variant, offset, seed):
    enc = posenc_jax.get("kerple", num_heads=H, variant=variant)
    params = enc.init(jax.random.key(seed))
    pos = jnp.arange(9)
    near = _bias(enc)(params, pos, pos)
    far = _bias(enc)(params, pos + offset, pos + offset)
    np.testing.assert_array_equal(np.asarray(far), np.asarray(near))


@pytest.mark.parametrize("variant", kerple.VARIANTS)
@given(seed=st.integers(0, 2**16))
def test_bias_is_zero_at_distance_zero_and_non_increasing_at_init(variant, seed):
    enc = posenc_jax.get("kerple", num_heads=H, variant=variant)
    params = enc.init(jax.random.key(seed))
    dist = jnp.concatenate([jnp.arange(64), jnp.array([10**3, 10**4, 10**5, 10**6])])
    b = np.asarray(_bias(enc)(params, jnp.zeros((1,), jnp.int32), dist))[:, 0]    # [H, n]
    assert np.all(b[:, 0] == 0.0) and not np.any(np.signbit(b[:, 0]))
    assert np.all(np.diff(b, axis=-1) <= 0.0), b
    assert np.all(np.isfinite(b))


def test_init_draws_as_the_paper():
    params = kerple.init(jax.random.key(0), num_heads=4096)
    r1, r2 = np.asarray(params["r1"]), np.asarray(params["r2"])
    assert r1.shape == r2.shape == (4096,)
    assert 0.0 <= r1.min() and r1.max() <= 2.0 and abs(r1.mean() - 1.0) < 0.05
    assert 0.0 <= r2.min() and r2.max() <= 1.0 and abs(r2.mean() - 0.5) < 0.03


@pytest.mark.parametrize("variant", kerple.VARIANTS)
def test_kernels_match_float64(variant):
    enc = posenc_jax.get("kerple", num_heads=3, variant=variant)
    params = {"r1": jnp.array([0.5, 1.7, 0.001]), "r2": jnp.array([0.2, 2.5, 0.9])}
    qp = jnp.array([[0, 5, 1000, 999_999]])
    kp = jnp.array([[0, 1, 7, 123_456, 999_999]])
    got = np.asarray(_bias(enc)(params, qp, kp), np.float64)                     # [1, 3, 4, 5]
    d = np.abs(np.asarray(kp, np.float64)[:, None, None, :] - np.asarray(qp)[:, None, :, None])
    r1 = np.maximum(np.asarray(params["r1"], np.float64), kerple.EPS)[None, :, None, None]
    r2 = np.asarray(params["r2"], np.float64)
    if variant == "log":
        want = -r1 * np.log1p(np.maximum(r2, kerple.EPS)[None, :, None, None] * d)
    else:
        want = -r1 * d ** np.clip(r2, kerple.EPS, 2.0)[None, :, None, None]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("variant", kerple.VARIANTS)
def test_elementwise_hook_on_a_block_equals_the_bias(variant):
    enc = posenc_jax.get("kerple", num_heads=H, variant=variant)
    params = enc.init(jax.random.key(1))
    qp, kp = jnp.arange(100, 108), jnp.arange(90, 106)
    full = enc.bias(params, qp, kp)                                              # [H, 8, 16]
    block = jax.jit(enc.elementwise_bias)(params, qp[:, None], kp[None, :], jnp.int32(4))
    chex.assert_trees_all_close(block, full[4], rtol=0, atol=0)


def test_clamp_is_straight_through():
    """Below eps the forward pass sees eps (as the authors' in-place clamp) and the gradient
    still reaches the raw parameter."""
    enc = posenc_jax.get("kerple", num_heads=2)
    params = {"r1": jnp.array([-1.0, 1.0]), "r2": jnp.array([0.5, -3.0])}
    pos = jnp.arange(5)
    b = enc.bias(params, pos, pos)
    want0 = -kerple.EPS * np.log1p(0.5 * np.abs(np.arange(5)[None] - np.arange(5)[:, None]))
    np.testing.assert_allclose(b[0], want0, rtol=3e-6)
    grads = jax.grad(lambda p: jnp.sum(enc.bias(p, pos, pos)))(params)
    assert np.all(np.asarray(grads["r1"]) != 0) and np.all(np.asarray(grads["r2"]) != 0)


def test_errors_name_the_values():
    with pytest.raises(ValueError, match=r"unknown variant 'exp'; valid: 'log', 'power'"):
        posenc_jax.get("kerple", num_heads=2, variant="exp")
    with pytest.raises(ValueError, match="num_heads must be >= 1, got num_heads=0"):
        posenc_jax.get("kerple", num_heads=0)
    with pytest.raises(TypeError, match="integer dtype"):
        posenc_jax.get("kerple", num_heads=2).bias(kerple.init(jax.random.key(0), num_heads=2),
                                                   jnp.arange(3.0), jnp.arange(3.0))
