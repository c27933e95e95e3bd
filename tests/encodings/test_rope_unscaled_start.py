"""RoPE's `unscaled_start` (LongRoPE's n-hat): positions below it rotate with the unscaled
frequencies, the rest with the scaled ones; 0 is the plain scaled rotation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc_jax

R = 4
LONG = [1.0, 1.5, 2.5, 4.0]
SCALING = {"rope_type": "longrope", "long_factor": LONG, "short_factor": [1.0] * R,
           "original_max_position_embeddings": 16, "factor": 4.0}


def reference(x, positions, *, start, long_factor, attention_factor, base=10000.0):
    """float64 NumPy: half layout; rows at positions < start use factor 1 per pair."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    theta = base ** (-np.arange(0, d, 2) / d)
    out = np.empty_like(x)
    for row, m in enumerate(positions):
        f = np.ones(d // 2) if m < start else np.asarray(long_factor)
        ang = m * theta / f
        c, s = np.cos(ang) * attention_factor, np.sin(ang) * attention_factor
        a, b = x[:, row, :, : d // 2], x[:, row, :, d // 2:]
        out[:, row, :, : d // 2] = a * c - b * s
        out[:, row, :, d // 2:] = b * c + a * s
    return out


@pytest.mark.parametrize("start", [0, 1, 5, 64])
def test_unscaled_start_matches_a_float64_reference(start):
    enc = posenc_jax.get("rope", head_dim=2 * R, scaling=SCALING, unscaled_start=start)
    q = jax.random.normal(jax.random.key(0), (2, 40, 3, 2 * R))
    pos = jnp.arange(40)
    got, _ = jax.jit(lambda q: enc.rotate({}, q, q, pos, pos))(q)
    attention = float(np.sqrt(1 + np.log(4.0) / np.log(16)))
    want = reference(q, np.arange(40), start=start, long_factor=LONG,
                     attention_factor=attention)
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=2e-5)


def test_zero_start_is_the_plain_scaled_rotation_and_no_scaling_ignores_it():
    q = jax.random.normal(jax.random.key(1), (1, 24, 2, 2 * R))
    pos = jnp.arange(24)
    plain = posenc_jax.get("rope", head_dim=2 * R, scaling=SCALING)
    zero = posenc_jax.get("rope", head_dim=2 * R, scaling=SCALING, unscaled_start=0)
    np.testing.assert_array_equal(zero.rotate({}, q, q, pos, pos)[0],
                                  plain.rotate({}, q, q, pos, pos)[0])
    bare = posenc_jax.get("rope", head_dim=2 * R, unscaled_start=8)
    np.testing.assert_array_equal(bare.rotate({}, q, q, pos, pos)[0],
                                  posenc_jax.get("rope", head_dim=2 * R).rotate(
                                      {}, q, q, pos, pos)[0])


def test_unscaled_start_is_checked_and_refused_in_kernel():
    with pytest.raises(ValueError, match="unscaled_start must be >= 0, got unscaled_start=-1"):
        posenc_jax.get("rope", head_dim=8, unscaled_start=-1)
    with pytest.raises(TypeError, match="unscaled_start must be an int"):
        posenc_jax.get("rope", head_dim=8, unscaled_start=1.5)
    enc = posenc_jax.get("rope", head_dim=2 * R, scaling=SCALING, unscaled_start=4)
    with pytest.raises(ValueError, match="unscaled_start=4 .* cannot be applied in-kernel; use "
                                         "an attention backend that calls rotate"):
        enc.kernel_rotation({}, seq_len=64)
