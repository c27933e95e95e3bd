"""The llama3 rule with low_freq_factor == high_freq_factor (Llama 4 Scout's published
`rope_scaling`: factor 16, low 1.0, high 1.0, original 8192; meta-llama/llama-models#322).

transformers 5.24's `_compute_llama3_parameters` only warns and computes a clean step (its blend
is selected only where the wavelength is exactly L0 / low, never at these bases): its inv_freq
for such configs is the golden (tests/data/pretrained/gguf_rope/llama3_equal.npz, written by
scripts/make_gguf_rope_golden.py). Here: equal to it, to a float64 step written here, finite
under jit, and low > high still refused with the message naming both."""

import math
import pathlib

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc_jax.encodings import rope_scaling

GOLDEN = pathlib.Path(__file__).parents[1] / "data" / "pretrained" / "gguf_rope" / "llama3_equal.npz"


def ref_step(d, base, factor, edge_factor, length):
    """float64: / factor where the wavelength exceeds L0 / edge_factor, untouched below."""
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    return np.where(2 * math.pi / inv > length / edge_factor, inv / factor, inv)


def scaling(factor, edge, length):
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": edge,
            "high_freq_factor": edge, "original_max_position_embeddings": length}


def ours(d, base, factor, edge, length):
    inv, af = rope_scaling.frequencies(scaling(factor, edge, length), rotary_dim=d, base=base)
    chex.assert_shape(inv, (d // 2,))
    chex.assert_type(inv, jnp.float32)
    assert float(af) == 1.0
    return np.asarray(inv)


def test_equal_factors_equal_transformers_inv_freq():
    golden = np.load(GOLDEN)
    assert len(golden.files) == 4
    for key in golden.files:
        theta, d, factor, length, edge = key.split("_")
        got = ours(int(d), float(theta), float(factor), float(edge), int(length))
        np.testing.assert_allclose(got, golden[key], rtol=2e-7, atol=0, err_msg=key)
        assert np.isfinite(golden[key]).all()
        # a step, not the plain frequencies: some are divided, some are not
        plain = float(theta) ** (-np.arange(0, int(d), 2) / int(d))
        assert np.any(np.isclose(got, plain, rtol=1e-6))
        assert np.any(np.isclose(got, plain / float(factor), rtol=1e-6))


@hypothesis.settings(deadline=None, max_examples=30)
@hypothesis.given(factor=st.floats(1.0, 64.0), edge=st.floats(0.25, 8.0),
                  length=st.integers(16, 1 << 16), log_base=st.floats(2.0, 7.0),
                  d=st.sampled_from([16, 64, 128]))
def test_equal_factors_is_the_float64_step(factor, edge, length, log_base, d):
    base = 10.0 ** log_base
    got = ours(d, base, factor, edge, length)
    np.testing.assert_allclose(got, ref_step(d, base, factor, edge, length), rtol=2e-6)


def test_equal_factors_at_the_edge_is_the_limit_not_nan():
    """A wavelength exactly L0 / low: transformers' blend is 0 / 0 (NaN); ours is inv / factor,
    what any high > low gives there. Frequency 2 pi / 8 at L0 = 8, low = high = 1."""
    inv = np.array([1.0, 2 * math.pi / 8.0, 0.01])
    cfg = {k: v for k, v in scaling(4.0, 1.0, 8).items() if k != "rope_type"}
    got, _ = rope_scaling.llama3(inv, **cfg)
    np.testing.assert_allclose(np.asarray(got), inv / np.array([1.0, 4.0, 4.0]), rtol=1e-6)
    wider, _ = rope_scaling.llama3(inv, **{**cfg, "high_freq_factor": 1.5})
    assert float(np.asarray(wider)[1]) == pytest.approx(float(np.asarray(got)[1]), rel=1e-6)


def test_equal_factors_under_jit_are_finite():
    inv = jnp.asarray(10000.0 ** (-np.arange(0, 64, 2) / 64), jnp.float32)
    cfg = {k: v for k, v in scaling(8.0, 1.0, 8192).items() if k != "rope_type"}
    got, _ = jax.jit(lambda w: rope_scaling.llama3(w, **cfg))(inv)
    assert np.isfinite(np.asarray(got)).all()
    eager, _ = rope_scaling.llama3(inv, **cfg)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(eager))


def test_low_above_high_is_refused():
    with pytest.raises(ValueError, match=r"low_freq_factor must be <= high_freq_factor, got "
                                         r"low_freq_factor=2 and high_freq_factor=1"):
        rope_scaling.frequencies({**scaling(8.0, 1.0, 8192), "low_freq_factor": 2.0},
                                 rotary_dim=64, base=10000.0)
