"""posenc_jax.encodings.rope_scaling: every method against float64 NumPy formulas written here, the
properties the methods promise (identity at factor 1, PI == RoPE at pos / s, YaRN and Llama-3
bands), validation errors, jit with a traced length, and the KV-cache regime policy."""

import math

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc_jax.encodings import rope, rope_scaling

RTOL = 2e-6  # float32 frequencies vs float64 formulas


# ----------------------------------------------------------------------- float64 references
def ref_inv(d, base):
    return base ** (-np.arange(0, d, 2, dtype=np.float64) / d)


def ref_ntk(d, base, factor):
    return ref_inv(d, base * factor ** (d / (d - 2)))


def ref_dynamic(d, base, factor, length, seq_len):
    s = max(seq_len, length)
    return ref_inv(d, base * (factor * s / length - (factor - 1)) ** (d / (d - 2)))


def ref_yarn(d, base, factor, length, beta_fast=32, beta_slow=1, truncate=True):
    def dim_of(turns):  # index i at which frequency i turns `turns` times over `length`
        return d * math.log(length / (turns * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = dim_of(beta_fast), dim_of(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    hi = hi + 0.001 if lo == hi else hi
    out = []
    for i, w in enumerate(ref_inv(d, base)):
        interp = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0 keep .. 1 interpolate
        out.append(w * (1 - interp) + w / factor * interp)
    return np.array(out), 0.1 * math.log(factor) + 1 if factor > 1 else 1.0


def ref_llama3(d, base, factor, low, high, length):
    out = []
    for w in ref_inv(d, base):
        wavelen = 2 * math.pi / w
        if wavelen < length / high:
            out.append(w)
        elif wavelen > length / low:
            out.append(w / factor)
        else:
            t = (length / wavelen - low) / (high - low)
            out.append((1 - t) * w / factor + t * w)
    return np.array(out)


def freqs(scaling, d=64, base=10000.0, **kw):
    inv, af = rope_scaling.frequencies(scaling, rotary_dim=d, base=base, **kw)
    chex.assert_shape(inv, (d // 2,))
    chex.assert_type([inv, af], jnp.float32)
    return np.asarray(inv), float(af)


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096}
DYN = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 2048}
SHORT, LONG = [1.0 + 0.05 * i for i in range(32)], [1.0 + i for i in range(32)]
LONGROPE = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "factor": 32.0,
            "original_max_position_embeddings": 4096}


# ----------------------------------------------------------------- snapshots vs float64 formulas
def test_snapshots_against_float64_formulas():
    d, base = 64, 10000.0
    np.testing.assert_allclose(freqs(None)[0], ref_inv(d, base), rtol=RTOL)
    np.testing.assert_allclose(freqs({"type": "linear", "factor": 4.0})[0],
                               ref_inv(d, base) / 4, rtol=RTOL)
    np.testing.assert_allclose(freqs({"rope_type": "ntk", "factor": 8.0})[0],
                               ref_ntk(d, base, 8.0), rtol=RTOL)
    for s in (1, 2048, 2049, 5000, 100_000):
        np.testing.assert_allclose(freqs(DYN, seq_len=s)[0], ref_dynamic(d, base, 2.0, 2048, s),
                                   rtol=RTOL, err_msg=f"seq_len={s}")
    inv, af = freqs(YARN, base=500000.0)
    want, want_af = ref_yarn(d, 500000.0, 16.0, 4096)
    np.testing.assert_allclose(inv, want, rtol=RTOL)
    assert af == pytest.approx(want_af, rel=1e-7) and af == pytest.approx(1.2772588722, rel=1e-7)
    inv, _ = freqs({**YARN, "truncate": False, "beta_fast": 16, "beta_slow": 2})
    np.testing.assert_allclose(inv, ref_yarn(d, base, 16.0, 4096, 16, 2, False)[0], rtol=RTOL)
    np.testing.assert_allclose(freqs(LLAMA3, base=500000.0)[0],
                               ref_llama3(d, 500000.0, 8.0, 1.0, 4.0, 8192), rtol=RTOL)
    for s, fac in ((None, SHORT), (4096, SHORT), (4097, LONG)):
        inv, af = freqs(LONGROPE, seq_len=s)
        np.testing.assert_allclose(inv, ref_inv(d, base) / np.array(fac), rtol=RTOL)
        assert af == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)), rel=1e-7)


