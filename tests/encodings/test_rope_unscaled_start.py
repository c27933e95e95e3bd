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


def test_frequency_table_rotates_as_the_static_encoding_under_one_program():
    """`frequency_table`: the rotation is read from params, so several static encodings
    (factors, starts, attention factors) are one jitted function with new params each."""
    q = jax.random.normal(jax.random.key(2), (1, 40, 2, 2 * R))
    pos = jnp.arange(40)
    table = posenc_jax.get("rope", head_dim=2 * R, scaling=SCALING, frequency_table=True,
                           max_position_embeddings=64)
    assert not table.is_length_dependent and int(table.regime(pos)) == 0
    rotate = jax.jit(lambda p, q: table.rotate(p, q, q, pos, pos)[0])
    cases = [(SCALING, 0), (SCALING, 5), ({**SCALING, "long_factor": [1.0, 1.0, 3.0, 8.0],
                                           "factor": 9.0}, 12), (None, 0)]
    for scaling, start in cases:
        static = posenc_jax.get("rope", head_dim=2 * R, scaling=scaling, unscaled_start=start)
        params = static.frequency_params(40)
        want = jax.jit(lambda q: static.rotate({}, q, q, pos, pos)[0])(q)  # another program:
        np.testing.assert_allclose(rotate(params, q), want, rtol=0, atol=5e-7)  # 1-2 ulp
    assert rotate._cache_size() == 1
    init = table.init(jax.random.key(0))  # the config's own rotation, at its context (long)
    np.testing.assert_array_equal(init["inv_freq"], table.frequencies(64)[0])
    assert float(init["unscaled_start"]) == 0.0 and init["attention_factor"].dtype == jnp.float32
    assert posenc_jax.get("rope", head_dim=8).init(jax.random.key(0)) == {}
    with pytest.raises(ValueError, match="frequency_table=True .* cannot be applied in-kernel"):
        table.kernel_rotation(init)
    with pytest.raises(TypeError, match="frequency_table must be a bool"):
        posenc_jax.get("rope", head_dim=8, frequency_table=1)
