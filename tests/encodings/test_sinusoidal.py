"""Sinusoidal encoding: the seed table, a float64 reference, and the shift-is-a-rotation law."""

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

from posenc_jax.encodings import sinusoidal

# Vaswani et al., max_len=8, d_model=4 (issue 2's seed text).
GOLDEN = np.array([
    [0.0000, 1.0000, 0.0000, 1.0000],
    [0.8415, 0.5403, 0.0100, 0.9999],
    [0.9093, -0.4161, 0.0200, 0.9998],
    [0.1411, -0.9900, 0.0300, 0.9996],
    [-0.7568, -0.6536, 0.0400, 0.9992],
    [-0.9589, 0.2837, 0.0500, 0.9988],
    [-0.2794, 0.9602, 0.0600, 0.9982],
    [0.6570, 0.7539, 0.0699, 0.9976],
])


def reference(positions, dim, base=10000.0):
    """Independent float64 NumPy form of the paper's formula."""
    pos = np.asarray(positions, np.float64)[..., None]
    i = np.arange(dim // 2, dtype=np.float64)
    angle = pos / base ** (2 * i / dim)
    out = np.empty(pos.shape[:-1] + (dim,))
    out[..., 0::2], out[..., 1::2] = np.sin(angle), np.cos(angle)
    return out


class EncodeTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_golden_table(self):
        pe = self.variant(lambda p: sinusoidal.encode(p, 4))(jnp.arange(8))
        chex.assert_shape(pe, (8, 4))
        chex.assert_type(pe, jnp.float32)
        np.testing.assert_allclose(np.asarray(pe), GOLDEN, atol=5e-5 + 1e-7)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_float64_reference_any_leading_dims(self):
        pos = np.array([[0, 3, 17, 255], [1000, 4095, 2, 9]], np.int32)
        pe = self.variant(lambda p: sinusoidal.encode(p, 16, base=500.0))(pos)
        chex.assert_shape(pe, (2, 4, 16))
        # float32 angles: error grows like eps * angle (<= 4095 rad here).
        np.testing.assert_allclose(np.asarray(pe), reference(pos, 16, 500.0), atol=1e-3)
        small = self.variant(lambda p: sinusoidal.encode(p, 16))(pos[:, :3] % 64)
        np.testing.assert_allclose(np.asarray(small), reference(pos[:, :3] % 64, 16), atol=1e-5)


def test_float_positions_equal_int_positions():
    pe_int = jax.jit(lambda p: sinusoidal.encode(p, 8))(jnp.arange(5))
    pe_float = jax.jit(lambda p: sinusoidal.encode(p, 8))(jnp.arange(5.0))
    chex.assert_trees_all_equal(pe_int, pe_float)


encode = jax.jit(sinusoidal.encode, static_argnums=1)
_shift_matrix = jax.jit(sinusoidal.shift_matrix, static_argnums=1)


@given(
    positions=st.lists(st.integers(0, 4000), min_size=6, max_size=6),
    k=st.integers(-2000, 2000),
    dim=st.sampled_from([2, 4, 8, 64]),
)
def test_shift_is_a_fixed_block_rotation(positions, k, dim):
    pos = jnp.asarray(positions, jnp.float32)
    m = _shift_matrix(k, dim)
    chex.assert_shape(m, (dim, dim))
    shifted = encode(pos + k, dim)
    mapped = encode(pos, dim) @ m
    # Both sides round their float32 angles independently: allow a few eps * |angle|.
    atol = 8 * np.finfo(np.float32).eps * (max(positions) + abs(k)) + 1e-5
    np.testing.assert_allclose(np.asarray(mapped), np.asarray(shifted), atol=atol)
    # M_k is orthogonal (a rotation): it preserves norms and M_k^T = M_-k.
    np.testing.assert_allclose(np.asarray(m @ m.T), np.eye(dim), atol=1e-5)
    np.testing.assert_allclose(np.asarray(m.T), np.asarray(_shift_matrix(-k, dim)), atol=1e-6)


def test_vmap_and_grad():
    pos = jnp.arange(6.0).reshape(2, 3)
    chex.assert_trees_all_close(jax.jit(jax.vmap(lambda p: sinusoidal.encode(p, 4)))(pos),
                                encode(pos, 4))
    # d/dpos sin(pos * w0) at pos=0 is w0 = 1 for the first feature.
    g = jax.jit(jax.grad(lambda p: sinusoidal.encode(p, 4)[0, 0]))(jnp.zeros((1,)))
    np.testing.assert_allclose(np.asarray(g), [1.0], atol=1e-6)


@pytest.mark.parametrize("dim", [3, 7, 1, 0, -2])
def test_bad_dim(dim):
    with pytest.raises(ValueError, match=f"dim must be an even int >= 2, got dim={dim}"):
        sinusoidal.encode(jnp.arange(4), dim)
    with pytest.raises(ValueError, match=f"got dim={dim}"):
        sinusoidal.shift_matrix(1, dim)


@pytest.mark.parametrize("base", [0.0, -1.0])
def test_bad_base(base):
    with pytest.raises(ValueError, match=rf"base must be > 0, got base={base}"):
        sinusoidal.encode(jnp.arange(4), 4, base=base)
