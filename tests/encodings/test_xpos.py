"""xPos (Sun et al. 2022): the score depends only on m - n and decays with it, exactly
(float64 parity) and finite at positions near 10^6 where the un-centred scale overflows;
the re-centring does not depend on the block; causal only."""

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

import posenc_jax
from posenc_jax.encodings import xpos

D, H = 16, 2
ENC = posenc_jax.get("xpos", head_dim=D)


@jax.jit
def scores(q, k, qp, kp):
    """q [1, Lq, H, D], k [1, Lk, H, D] at positions [1, L] -> xPos logits [1, H, Lq, Lk]."""
    qr, kr = ENC.rotate({}, q, k, qp, kp)
    qs, ks = ENC.block_transform({}, qr, kr, qp, kp)
    return jnp.einsum("bqhd,bkhd->bhqk", qs, ks)


@jax.jit
def scale_only(qp, kp):
    """The decay alone: q = k = ones, no rotation -> sum_i 2 zeta_i^((n - m)/gamma)."""
    ones_q = jnp.ones(qp.shape + (1, D), jnp.float32)
    ones_k = jnp.ones(kp.shape + (1, D), jnp.float32)
    qs, ks = ENC.block_transform({}, ones_q, ones_k, qp, kp)
    return jnp.einsum("bqhd,bkhd->bhqk", qs, ks)[:, 0]


def decay64(dist):
    zeta = (np.arange(0, D, 2) / D + 0.4) / 1.4
    return (2.0 * zeta ** (np.asarray(dist, np.float64)[..., None] / 512.0)).sum(-1)


def test_zeta_is_the_papers():
    np.testing.assert_allclose(np.exp(xpos.log_zeta(8)), (np.array([0, 2, 4, 6]) / 8 + 0.4) / 1.4)


@given(offset=st.sampled_from([0, 1, 1000, 40_000, 999_000]))
def test_decay_depends_only_on_the_distance_and_matches_float64(offset):
    """At 10^6 zeta_0^(n / 512) alone is 0.286^1953 (far below float32's 1e-38): the
    re-centred scale still gives the exact product."""
    qp = jnp.arange(offset, offset + 24)[None]
    kp = jnp.arange(offset, offset + 24)[None]
    got = np.asarray(scale_only(qp, kp), np.float64)[0]
    dist = np.asarray(qp)[0, :, None] - np.asarray(kp)[0, None, :]
    causal = dist >= 0
    np.testing.assert_allclose(got[causal], decay64(dist[causal]), rtol=5e-6)
    assert np.all(np.isfinite(got))


def test_decay_is_strictly_decreasing_in_distance():
    qp = jnp.full((1, 1), 10**6)
    kp = (10**6 - jnp.arange(0, 30_000, 97))[None]
    got = np.asarray(scale_only(qp, kp))[0, 0]
    assert np.all(np.diff(got) < 0) and got[-1] > 0


@given(seed=st.integers(0, 2**16), offset=st.integers(0, 5000))
def test_score_depends_only_on_m_minus_n(seed, offset):
    kq, kk = jax.random.split(jax.random.key(seed))
    q = jax.random.normal(kq, (1, 10, H, D))
    k = jax.random.normal(kk, (1, 10, H, D))
    pos = jnp.arange(10)[None]
    chex.assert_trees_all_close(scores(q, k, pos + offset, pos + offset), scores(q, k, pos, pos),
                                atol=2e-3, rtol=2e-3)   # float32 angles at offset <= 5000


def test_scores_at_1e6_match_float64_within_float32_angles():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 6, 1, D))
    k = rng.standard_normal((1, 6, 1, D))
    pos = (10**6 - 6 + np.arange(6))[None]
    got = np.asarray(scores(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32),
                            jnp.asarray(pos), jnp.asarray(pos)), np.float64)[0, 0]
    theta = 10000.0 ** (-np.arange(0, D, 2) / D)
    zeta = (np.arange(0, D, 2) / D + 0.4) / 1.4
    r = D // 2
    want = np.zeros((6, 6))
    for i in range(6):
        for j in range(6):
            dlt = pos[0, i] - pos[0, j]
            a, b = q[0, i, 0, :r], q[0, i, 0, r:]
            c, e = k[0, j, 0, :r], k[0, j, 0, r:]
            # <R(n) q, R(m) k> = sum (a c + b e) cos(d theta) + (a e - b c) sin(d theta)
            rot = (a * c + b * e) * np.cos(dlt * theta) + (a * e - b * c) * np.sin(dlt * theta)
            want[i, j] = np.sum(rot * zeta ** (dlt / 512.0))
    assert np.all(np.isfinite(got))
    # float32 angles: each of q's and k's angles is off by up to 2 p theta 2^-24 rad.
    qa = np.abs(q[0, :, 0, :r]) + np.abs(q[0, :, 0, r:])                        # [6, R]
    ka = np.abs(k[0, :, 0, :r]) + np.abs(k[0, :, 0, r:])
    tol = np.einsum("ir,jr->ij", qa, ka * 4 * 10**6 * theta * 2.0**-24) + 1e-5
    causal = pos[0][:, None] >= pos[0][None, :]
    assert np.all((np.abs(got - want) <= tol)[causal]), np.max(np.abs(got - want) - tol)


def test_block_transform_product_is_independent_of_the_block():
    """Re-centring on any query block gives the same q_i . k_j (what blockwise relies on)."""
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((1, 8, H, D)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 8, H, D)), jnp.float32)
    pos = jnp.arange(500, 508)[None]
    whole = scores(q, k, pos, pos)
    half = scores(q[:, :4], k, pos[:, :4], pos)
    chex.assert_trees_all_close(half, whole[:, :, :4], atol=1e-5, rtol=1e-5)


def test_causal_only_in_a_model():
    with pytest.raises(ValueError, match="'xpos' is defined for causal attention only"):
        posenc_jax.TransformerConfig(vocab_size=8, num_layers=1, embed_dim=32, num_heads=2,
                                     mlp_dim=8, encoding="xpos", causal=False)
