"""Sandwich (Chi et al. 2023): translation invariance, zero at distance 0 and below it
everywhere, non-increasing up to the first oscillation and on average over octaves, the head
compression, float64 parity at 10^6, the elementwise hook."""

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

import posenc_jax
from posenc_jax.encodings import base

H, DIM = 8, 128


def reference(dist, dim, num_heads):
    """float64: (sum_{i=1}^{d'/2} cos(d omega_i) - d'/2) / (8h / H): [H, ...]."""
    w = 10000.0 ** (-2.0 * np.arange(1, dim // 2 + 1) / dim)
    base = np.cos(np.asarray(dist, np.float64)[..., None] * w).sum(-1) - dim / 2
    r = 8.0 * np.arange(1, num_heads + 1) / num_heads
    return base[None] / r.reshape((-1,) + (1,) * base.ndim)


ENC = posenc_jax.get("sandwich", num_heads=H, embed_dim=DIM)
BIAS = jax.jit(lambda qp, kp: ENC.bias({}, qp, kp))


@given(offset=st.integers(0, 10**6))
def test_bias_is_translation_invariant(offset):
    pos = jnp.arange(12)
    np.testing.assert_array_equal(np.asarray(BIAS(pos + offset, pos + offset)),
                                  np.asarray(BIAS(pos, pos)))


def test_zero_at_distance_zero_and_strictly_below_elsewhere():
    dist = jnp.arange(0, 20_000)
    b = np.asarray(BIAS(jnp.zeros((1,), jnp.int32), dist))[:, 0]                # [H, n]
    assert np.all(b[:, 0] == 0.0)
    assert np.all(b[:, 1:] < 0.0)


def test_non_increasing_until_the_first_oscillation_and_on_average_over_octaves():
    """Not monotone (sum of cosines); what holds: non-increasing up to distance 13 for
    d' = 128, and the mean over each octave [2^k, 2^(k+1)) decreases up to 2^13."""
    dist = jnp.arange(0, 2**13)
    b = np.asarray(BIAS(jnp.zeros((1,), jnp.int32), dist))[:, 0]
    assert np.all(np.diff(b[:, :14], axis=-1) <= 0.0)
    assert np.any(np.diff(b[:, 13:15], axis=-1) > 0.0)       # the first rise, as in float64
    octaves = np.stack([b[:, 2**k:2**(k + 1)].mean(-1) for k in range(12)], -1)
    assert np.all(np.diff(octaves, axis=-1) < 0.0)


def test_head_compression_is_8h_over_H():
    b = np.asarray(BIAS(jnp.zeros((1,), jnp.int32), jnp.arange(1, 50)), np.float64)[:, 0]
    np.testing.assert_allclose(b / b[0], np.broadcast_to(
        (1.0 / np.arange(1, H + 1))[:, None], b.shape), rtol=1e-6)


def test_matches_float64_up_to_float32_angles_at_1e6():
    qp = jnp.array([0, 17, 999_990, 1_000_000])
    kp = jnp.array([0, 3, 500_000, 999_999])
    got = np.asarray(BIAS(qp, kp), np.float64)
    dist = np.abs(np.asarray(kp)[None, :] - np.asarray(qp)[:, None])
    want = reference(dist, DIM, H)
    # float32 angle d * omega carries ~2 d omega 2^-24 rad per term (the bfloat16 tolerance of the house design).
    w = 10000.0 ** (-2.0 * np.arange(1, DIM // 2 + 1) / DIM)
    tol = (2.0 * dist[..., None] * w * 2.0**-24).sum(-1) + 1e-5
    assert np.all(np.abs(got - want) <= tol[None] + 1e-6 * np.abs(want)), np.max(
        np.abs(got - want) - tol[None])


def test_elementwise_hook_on_a_block_equals_the_bias():
    qp, kp = jnp.arange(40, 48), jnp.arange(30, 46)
    block = jax.jit(ENC.elementwise_bias)({}, qp[:, None], kp[None, :], jnp.int32(5))
    chex.assert_trees_all_close(block, ENC.bias({}, qp, kp)[5], rtol=1e-6, atol=1e-6)


def test_errors_name_the_values():
    with pytest.raises(ValueError, match="embed_dim \\(d'\\) must be even, got embed_dim=7"):
        posenc_jax.get("sandwich", num_heads=2, embed_dim=7)
    with pytest.raises(ValueError, match=r"embed_dim=64 does not match the model's embed_dim=32"):
        posenc_jax.for_model("sandwich", {"embed_dim": 64}, embed_dim=32, num_heads=2,
                             head_dim=16)


@pytest.mark.optimized_compile  # bit for bit: two programs, as XLA's optimised pipeline compiles them
def test_bias_equals_the_elementwise_hook_bit_for_bit_on_batched_positions():
    qp = jnp.array([[0, 5, 999_990, 7], [3, 3, 1, 2]])                       # [B, Lq]
    kp = jnp.array([[1_000_000, 2, 0, 40, 9], [0, 1, 2, 3, 4]])              # [B, Lk]
    want = jax.jit(lambda a, b: base.bias_from_elementwise(ENC, {}, a, b, num_heads=H))
    np.testing.assert_array_equal(np.asarray(BIAS(qp, kp)), np.asarray(want(qp, kp)))
    np.testing.assert_array_equal(np.asarray(BIAS(qp[0], kp)), np.asarray(want(qp[0], kp)))


def test_bias_evaluates_the_sines_once_not_per_head_or_per_call():
    """The cost that made Sandwich 2x slower than NoPE to train (10-40x at eval): XLA fused
    the d'/2 unrolled sines into each head's loop. One sine in the compiled program, for two
    bias calls (two layers) on [B, L] positions with H = 8 heads."""
    pos = jnp.broadcast_to(jnp.arange(32), (4, 32))
    twice = jax.jit(lambda p: ENC.bias({}, p, p) + 2.0 * ENC.bias({}, p, p))
    text = twice.lower(pos).compile().as_text()
    assert text.count(" sine(") == 1, [ln for ln in text.splitlines() if " sine(" in ln][:3]
