"""ALiBi: Press et al.'s slopes for any head count, and the bias -slope * |i - j|."""

import math

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

from posenc_jax.encodings import alibi

_bias = jax.jit(alibi.bias)


def press_slopes(n):
    """The paper's reference recipe (ofirpress/attention_with_linear_biases), float64."""
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    c = 2 ** math.floor(math.log2(n))
    return power_of_2(c) + press_slopes(2 * c)[0::2][: n - c]


def test_golden_slopes():
    np.testing.assert_array_equal(np.asarray(alibi.slopes(8)), 1.0 / 2.0 ** np.arange(1, 9))
    twelve = 2.0 ** -np.array([1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5])
    np.testing.assert_allclose(np.asarray(alibi.slopes(12)), twelve, rtol=1e-7)
    np.testing.assert_allclose(np.asarray(alibi.slopes(6)),
                               [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125], rtol=1e-7)
    np.testing.assert_array_equal(np.asarray(alibi.slopes(1)), [1.0 / 256])
    np.testing.assert_allclose(np.asarray(alibi.slopes(2)), [1.0 / 16, 1.0 / 256], rtol=1e-7)


@pytest.mark.parametrize("n", list(range(1, 41)) + [48, 64, 80, 96, 100, 128])
def test_slopes_match_press_for_any_head_count(n):
    got = np.asarray(alibi.slopes(n))
    chex.assert_shape(got, (n,))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, press_slopes(n), rtol=1e-7)
    assert (got > 0).all() and len(np.unique(got)) == n
    c = 2 ** math.floor(math.log2(n))
    if c == n:  # powers of two: a strictly decreasing geometric sequence
        assert (np.diff(got) < 0).all()
        np.testing.assert_allclose(got[1:] / got[:-1], got[0], rtol=1e-6)
    else:  # otherwise the c-head slopes, then every other slope of the 2c-head sequence
        np.testing.assert_array_equal(got[:c], np.asarray(alibi.slopes(c)))
        np.testing.assert_array_equal(got[c:], np.asarray(alibi.slopes(2 * c))[0::2][: n - c])
        assert (np.diff(got[:c]) < 0).all() and (np.diff(got[c:]) < 0).all()


def reference(slopes, q_pos, k_pos):
    q = np.asarray(q_pos, np.float64)[..., :, None]
    k = np.asarray(k_pos, np.float64)[..., None, :]
    dist = np.abs(q - k)[..., None, :, :]
    return -np.asarray(slopes, np.float64)[:, None, None] * dist


def test_bias_matches_numpy_for_each_position_layout():
    s = alibi.slopes(4)
    q1, k1 = np.array([0, 1, 2, 7]), np.array([0, 1, 2, 3, 4, 9])
    qb = np.array([[5, 6, 7, 8], [0, 0, 1, 1]])
    kb = np.array([[0, 1, 2, 3, 4, 5], [3, 1, 4, 1, 5, 9]])
    for q, k, shape in [(q1, k1, (4, 4, 6)), (qb, kb, (2, 4, 4, 6)), (qb, k1, (2, 4, 4, 6)),
                        (q1, kb, (2, 4, 4, 6))]:
        got = _bias(s, jnp.asarray(q), jnp.asarray(k))
        chex.assert_shape(got, shape)
        chex.assert_type(got, jnp.float32)
        np.testing.assert_allclose(np.asarray(got), reference(s, q, k), rtol=1e-7)
    diagonal = np.asarray(_bias(s, jnp.arange(3), jnp.arange(3)))[:, [0, 1, 2], [0, 1, 2]]
    assert (diagonal == 0).all() and not np.signbit(diagonal).any()  # +0.0, not -0.0


@given(offset=st.integers(-10**6, 10**6), heads=st.sampled_from([3, 8]),
       positions=st.lists(st.integers(0, 10**5), min_size=5, max_size=5))
def test_translation_invariant(offset, heads, positions):
    s = alibi.slopes(heads)
    q = jnp.asarray(positions)
    k = jnp.asarray(positions[::-1])
    chex.assert_trees_all_equal(_bias(s, q + offset, k + offset), _bias(s, q, k))


@given(heads=st.sampled_from([1, 5, 16]), start=st.integers(0, 10**5))
def test_monotone_in_distance(heads, start):
    s = alibi.slopes(heads)
    q = jnp.full((1,), start)
    k = start + jnp.arange(-8, 9)                              # distances 8..0..8
    b = np.asarray(_bias(s, q, k))[:, 0, :]                    # [H, 17]
    assert (np.diff(b[:, 8:], axis=-1) < 0).all()              # farther right: lower bias
    assert (np.diff(b[:, :9], axis=-1) > 0).all()              # closer from the left: higher
    np.testing.assert_array_equal(b, b[:, ::-1])               # symmetric in i - j
    np.testing.assert_array_equal(b[:, 8], 0.0)


def test_vmap_grad_and_float_positions():
    s = alibi.slopes(2)
    q = jnp.arange(6).reshape(2, 3)
    chex.assert_trees_all_equal(jax.vmap(alibi.bias, (None, 0, 0))(s, q, q), _bias(s, q, q))
    g = jax.grad(lambda m: alibi.bias(m, jnp.array([0]), jnp.array([3])).sum())(s)
    np.testing.assert_array_equal(np.asarray(g), [-3.0, -3.0])
    np.testing.assert_allclose(np.asarray(_bias(s, jnp.array([0.5]), jnp.array([2.0])))[:, 0, 0],
                               -1.5 * np.asarray(s))


@pytest.mark.parametrize("n", [0, -3])
def test_bad_num_heads(n):
    with pytest.raises(ValueError, match=f"num_heads must be >= 1, got num_heads={n}"):
        alibi.slopes(n)


@pytest.mark.parametrize("n", [2.0, True, "8"])
def test_non_int_num_heads(n):
    with pytest.raises(TypeError, match="num_heads must be an int"):
        alibi.slopes(n)


def test_bad_slopes_and_head_count_mismatch():
    with pytest.raises(ValueError, match=r"slopes must be 1-D \[H\], got shape \(2, 4\)"):
        alibi.bias(jnp.ones((2, 4)), jnp.arange(3), jnp.arange(3))
    with pytest.raises(ValueError, match=r"\(H=8\) but the attention scores have num_heads=12"):
        alibi.check_num_heads(alibi.slopes(8), 12)
    alibi.check_num_heads(alibi.slopes(12), 12)
