"""T5 bucketed bias and Shaw et al. clipped relative embeddings."""

import math

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

from posenc_jax.encodings import relative

_t5_bias = jax.jit(relative.t5_bias,
                   static_argnames=("bidirectional", "num_buckets", "max_distance"))
_t5_bucket = jax.jit(relative.t5_bucket,
                     static_argnames=("bidirectional", "num_buckets", "max_distance"))
_shaw_bias = jax.jit(relative.shaw_bias, static_argnames=("max_relative_position",))


def t5_reference(rel, bidirectional, num_buckets, max_distance):
    """T5's bucket formula, written again in NumPy float64."""
    rel = np.asarray(rel, np.int64)
    out = np.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        out += (rel > 0) * num_buckets
        n = np.abs(rel)
    else:
        n = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    ratio = np.log(np.maximum(n, 1) / max_exact) / math.log(max_distance / max_exact)
    large = np.minimum(max_exact + np.floor(ratio * (num_buckets - max_exact)).astype(np.int64),
                       num_buckets - 1)
    return out + np.where(n < max_exact, n, large)


def test_relative_positions_is_memory_minus_query():
    got = relative.relative_positions(jnp.array([0, 1, 5]), jnp.array([0, 2]))
    chex.assert_type(got, jnp.int32)
    np.testing.assert_array_equal(np.asarray(got), [[0, 2], [-1, 1], [-5, -3]])
    chex.assert_shape(relative.relative_positions(jnp.zeros((4, 3), int), jnp.arange(2)),
                      (4, 3, 2))


def test_t5_golden_buckets():
    rel = jnp.array([0, 1, -1, 7, -7, 8, 16, 32, 127, 128, -200, 1000])
    bi = _t5_bucket(rel, bidirectional=True)            # 32 buckets, 128 distance
    np.testing.assert_array_equal(np.asarray(bi), [0, 17, 1, 23, 7, 24, 26, 28, 31, 31, 15, 31])
    rel = jnp.array([5, 1, 0, -1, -15, -16, -32, -64, -127, -128, -10**6])
    causal = _t5_bucket(rel, bidirectional=False)
    np.testing.assert_array_equal(np.asarray(causal), [0, 0, 0, 1, 15, 16, 21, 26, 31, 31, 31])


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance",
                         [(32, 128), (64, 256), (8, 20), (4, 10), (128, 4096), (10, 100)])
def test_t5_matches_float64_port(bidirectional, num_buckets, max_distance):
    rel = np.arange(-5000, 5001)
    got = _t5_bucket(jnp.asarray(rel), bidirectional=bidirectional,
                     num_buckets=num_buckets, max_distance=max_distance)
    chex.assert_type(got, jnp.int32)
    want = t5_reference(rel, bidirectional, num_buckets, max_distance)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert 0 <= want.min() and want.max() == num_buckets - 1  # every bucket range reached
    if not bidirectional:
        assert (np.asarray(got)[rel > 0] == 0).all()          # the future is bucket 0
    # Monotone: farther away never maps to a closer bucket within one direction.
    past = np.asarray(got)[rel <= 0][::-1]
    assert (np.diff(past) >= 0).all()


def test_t5_bias_equals_table_gather():
    table = relative.t5_init(jax.random.key(0), num_buckets=16, num_heads=3)
    chex.assert_shape(table, (16, 3))
    q, k = jnp.array([[0, 4, 9], [100, 101, 102]]), jnp.array([0, 3, 50, 200])
    kw = {"bidirectional": True, "num_buckets": 16, "max_distance": 64}
    got = _t5_bias(table, q, k, **kw)
    chex.assert_shape(got, (2, 3, 3, 4))
    rel = np.asarray(k)[None, None, :] - np.asarray(q)[:, :, None]
    want = np.moveaxis(np.asarray(table)[t5_reference(rel, True, 16, 64)], -1, -3)
    np.testing.assert_array_equal(np.asarray(got), want)
    chex.assert_shape(_t5_bias(table, jnp.arange(3), jnp.arange(4), **kw), (3, 3, 4))
    chex.assert_type(_t5_bias(table.astype(jnp.bfloat16), q, k, **kw), jnp.bfloat16)
    g = jax.jit(jax.grad(lambda t: relative.t5_bias(t, q, k, **kw).sum()))(table)
    # Each of the 2 * 3 * 4 (batch, query, key) entries uses one bucket row for all 3 heads.
    np.testing.assert_array_equal(np.asarray(g).sum(0), [2 * 3 * 4] * 3)