def test_yarn_attention_factor_rules():
    yf = rope_scaling.yarn_attention_factor
    assert yf(factor=40.0) == pytest.approx(0.1 * math.log(40) + 1)
    assert yf(factor=40.0, mscale=1.0, mscale_all_dim=0.8) == pytest.approx(
        (0.1 * math.log(40) + 1) / (0.08 * math.log(40) + 1))
    assert yf(factor=40.0, mscale=0.707, mscale_all_dim=0.707) == 1.0  # DeepSeek: ratio 1
    assert yf(factor=8.0, attention_factor=1.5) == 1.5
    assert yf(factor=1.0) == 1.0


# ------------------------------------------------------------------------- properties
IDENTITY_AT_ONE = [
    {"rope_type": "linear", "factor": 1.0}, {"rope_type": "ntk", "factor": 1.0},
    {**DYN, "factor": 1.0}, {**YARN, "factor": 1.0}, {**LLAMA3, "factor": 1.0},
    {**LONGROPE, "factor": 1.0, "short_factor": [1.0] * 32, "long_factor": [1.0] * 32},
]


@pytest.mark.parametrize("scaling", IDENTITY_AT_ONE, ids=lambda s: s["rope_type"])
@pytest.mark.parametrize("seq_len", [None, 1, 2048])
def test_factor_one_is_identity(scaling, seq_len):
    inv, af = freqs(scaling, seq_len=seq_len)
    np.testing.assert_array_equal(inv, np.asarray(rope.inv_freq(64)))
    assert af == 1.0


@hypothesis.given(factor=st.floats(1.0, 64.0), seed=st.integers(0, 2**16),
                  shape=st.sampled_from([(5, 2, 8), (2, 7, 3, 16)]))
def test_linear_equals_rope_at_positions_over_factor(factor, seed, shape):
    d = shape[-1]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    pos = jnp.asarray(rng.integers(0, 512, shape[:-2]), jnp.int32)
    inv, _ = rope_scaling.linear(rope.inv_freq(d), factor=factor)
    got = _apply(x, pos, inv)
    want = _apply(x, pos.astype(jnp.float32) / factor, rope.inv_freq(d))
    np.testing.assert_allclose(got, want, atol=1e-4)  # float32 angles of up to 512 rad


_apply = jax.jit(rope.apply)


@hypothesis.given(factor=st.floats(1.5, 64.0), log_base=st.floats(8.0, 14.0),
                  length=st.sampled_from([1024, 4096, 32768]), d=st.sampled_from([32, 64, 128]),
                  betas=st.sampled_from([(32.0, 1.0), (16.0, 2.0), (64.0, 0.5)]),
                  truncate=st.booleans())
def test_yarn_bands(factor, log_base, length, d, betas, truncate):
    base, (fast, slow) = math.exp(log_base), betas
    plain = np.asarray(rope.inv_freq(d, base=base), np.float64)
    inv, _ = freqs({**YARN, "factor": factor, "original_max_position_embeddings": length,
                    "beta_fast": fast, "beta_slow": slow, "truncate": truncate}, d=d, base=base)
    ratio = inv / plain
    turns = length * ref_inv(d, base) / (2 * math.pi)  # rotations over the original length
    fast_band, slow_band = turns >= fast, turns <= slow
    np.testing.assert_array_equal(ratio[fast_band], 1.0)  # high frequencies untouched
    np.testing.assert_allclose(ratio[slow_band], 1.0 / factor, rtol=1e-6)  # exactly / factor
    assert np.all(np.diff(ratio) <= 1e-7), "monotone: never less scaled at a lower frequency"
    assert np.all((ratio >= 1 / factor - 1e-7) & (ratio <= 1 + 1e-7))


@hypothesis.given(factor=st.floats(1.5, 64.0), low=st.floats(0.5, 2.0), gap=st.floats(0.5, 8),
                  length=st.sampled_from([2048, 8192]), log_base=st.floats(9.0, 14.0))
