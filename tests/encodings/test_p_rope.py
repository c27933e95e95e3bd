"""p-RoPE (Barbero et al. 2024) and Resonance RoPE (Wang et al. 2024) as RoPE hyperparameters:
the frequency maps, Gemma 4's `proportional` count, composition with every scaling method,
unrotated truncated pairs, integer wavelengths and the periodicity they buy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc_jax
from posenc_jax.encodings import frequencies, rope_scaling

D = 16
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "ntk": {"rope_type": "ntk", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "longrope": {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 64,
                 "short_factor": [1.0] * 8, "long_factor": [1.0, 1.5, 2, 3, 4, 5, 6, 8]},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.75},
}


@pytest.mark.parametrize("p", [0.0, 0.25, 0.3, 0.5, 0.75, 1.0])
def test_truncate_keeps_gemmas_count_of_highest_frequencies(p):
    inv = frequencies.inv_freq(D)
    got = np.asarray(frequencies.truncate(inv, fraction=p))
    keep = int(p * D // 2)                    # Gemma 4 `proportional`: int(prf * head_dim // 2)
    np.testing.assert_array_equal(got[:keep], np.asarray(inv)[:keep])
    assert np.all(got[keep:] == 0.0)


@pytest.mark.parametrize("method", list(SCALINGS))
def test_p_rope_and_resonance_compose_with_every_scaling_method(method):
    scaled = posenc_jax.get("rope", head_dim=D, scaling=SCALINGS[method])
    both = posenc_jax.get("rope", head_dim=D, scaling=SCALINGS[method], p_rope=0.5,
                          resonance=True)
    for seq_len in (None, 200):
        inv, factor = scaled.frequencies(seq_len)
        got, got_factor = both.frequencies(seq_len)
        want = frequencies.truncate(frequencies.resonance(inv), fraction=0.5)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert got_factor == factor


def test_truncated_pairs_are_not_rotated_and_p0_is_nope():
    q = jax.random.normal(jax.random.key(0), (1, 5, 2, D))
    pos = jnp.arange(100, 105)
    enc = posenc_jax.get("rope", head_dim=D, p_rope=0.25)
    rq, _ = enc.rotate({}, q, q, pos, pos)
    r, keep = D // 2, 2
    untouched = np.r_[keep:r, r + keep:D]
    np.testing.assert_array_equal(np.asarray(rq)[..., untouched], np.asarray(q)[..., untouched])
    assert not np.allclose(np.asarray(rq)[..., :keep], np.asarray(q)[..., :keep])
    nope, _ = posenc_jax.get("rope", head_dim=D, p_rope=0.0).rotate({}, q, q, pos, pos)
    np.testing.assert_array_equal(np.asarray(nope), np.asarray(q))


def test_resonance_wavelengths_are_integers_close_to_the_originals():
    inv = np.asarray(frequencies.inv_freq(64), np.float64)
    got = np.asarray(frequencies.resonance(frequencies.inv_freq(64)), np.float64)
    lam = 2 * math.pi / got
    assert np.all(np.abs(lam - np.round(lam)) <= 1e-6 * lam + 1e-4)
    np.testing.assert_array_equal(np.round(lam), np.maximum(np.round(2 * math.pi / inv), 1))
    assert frequencies.resonance(jnp.zeros(3)).tolist() == [0.0, 0.0, 0.0]


def test_resonance_rotations_repeat_after_each_integer_wavelength():
    """Feature pair i takes the same rotation at p and p + lambda_i (for every p): what makes
    positions past the training length reuse trained rotations."""
    enc = posenc_jax.get("rope", head_dim=D, resonance=True,
                         scaling={"rope_type": "yarn", "factor": 4.0,
                                  "original_max_position_embeddings": 64})
    inv, _ = enc.frequencies()
    lam = np.round(2 * math.pi / np.asarray(inv, np.float64)).astype(np.int64)
    p = np.arange(0, 50)
    for i in range(D // 2):
        a = np.asarray(inv[i], np.float64) * p
        b = np.asarray(inv[i], np.float64) * (p + lam[i])
        np.testing.assert_allclose(np.cos(a), np.cos(b), atol=5e-5 * lam[i])


def test_hyperparameters_are_validated():
    with pytest.raises(ValueError, match=r"p_rope must be <= 1.0, got p_rope=1.5"):
        posenc_jax.get("rope", head_dim=D, p_rope=1.5)
    with pytest.raises(TypeError, match=r"resonance must be a bool"):
        posenc_jax.get("rope", head_dim=D, resonance="yes")
    assert set(rope_scaling.methods()) == set(SCALINGS)  # every method is covered above


@pytest.mark.parametrize("p", [0.25, 0.5, 1.0])
def test_p_rope_is_gemma4_proportional(p):
    """One map: `rope(p_rope=p)` and the `proportional` scaling method (Gemma 4) agree."""
    ours = posenc_jax.get("rope", head_dim=D, p_rope=p).frequencies()[0]
    gemma = posenc_jax.get("rope", head_dim=D, scaling={"rope_type": "proportional",
                                                        "partial_rotary_factor": p})
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(gemma.frequencies()[0]))