@given(offset=st.integers(-10**5, 10**5), bidirectional=st.booleans(),
       positions=st.lists(st.integers(0, 10**4), min_size=4, max_size=4))
def test_t5_bias_translation_invariant_and_causal_future(offset, bidirectional, positions):
    table = jnp.arange(32 * 2, dtype=jnp.float32).reshape(32, 2)
    q, k = jnp.asarray(positions), jnp.asarray(positions[::-1])
    kw = {"bidirectional": bidirectional, "num_buckets": 32, "max_distance": 128}
    chex.assert_trees_all_equal(_t5_bias(table, q + offset, k + offset, **kw),
                                _t5_bias(table, q, k, **kw))
    if not bidirectional:
        future = np.asarray(k)[None, :] > np.asarray(q)[:, None]
        b = np.asarray(_t5_bias(table, q, k, **kw))
        np.testing.assert_array_equal(b[:, future], np.asarray(table)[0][:, None].repeat(
            future.sum(), 1))


def shaw_naive(table, q, q_pos, k_pos, k):
    """Materialise a_ij [.., Lq, Lk, D] and contract: the definition, in float64."""
    rel = np.clip(np.asarray(k_pos)[..., None, :] - np.asarray(q_pos)[..., :, None], -k, k)
    a = np.asarray(table, np.float64)[rel + k]                         # [(B,) Lq, Lk, D]
    if a.ndim == 3:
        a = np.broadcast_to(a, (q.shape[0],) + a.shape)
    return np.einsum("bqhd,bqkd->bhqk", np.asarray(q, np.float64), a)


@pytest.mark.parametrize("pos_kind", ["1d", "batched", "mixed"])
def test_shaw_equals_naive_materialised_form(pos_kind):
    K = 3
    table = relative.shaw_init(jax.random.key(1), max_relative_position=K, head_dim=8)
    chex.assert_shape(table, (2 * K + 1, 8))
    q = jnp.asarray(np.random.default_rng(2).standard_normal((2, 5, 4, 8), np.float32))
    qp = {"1d": jnp.arange(5), "batched": jnp.array([[0, 1, 2, 3, 4], [9, 3, 7, 0, 20]]),
          "mixed": jnp.array([[0, 1, 2, 3, 4], [9, 3, 7, 0, 20]])}[pos_kind]
    kp = {"1d": jnp.arange(6) * 2, "batched": jnp.array([[0, 1, 2, 3, 4, 5], [1, 1, 8, 2, 9, 30]]),
          "mixed": jnp.arange(6) * 2}[pos_kind]
    got = _shaw_bias(table, q, qp, kp, max_relative_position=K)
    chex.assert_shape(got, (2, 4, 5, 6))
    want = shaw_naive(table, q, np.broadcast_to(qp, (2, 5)), np.broadcast_to(kp, (2, 6)), K)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)


@given(offset=st.integers(-10**5, 10**5), K=st.sampled_from([1, 4]),
       positions=st.lists(st.integers(0, 50), min_size=5, max_size=5))
