"""The shared online-softmax numerics (`posenc_jax.model.softmax_math`): blocks folded one at
a time equal one float64 softmax; a row that sees no key gives zeros and lse 0, never NaN."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc_jax.model.softmax_math import NEG, log_normaliser, normalise, online_step


def _fold(s, v, keep, block):
    m = jnp.full(s.shape[:-1] + (1,), NEG, jnp.float32)
    l = jnp.zeros_like(m)
    acc = jnp.zeros(s.shape[:-1] + (v.shape[-1],), jnp.float32)
    for j in range(0, s.shape[-1], block):
        sb, kb = s[:, j:j + block], keep[:, j:j + block]
        m, l, p, alpha = online_step(m, l, jnp.where(kb, sb, NEG), kb)
        acc = alpha * acc + p @ v[j:j + block]
    return normalise(acc, l), log_normaliser(m, l)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), block=st.sampled_from([1, 3, 8]), scale=st.floats(0.1, 30))
def test_blocks_folded_equal_one_float64_softmax(seed, block, scale):
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(5, 12)) * scale
    v = rng.normal(size=(12, 4))
    keep = rng.random((5, 12)) < 0.7
    keep[0] = False                                   # a row that sees no key
    out, lse = jax.jit(_fold, static_argnums=3)(jnp.float32(s), jnp.float32(v),
                                                jnp.asarray(keep), block)
    w = np.where(keep, np.exp(s - np.where(keep, s, -np.inf).max(-1, keepdims=True)), 0.0)
    ref = (w / np.where(w.sum(-1, keepdims=True) > 0, w.sum(-1, keepdims=True), 1.0)) @ v
    ref_lse = np.log(np.where(keep, np.exp(s), 0.0).sum(-1, keepdims=True)[1:])
    np.testing.assert_allclose(np.asarray(out), ref, atol=2e-5 * max(1.0, scale))
    np.testing.assert_allclose(np.asarray(lse)[1:], ref_lse, rtol=2e-5, atol=2e-4)
    assert np.all(np.asarray(out)[0] == 0.0) and float(lse[0, 0]) == 0.0
