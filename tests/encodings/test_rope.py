"""RoPE: float64 parity, relative-position law, layouts, complex form, dtypes, and errors."""

import functools

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

from posenc_jax.encodings import rope

_apply = jax.jit(rope.apply, static_argnames=("layout", "attention_factor"))
_apply_cos_sin = jax.jit(rope.apply_cos_sin, static_argnames=("layout",))
LAYOUTS = ("half", "interleaved")
# (D, rotary_dim) pairs: full and partial rotary. Every test uses x [B=2, L=6, H=3, D] and
# positions [6] or [2, 6], so the jitted `_apply` compiles a handful of programs in all.
DIMS = [(8, 8), (12, 4)]
B, L, H = 2, 6, 3


def pairs(rotary_dim, layout):
    """Index arrays (a, b): feature a[i] rotates with b[i] by frequency i."""
    r = rotary_dim // 2
    if layout == "half":
        return np.arange(r), np.arange(r) + r
    return np.arange(0, 2 * r, 2), np.arange(1, 2 * r, 2)


def reference(x, positions, inv_freq, layout, attention_factor=1.0):
    """float64 NumPy RoPE from the float32 angles (the library's specified angle precision)."""
    x = np.asarray(x, np.float64)
    f32 = np.float32
    angle = (np.asarray(positions).astype(f32)[..., None] * np.asarray(inv_freq, f32))
    angle = angle.astype(np.float64)[..., None, :]                       # [..., L, 1, R]
    while angle.ndim < x.ndim:
        angle = angle[None]
    c, s = attention_factor * np.cos(angle), attention_factor * np.sin(angle)
    a, b = pairs(2 * angle.shape[-1], layout)
    out = x.copy()
    out[..., a] = x[..., a] * c - x[..., b] * s
    out[..., b] = x[..., b] * c + x[..., a] * s
    return out


def randn(key, shape, dtype=jnp.float32):
    """Standard normal test data from NumPy (jax.random would compile a sampler per shape)."""
    data = np.random.default_rng(key).standard_normal(shape, np.float32)
    return jnp.asarray(data).astype(dtype)


def test_inv_freq_values():
    got = rope.inv_freq(8, base=10000.0)
    chex.assert_type(got, jnp.float32)
    np.testing.assert_allclose(np.asarray(got), [1.0, 0.1, 0.01, 0.001], rtol=1e-6)
    want = 1.0 / 500.0 ** (np.arange(0, 64, 2) / 64.0)
    np.testing.assert_allclose(np.asarray(rope.inv_freq(64, base=500.0)), want, rtol=2e-6)


class ApplyTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_float64_reference(self):
        for (d, rot), layout, pos_shape in [((8, 8), "half", (L,)), ((12, 4), "half", (B, L)),
                                            ((8, 8), "interleaved", (B, L)),
                                            ((12, 4), "interleaved", (L,))]:
            x = randn(d, (B, L, H, d))
            pos = np.arange(np.prod(pos_shape)).reshape(pos_shape) * 37 + 3
            inv = rope.inv_freq(rot)
            fn = self.variant(functools.partial(rope.apply, layout=layout,
                                                attention_factor=0.7))
            got = fn(x, pos, inv)
            chex.assert_shape(got, x.shape)
            chex.assert_type(got, jnp.float32)
            want = reference(x, pos, inv, layout, attention_factor=0.7)
            np.testing.assert_allclose(np.asarray(got), want, atol=2e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_positions_up_to_1e6_float32_vs_float64(self):
        x = randn(0, (1, 6, 2, 64))
        pos = jnp.array([0, 1, 65_537, 333_333, 999_999, 1_000_000])
        inv = rope.inv_freq(64)
        got = np.asarray(self.variant(rope.apply)(x, pos, inv))
        # Same float32 angles: only float32 arithmetic error.
        np.testing.assert_allclose(got, reference(x, pos, inv, "half"), atol=2e-6)
        # Exact float64 angles: the float32 angle rounding (eps * angle) dominates.
        exact = np.asarray(pos, np.float64)[:, None] / 10000.0 ** (np.arange(0, 64, 2) / 64)
        x64 = np.asarray(x, np.float64)
        out = x64.copy()
        c, s = np.cos(exact)[None, :, None], np.sin(exact)[None, :, None]
        out[..., :32] = x64[..., :32] * c - x64[..., 32:] * s
        out[..., 32:] = x64[..., 32:] * c + x64[..., :32] * s
        bound = 2 * np.finfo(np.float32).eps * 1e6 * np.abs(x64).max() * 2 + 1e-5
        assert np.abs(got - out).max() < bound


def scores_at(q, k, q_pos, k_pos, inv, layout):
    """<rot(q, m_i), rot(k, n_i)> for q, k [D] at position lists of length L -> [L]."""
    d = q.shape[-1]
    qs, ks = (jnp.broadcast_to(v, (B, L, H, d)) for v in (q, k))
    rq = _apply(qs, jnp.asarray(q_pos), inv, layout=layout)
    rk = _apply(ks, jnp.asarray(k_pos), inv, layout=layout)
    return np.asarray(jnp.sum(rq * rk, axis=-1))[0, :, 0]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_golden_relative_check_dim8(layout):
    q, k = randn(1, (8,)), randn(2, (8,))
    s02, s24, s35, s03, _, _ = scores_at(q, k, [0, 2, 3, 0, 0, 0], [2, 4, 5, 3, 0, 0],
                                         rope.inv_freq(8), layout)
    np.testing.assert_allclose(s02, s24, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s02, s35, rtol=1e-5, atol=1e-6)
    assert not np.allclose(s02, s03, atol=1e-4)  # the scores do depend on m - n


@given(m=st.integers(0, 4096), n=st.integers(0, 4096), shift=st.integers(-4000, 4000),
       dims=st.sampled_from(DIMS), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 99))
