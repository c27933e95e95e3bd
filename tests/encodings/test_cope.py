"""CoPE (Golovneva et al. 2024): contextual positions are counts (non-decreasing towards
earlier keys, the token distance when every gate is open), the bias matches float64, it is
differentiable in the gates, and only dense attention serves it."""

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

import posenc_jax
from posenc_jax.encodings import cope
from posenc_jax.model.attention import attend

D, H, P = 8, 2, 6


def causal_logits(key, b, length):
    s = jax.random.normal(key, (b, H, length, length)) * 2.0
    mask = jnp.tril(jnp.ones((length, length), bool))
    return jnp.where(mask, s, -1e30)


@given(seed=st.integers(0, 2**16))
def test_positions_are_counts_non_decreasing_towards_earlier_keys(seed):
    s = causal_logits(jax.random.key(seed), 1, 9)
    p = np.asarray(jax.jit(lambda s: cope.positions(s, npos_max=100))(s))
    assert np.all(np.diff(p, axis=-1) <= 1e-6)                 # along the keys, p decreases
    assert np.all(np.triu(p[0, 0], 1) == 0)                    # masked (future) keys count 0
    diag = np.diagonal(p, axis1=-2, axis2=-1)
    assert np.all((diag > 0) & (diag < 1))                     # p_ii = g_ii
    i = np.arange(9)
    assert np.all(p[..., i, 0] <= i + 1)                       # at most the token count


def test_open_gates_give_the_token_distance_and_clip_at_p_max():
    s = jnp.where(jnp.tril(jnp.ones((7, 7), bool)), 1e4, -1e30)[None, None]
    p = np.asarray(cope.positions(s, npos_max=5))[0, 0]
    i, j = np.meshgrid(np.arange(7), np.arange(7), indexing="ij")
    np.testing.assert_array_equal(p, np.where(j <= i, np.minimum(i - j + 1, 4), 0))


def reference(pos_emb, q, logits):
    q, e, s = (np.asarray(t, np.float64) for t in (q, pos_emb, logits))
    g = 1.0 / (1.0 + np.exp(-np.maximum(s, -700)))
    p = np.minimum(np.flip(np.cumsum(np.flip(g, -1), -1), -1), e.shape[0] - 1)
    z = np.einsum("bqhd,nd->bhqn", q, e)
    lo, hi = np.floor(p).astype(int), np.ceil(p).astype(int)
    w = p - np.floor(p)
    return (np.take_along_axis(z, hi, -1) * w + np.take_along_axis(z, lo, -1) * (1 - w))


def test_bias_matches_float64():
    kq, ke, ks = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (2, 5, H, D))
    e = jax.random.normal(ke, (P, D))
    s = causal_logits(ks, 2, 5)
    enc = posenc_jax.get("cope", head_dim=D, npos_max=P)
    got = jax.jit(enc.row_bias)({"pos_emb": e}, jnp.arange(5), jnp.arange(5), q=q * D**-0.5,
                                logits=s)
    np.testing.assert_allclose(np.asarray(got), reference(e, q, s), rtol=2e-5, atol=2e-5)


def test_differentiable_in_the_gates():
    """d bias / d logits through the interpolation weight: non-zero and equal to central
    differences (p stays between the same integers for a small step)."""
    kq, ke, ks = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(kq, (1, 4, H, D))
    e = jax.random.normal(ke, (P, D))
    s0 = causal_logits(ks, 1, 4)

    @jax.jit  # one program each for f and its gradient, not op by op
    def f(s):
        return jnp.sum(cope.bias(e, q, s) * jnp.arange(1.0, 5.0).reshape(1, 1, 4, 1))

    grad = np.asarray(jax.jit(jax.grad(f))(s0))
    mask = np.tril(np.ones((4, 4), bool))
    assert np.all(np.abs(grad[..., mask]) > 0)
    eps = 1e-2
    for h, i, j in [(0, 3, 0), (1, 2, 1), (0, 3, 3)]:
        step = jnp.zeros_like(s0).at[0, h, i, j].set(eps)
        numeric = (float(f(s0 + step)) - float(f(s0 - step))) / (2 * eps)
        assert numeric == pytest.approx(grad[0, h, i, j], rel=2e-2, abs=1e-3)


def test_dense_attention_matches_a_float64_model_of_the_paper():
    kq, kk, kv, ke = jax.random.split(jax.random.key(2), 4)
    q, k, v = (jax.random.normal(kk_, (1, 5, H, D)) for kk_ in (kq, kk, kv))
    e = jax.random.normal(ke, (P, D))
    enc = posenc_jax.get("cope", head_dim=D, npos_max=P)
    pos = jnp.arange(5)
    got = jax.jit(lambda q, k, v: attend(q, k, v, encoding=enc, params={"pos_emb": e},
                                         q_positions=pos, k_positions=pos))(q, k, v)
    q64, k64, v64 = (np.asarray(t, np.float64) for t in (q, k, v))
    s = np.einsum("bqhd,bkhd->bhqk", q64, k64) / np.sqrt(D)
    s = np.where(np.tril(np.ones((5, 5), bool)), s, -1e30)
    s = s + reference(e, q64, s)
    s = np.where(np.tril(np.ones((5, 5), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(got), np.einsum("bhqk,bkhd->bqhd", p, v64),
                               rtol=2e-5, atol=2e-5)


def test_init_is_zero_as_the_paper_and_errors_name_the_alternative():
    enc = posenc_jax.get("cope", head_dim=D, npos_max=P)
    assert not np.any(np.asarray(enc.init(jax.random.key(0))["pos_emb"]))
    with pytest.raises(ValueError, match=r"cope: the bias reads the query and whole rows"):
        enc.bias(enc.init(jax.random.key(0)), jnp.arange(3), jnp.arange(3))
    with pytest.raises(ValueError, match=r"'cope'.*a RowBias.*use attention='dense'"):
        posenc_jax.TransformerConfig(vocab_size=8, num_layers=1, embed_dim=16, num_heads=2,
                                     mlp_dim=8, encoding="cope", attention="blockwise")
    with pytest.raises(ValueError, match="npos_max must be >= 2, got npos_max=1"):
        posenc_jax.get("cope", head_dim=D, npos_max=1)