def test_shaw_translation_invariant_and_clipped(offset, K, positions):
    rng = np.random.default_rng(K)
    table = jnp.asarray(rng.standard_normal((2 * K + 1, 8), np.float32))
    q = jnp.asarray(rng.standard_normal((2, 5, 4, 8), np.float32))
    p = jnp.asarray(positions)
    got = _shaw_bias(table, q, p, p, max_relative_position=K)
    chex.assert_trees_all_equal(_shaw_bias(table, q, p + offset, p + offset,
                                           max_relative_position=K), got)
    # Every key beyond distance K looks exactly like one at distance K.
    far = jnp.array([p[0] + K + 7, p[0] - K - 1000, p[0] + K, p[0] - K, p[0]])
    b = np.asarray(_shaw_bias(table, q, p[:1].repeat(5), far, max_relative_position=K))
    np.testing.assert_array_equal(b[..., 0], b[..., 2])
    np.testing.assert_array_equal(b[..., 1], b[..., 3])


def test_float_positions_are_type_errors():
    with pytest.raises(TypeError, match="q_positions must have an integer dtype.*float32"):
        relative.relative_positions(jnp.arange(3.0), jnp.arange(3))
    with pytest.raises(TypeError, match="relative_position must have an integer dtype"):
        relative.t5_bucket(jnp.array([0.5]), bidirectional=True)
    table = jnp.zeros((32, 2))
    with pytest.raises(TypeError, match="k_positions must have an integer dtype.*bfloat16"):
        relative.t5_bias(table, jnp.arange(3), jnp.arange(3, dtype=jnp.bfloat16),
                         bidirectional=True, num_buckets=32, max_distance=128)
    with pytest.raises(TypeError, match="integer dtype.*float32"):
        relative.shaw_bias(jnp.zeros((3, 4)), jnp.zeros((1, 2, 1, 4)), jnp.arange(2.0),
                           jnp.arange(2), max_relative_position=1)


@pytest.mark.parametrize("kw, msg", [
    ({"bidirectional": False, "num_buckets": 1}, "num_buckets must be >= 2, got num_buckets=1"),
    ({"bidirectional": True, "num_buckets": 0}, "num_buckets must be >= 2, got num_buckets=0"),
    ({"bidirectional": True, "num_buckets": 2}, "even and >= 4, got num_buckets=2"),
    ({"bidirectional": True, "num_buckets": 33}, "even and >= 4, got num_buckets=33"),
    ({"bidirectional": True, "max_distance": 0}, "max_distance must be >= 1, got max_distance=0"),
    ({"bidirectional": True, "max_distance": 8}, "exceed the 8 exact buckets.*max_distance=8"),
    ({"bidirectional": False, "num_buckets": 2, "max_distance": 1}, "exceed the 1 exact buckets"),
])
def test_bad_t5_hyperparameters(kw, msg):
    with pytest.raises(ValueError, match=msg):
        relative.t5_bucket(jnp.arange(3), **kw)


def test_bad_tables_and_K():
    with pytest.raises(ValueError, match=r"\[num_buckets=32, H\], got shape \(16, 2\)"):
        relative.t5_bias(jnp.zeros((16, 2)), jnp.arange(3), jnp.arange(3),
                         bidirectional=True, num_buckets=32, max_distance=128)
    for k in (0, -1):
        with pytest.raises(ValueError, match=f"max_relative_position must be >= 1, got "
                                             f"max_relative_position={k}"):
            relative.shaw_init(jax.random.key(0), max_relative_position=k, head_dim=4)
        with pytest.raises(ValueError, match=f"max_relative_position={k}"):
            relative.shaw_bias(jnp.zeros((3, 4)), jnp.zeros((1, 2, 1, 4)), jnp.arange(2),
                               jnp.arange(2), max_relative_position=k)
    with pytest.raises(ValueError, match=r"2K\+1=5 rows for max_relative_position=2, got shape"):
        relative.shaw_bias(jnp.zeros((3, 4)), jnp.zeros((1, 2, 1, 4)), jnp.arange(2),
                           jnp.arange(2), max_relative_position=2)
    with pytest.raises(ValueError, match=r"width 4 must equal q's head dim D.*\(1, 2, 1, 8\)"):
        relative.shaw_bias(jnp.zeros((5, 4)), jnp.zeros((1, 2, 1, 8)), jnp.arange(2),
                           jnp.arange(2), max_relative_position=2)