def test_llama3_bands(factor, low, gap, length, log_base):
    base, high = math.exp(log_base), low + gap
    plain = np.asarray(rope.inv_freq(128, base=base), np.float64)
    inv, af = freqs({**LLAMA3, "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                     "original_max_position_embeddings": length}, d=128, base=base)
    ratio, wavelen = inv / plain, 2 * math.pi / plain
    np.testing.assert_array_equal(ratio[wavelen < length / high * (1 - 1e-6)], 1.0)
    np.testing.assert_allclose(ratio[wavelen > length / low * (1 + 1e-6)], 1 / factor, rtol=1e-6)
    assert np.all(np.diff(ratio) <= 1e-6) and af == 1.0
    # float32 rounding of the wavelength is amplified by (L0 / w) / (high - low) in the blend
    np.testing.assert_allclose(inv, ref_llama3(128, base, factor, low, high, length), rtol=1e-5)


def test_dynamic_plain_up_to_original_length_then_grows():
    plain = np.asarray(rope.inv_freq(64))
    for s in (None, 1, 100, 2047, 2048):
        np.testing.assert_array_equal(freqs(DYN, seq_len=s)[0], plain)
    prev = plain
    for s in (2049, 3000, 8192, 65536):
        inv = freqs(DYN, seq_len=s)[0]
        assert inv[0] == plain[0] and np.all(inv[1:] < prev[1:]), s  # base grows with s
        prev = inv


# ------------------------------------------------------------------------- jit, traced length
@pytest.mark.parametrize("scaling", [DYN, LONGROPE], ids=["dynamic", "longrope"])
def test_jit_with_traced_seq_len(scaling):
    @jax.jit
    def f(seq_len):
        inv, af = rope_scaling.frequencies(scaling, rotary_dim=64, base=10000.0, seq_len=seq_len)
        return inv, af, rope_scaling.regime(scaling, seq_len=seq_len)

    for s in (7, 2048, 2049, 4096, 4097, 20000):
        inv, af, reg = f(jnp.int32(s))
        want_inv, want_af = freqs(scaling, seq_len=s)
        np.testing.assert_allclose(inv, want_inv, rtol=1e-6)
        assert float(af) == want_af and reg.dtype == jnp.int32
        assert int(reg) == int(rope_scaling.regime(scaling, seq_len=s))


class TracedInvFreqTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_methods_take_traced_frequencies(self):
        plain = rope.inv_freq(64, base=500000.0)
        methods = {
            "llama3": lambda w: rope_scaling.llama3(w, **{k: v for k, v in LLAMA3.items()
                                                           if k != "rope_type"}),
            "yarn": lambda w: rope_scaling.yarn(w, base=500000.0, factor=16.0,
                                                original_max_position_embeddings=4096),
            "dynamic": lambda w: rope_scaling.dynamic(w, factor=2.0, seq_len=9000,
                                                      original_max_position_embeddings=2048),
        }
        for name, fn in methods.items():
            got, want = self.variant(fn)(plain), fn(plain)
            np.testing.assert_allclose(got[0], want[0], rtol=1e-6, err_msg=name)
            assert float(got[1]) == float(want[1])


# ------------------------------------------------------------- KV cache across a regime switch
L0, T, D = 6, 14, 8
CACHE_CASES = {
    "dynamic": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": L0},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.5],
                 "long_factor": [1.0, 2.0, 4.0, 8.0], "factor": 4.0,
                 "original_max_position_embeddings": L0},
}


def _layer(seed=0, embed=16, heads=2):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((T, embed)), jnp.float32)
    wq, wk, wv = (jnp.asarray(rng.standard_normal((embed, heads, D)) / 4, jnp.float32)
                  for _ in range(3))
    return x, wq, wk, wv


@jax.jit
def _attend(q, k, v, t):
    """q [H, D] at position t - 1 over the first t rows of k, v [T, H, D] (causal last row)."""
    scores = jnp.einsum("hd,thd->ht", q, k) / math.sqrt(D)
    scores = jnp.where((jnp.arange(T) < t)[None, :], scores, -jnp.inf)
    return jnp.einsum("ht,thd->hd", jax.nn.softmax(scores, axis=-1), v)