def test_score_depends_only_on_m_minus_n(m, n, shift, dims, layout, seed):
    d, rot = dims
    q, k = randn(seed, (d,)), randn(seed + 100, (d,))
    shift = max(shift, -min(m, n))
    s = scores_at(q, k, [m, m + shift, 0, 0, 0, 0], [n, n + shift, 0, 0, 0, 0],
                  rope.inv_freq(rot), layout)
    # Float32 angles round to eps * angle; scores move by about that times |q||k|.
    tol = 4 * np.finfo(np.float32).eps * (max(m, n) + abs(shift) + 1) * d + 1e-5
    np.testing.assert_allclose(s[1], s[0], atol=tol)


@given(dims=st.sampled_from(DIMS), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 99),
       offset=st.integers(0, 50_000))
def test_shifting_all_positions_leaves_scores_unchanged(dims, layout, seed, offset):
    d, rot = dims
    q, k = randn(seed, (B, L, H, d)), randn(seed + 1, (B, L, H, d))
    pos = jnp.array([[0, 1, 2, 3, 4, 5], [3, 9, 2, 40, 41, 7]])
    inv = rope.inv_freq(rot)

    def scores(p):
        rq, rk = _apply(q, p, inv, layout=layout), _apply(k, p, inv, layout=layout)
        return np.asarray(jnp.einsum("bqhd,bkhd->bhqk", rq, rk))

    tol = 4 * np.finfo(np.float32).eps * (offset + 50) * d + 1e-5
    np.testing.assert_allclose(scores(pos + offset), scores(pos), atol=tol)


@given(dims=st.sampled_from(DIMS), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 99))
def test_norm_preserved_and_pass_through_untouched(dims, layout, seed):
    d, rot = dims
    x = randn(seed, (B, L, H, d))
    pos = jnp.asarray(np.random.default_rng(seed).integers(0, 100_000, (B, L)))
    y = _apply(x, pos, rope.inv_freq(rot), layout=layout)
    np.testing.assert_allclose(np.asarray(jnp.linalg.norm(y, axis=-1)),
                               np.asarray(jnp.linalg.norm(x, axis=-1)), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(y[..., rot:]), np.asarray(x[..., rot:]))
    # Each rotated pair keeps its own norm too.
    a, b = pairs(rot, layout)
    np.testing.assert_allclose(np.asarray(y[..., a] ** 2 + y[..., b] ** 2),
                               np.asarray(x[..., a] ** 2 + x[..., b] ** 2), rtol=1e-4, atol=1e-6)


def test_pass_through_keeps_non_finite_values_exactly():
    row = jnp.array([1.0, 2.0, 3.0, 4.0, jnp.inf, jnp.nan, -0.0, -jnp.inf, 5, 6, 7, 8])
    x = jnp.broadcast_to(row, (B, L, H, 12))
    y = np.asarray(_apply(x, jnp.arange(L) + 3, rope.inv_freq(4), layout="half"))
    np.testing.assert_array_equal(y[..., 4:], np.asarray(x[..., 4:]))
    assert np.signbit(y[..., 6]).all()