def _rotator(scaling):
    """jit(x [T, H, D], seq_len) -> x rotated at positions 0..T-1 under the regime of seq_len."""
    def rotate(x, seq_len):
        inv, af = rope_scaling.frequencies(scaling, rotary_dim=D, base=10000.0, seq_len=seq_len)
        return rope.apply(x, jnp.arange(T), inv, attention_factor=af)
    return jax.jit(rotate)


@pytest.mark.parametrize("name", sorted(CACHE_CASES))
def test_cache_policies_against_full_forward(name):
    """Rows >= t of every [T, H, D] array are padding (masked); row t - 1 is the new token."""
    scaling, (x, wq, wk, wv) = CACHE_CASES[name], _layer()
    rot = _rotator(scaling)
    q_all, k_all, v_all = (jnp.einsum("te,ehd->thd", x, w) for w in (wq, wk, wv))
    raw_k, rotated, stale = jnp.zeros_like(k_all), None, jnp.zeros_like(k_all)
    rotated_regime, mismatches_without_rebuild = None, 0
    for t in range(1, T + 1):
        s = jnp.int32(t)
        q = rot(q_all, s)[t - 1]
        full = _attend(q, rot(k_all, s), v_all, s)  # the full forward pass, last position
        # (a) cache keys unrotated, rotate them all under the current regime: exact (1 layer)
        raw_k = raw_k.at[t - 1].set(k_all[t - 1])
        np.testing.assert_allclose(_attend(q, rot(raw_k, s), v_all, s), full, atol=1e-5)
        # (b) our policy: rotated keys + regime id; rebuild from the prefix when it changes
        reg = int(rope_scaling.regime(scaling, seq_len=t))
        new_k = rot(k_all, s)[t - 1]
        if rotated is None or reg != rotated_regime:
            keys = jnp.einsum("te,ehd->thd", x, wk)  # re-run the prefix's key projection
            prefix = jnp.where((jnp.arange(T) < t - 1)[:, None, None], keys, 0.0)
            rotated, rotated_regime = rot(prefix, s), reg
        rotated = rotated.at[t - 1].set(new_k)
        np.testing.assert_allclose(_attend(q, rotated, v_all, s), full, atol=1e-5)
        # (c) what Hugging Face does: keep old rotated keys, rotate only the new one
        stale = stale.at[t - 1].set(new_k)
        err = float(jnp.max(jnp.abs(_attend(q, stale, v_all, s) - full)))
        if t <= L0:
            assert err < 1e-5
        mismatches_without_rebuild += err > 1e-3
    assert mismatches_without_rebuild > 0, "the switch must matter, or this test proves nothing"


@pytest.mark.parametrize("name", sorted(CACHE_CASES))
def test_regime_changes_exactly_where_frequencies_change(name):
    scaling = CACHE_CASES[name]
    prev_inv, prev_reg = None, None
    changes = []
    for t in range(1, 3 * L0):
        inv = np.asarray(rope_scaling.frequencies(scaling, rotary_dim=D, base=10000.0,
                                                  seq_len=t)[0])
        reg = int(rope_scaling.regime(scaling, seq_len=t))
        if prev_inv is not None:
            freq_changed = not np.array_equal(inv, prev_inv)
            assert freq_changed == (reg != prev_reg), (t, reg, prev_reg)
            changes.append(freq_changed)
        if t <= L0:
            assert reg == 0
        prev_inv, prev_reg = inv, reg
    assert any(changes)
    assert rope_scaling.is_length_dependent(scaling)
    assert int(rope_scaling.regime(scaling, seq_len=None)) == 0


def test_length_independent_methods_have_one_regime():
    same = {**CACHE_CASES["longrope"], "long_factor": CACHE_CASES["longrope"]["short_factor"]}
    for scaling in (None, YARN, LLAMA3, same, {"type": "linear", "factor": 2.0}):
        assert not rope_scaling.is_length_dependent(scaling)
        assert int(rope_scaling.regime(scaling, seq_len=10**6)) == 0