@given(dims=st.sampled_from(DIMS), seed=st.integers(0, 99))
def test_half_and_interleaved_agree_after_permutation(dims, seed):
    d, rot = dims
    r = rot // 2
    # perm[2i] = i, perm[2i + 1] = i + R: half-layout features in interleaved order.
    perm = np.concatenate([np.stack([np.arange(r), np.arange(r) + r], -1).reshape(-1),
                           np.arange(rot, d)])
    x = randn(seed, (B, L, H, d))
    pos = jnp.array([0, 5, 17, 123_456, 3, 1])
    inv = rope.inv_freq(rot)
    half = _apply(x, pos, inv, layout="half")
    inter = _apply(x[..., perm], pos, inv, layout="interleaved")
    # Same arithmetic up to operation order (one float32 rounding).
    np.testing.assert_allclose(np.asarray(inter), np.asarray(half[..., perm]), atol=1e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_complex_number_form(layout):
    x = randn(3, (B, L, H, 8))
    pos = np.array([0, 1, 10, 100, 1000, 9999])
    inv = rope.inv_freq(8)
    a, b = pairs(8, layout)
    xn = np.asarray(x, np.float64)
    z = xn[..., a] + 1j * xn[..., b]                                   # [B, L, H, R]
    theta = (pos.astype(np.float32)[:, None] * np.asarray(inv)).astype(np.float64)
    zr = z * np.exp(1j * theta)[None, :, None, :]                      # q * e^{i m theta}
    y = np.asarray(_apply(x, pos, inv, layout=layout))
    np.testing.assert_allclose(y[..., a], zr.real, atol=2e-6)
    np.testing.assert_allclose(y[..., b], zr.imag, atol=2e-6)


def bf16_ulp(v):
    """Spacing of bfloat16 numbers at |v| (8 significant bits)."""
    return 2.0 ** (np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** -126))) - 7)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bfloat16_is_the_float32_result_rounded(layout):
    d, rot = 64, 48  # rotated and pass-through features
    x = randn(4, (2, 32, 4, d), jnp.bfloat16)
    pos = jnp.asarray(np.random.default_rng(5).integers(0, 1_000_001, (2, 32)))
    inv = rope.inv_freq(rot)
    got = _apply(x, pos, inv, layout=layout)
    chex.assert_type(got, jnp.bfloat16)
    f32 = np.asarray(_apply(x.astype(jnp.float32), pos, inv, layout=layout))
    want = np.asarray(jnp.asarray(f32).astype(jnp.bfloat16), np.float32)
    got = np.asarray(got, np.float32)
    # XLA may contract x*c + p*s into an FMA in one program and not the other, which moves
    # the float32 value by an ulp; only values that sit on a bfloat16 rounding midpoint can
    # then round the other way. Everything else must be bit-identical.
    assert (got == want).mean() > 0.999
    f32_slack = 4 * np.finfo(np.float32).eps * np.abs(f32)
    assert (np.abs(got - f32) <= 0.5 * bf16_ulp(f32) + f32_slack).all()
    # The check has teeth: angles computed in bfloat16 miss by far more at these positions.
    angles = (pos.astype(jnp.bfloat16)[..., None] * inv.astype(jnp.bfloat16)[None, None])
    angles = angles.astype(jnp.float32)
    bad = _apply_cos_sin(x, jnp.cos(angles), jnp.sin(angles), layout=layout)
    bad = np.asarray(bad, np.float32)
    assert not (np.abs(bad - f32) <= 0.5 * bf16_ulp(f32) + f32_slack).all()
    # float16 keeps its dtype too and is close to the float32 result.
    got16 = _apply(x.astype(jnp.float16), pos, inv, layout=layout)
    chex.assert_type(got16, jnp.float16)
    np.testing.assert_allclose(np.asarray(got16, np.float32), f32, atol=0.01)


def test_bfloat16_widening_is_exact():
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)        # every bfloat16 value
    x = jnp.asarray(bits.view(jnp.bfloat16))
    got = np.asarray(jax.jit(rope._to_float32)(x))
    want = np.asarray(x.astype(jnp.float32))
    nan = np.isnan(want)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.isnan(got[nan]).all()


def test_bfloat16_rounding_is_bit_identical_to_astype():
    f32 = np.float32
    special = np.array([0.0, -0.0, 1.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1e-40,
                        -1e-42, 1.00390625, 1.01171875, 1.0039063, 65504.0], f32)
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)
    values = jnp.asarray(np.concatenate([special, bits.view(f32)]))
    got = np.asarray(jax.jit(rope._round_to_bfloat16)(values)).view(np.uint16)
    want = np.asarray(values.astype(jnp.bfloat16)).view(np.uint16)
    nan = np.isnan(np.asarray(values))
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert np.isnan(np.asarray(jax.jit(rope._round_to_bfloat16)(values))[nan]).all()


def test_int_and_float_positions_and_attention_factor():
    x = randn(6, (B, L, H, 8))
    inv = rope.inv_freq(8)
    chex.assert_trees_all_equal(_apply(x, jnp.arange(L), inv), _apply(x, jnp.arange(L) * 1.0, inv))
    scaled = _apply(x, jnp.arange(L), inv, attention_factor=2.0)
    chex.assert_trees_all_close(scaled, 2.0 * _apply(x, jnp.arange(L), inv), rtol=1e-6)
    half_pos = _apply(x, jnp.arange(L) / 2.0, inv)                 # interpolated positions
    np.testing.assert_allclose(np.asarray(half_pos), reference(x, np.arange(L) / 2.0, inv, "half"),
                               atol=2e-6)
    cos, sin = jax.jit(rope.cos_sin)(jnp.arange(L), inv, attention_factor=2.0)  # traced factor
    chex.assert_shape((cos, sin), (L, 4))
    chex.assert_trees_all_close(cos, 2.0 * rope.cos_sin(jnp.arange(L), inv)[0], rtol=1e-6)


def test_cos_sin_shared_equals_apply_and_vmap_grad():
    x = randn(7, (B, L, H, 8))
    pos = jnp.arange(B * L).reshape(B, L)
    inv = rope.inv_freq(8)
    cos, sin = rope.cos_sin(pos, inv)
    chex.assert_shape(cos, (B, L, 4))
    chex.assert_trees_all_close(_apply_cos_sin(x, cos, sin), _apply(x, pos, inv),
                                atol=1e-6)
    vm = jax.vmap(lambda xi, pi: rope.apply(xi[None], pi[None], inv)[0])(x, pos)
    chex.assert_trees_all_close(vm, _apply(x, pos, inv), atol=1e-6)
    # Rotation is linear and orthogonal: grad of |rot(x)|^2 / 2 is x.
    g = jax.jit(jax.grad(lambda v: 0.5 * jnp.sum(rope.apply(v, pos, inv) ** 2)))(x)
    chex.assert_trees_all_close(g, x, atol=1e-5)


@pytest.mark.parametrize("rotary_dim", [7, 1, 0, -2])
def test_bad_rotary_dim(rotary_dim):
    with pytest.raises(ValueError, match=f"even and >= 2, got rotary_dim={rotary_dim}"):
        rope.inv_freq(rotary_dim)


@pytest.mark.parametrize("base", [0.0, -10.0])
def test_bad_base(base):
    with pytest.raises(ValueError, match=f"base must be > 0, got base={base}"):
        rope.inv_freq(8, base=base)


def test_bad_layout_rotary_dim_and_shapes():
    x = jnp.zeros((2, 4, 3, 8))
    with pytest.raises(ValueError, match=r"unknown layout 'neox'; valid: 'half', 'interleaved'"):
        rope.apply(x, jnp.arange(4), rope.inv_freq(8), layout="neox")
    with pytest.raises(ValueError, match=r"rotary dim 2R=16 .* <= head dim D=8"):
        rope.apply(x, jnp.arange(4), rope.inv_freq(16))
    with pytest.raises(ValueError, match=r"leading shape \(3, 4\) does not broadcast"):
        rope.apply(x, jnp.zeros((3, 4), jnp.int32), rope.inv_freq(8))
    with pytest.raises(ValueError, match=r"leading shape \(5,\) does not broadcast"):
        rope.apply(x, jnp.arange(5), rope.inv_freq(8))
    with pytest.raises(TypeError, match="floating point, got dtype=int32"):
        rope.apply(jnp.zeros((1, 4, 1, 8), jnp.int32), jnp.arange(4), rope.inv_freq(8))


def test_bfloat16_rotation_has_the_float32_gradient():
    """The bfloat16 path widens/rounds with bit operations; their custom JVP keeps it
    differentiable like astype (bit operations alone give a zero gradient)."""
    x = jax.random.normal(jax.random.key(0), (2, 5, 3, 8))
    inv = rope.inv_freq(8)
    w = jax.random.normal(jax.random.key(1), x.shape)

    def loss(x):
        return jnp.sum(rope.apply(x, jnp.arange(5), inv).astype(jnp.float32) * w)

    g16 = jax.jit(jax.grad(loss))(x.astype(jnp.bfloat16)).astype(jnp.float32)
    g32 = jax.jit(jax.grad(loss))(x)
    np.testing.assert_allclose(g16, g32, atol=3e-2 * float(jnp.max(jnp.abs(g32))))
