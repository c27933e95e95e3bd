"""Properties a mutation check found untested (issue 15; `scripts/mutants.py` keeps the list).

- RoPE's `rotate` applies the scaling's attention factor (YaRN's mscale, LongRoPE's factor):
  the Hugging Face goldens check `frequencies`, never `rotate`, and the KV-cache tests compare
  two paths that share the hook;
- YaRN at a realistic head dim, where the ramp reaches both clamps, against a float64
  transcription of Hugging Face's `_compute_yarn_parameters`;
- the training loss honours its weights (a zero weight removes a target entirely);
- ALiBi is symmetric in |i - j| (a bidirectional model sees keys on both sides).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc_jax
from train import step as step_lib


def rotate_ref(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray,
               factor: float) -> np.ndarray:
    """Half-layout RoPE in float64: x [L, H, D], positions [L], inv_freq [R] (R = D / 2)."""
    angles = positions[:, None].astype(np.float64) * inv_freq[None, :]      # [L, R]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]       # [L, 1, R]
    r = inv_freq.shape[0]
    a, b = x[..., :r].astype(np.float64), x[..., r:].astype(np.float64)
    return factor * np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def yarn_ref(dim: int, base: float, factor: float, original: int, beta_fast: float = 32.0,
             beta_slow: float = 1.0) -> tuple[np.ndarray, float, np.ndarray]:
    """Hugging Face's `_compute_yarn_parameters` (truncate=True) in float64: inv_freq, the
    attention factor and the ramp (to check that both clamps are reached)."""
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)

    def correction_dim(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation_factor = 1.0 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, 0.1 * math.log(factor) + 1.0, ramp


YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 64, "long_factor": [4.0] * 64,
            "original_max_position_embeddings": 4096, "factor": 32.0}


def test_yarn_frequencies_reach_both_clamps_of_the_ramp():
    want, factor, ramp = yarn_ref(128, 10000.0, 8.0, 4096)
    assert ramp.min() == 0.0 and ramp.max() == 1.0 and 0 < ramp.mean() < 1  # both clamps
    enc = posenc_jax.get("rope", head_dim=128, scaling=YARN)
    inv_freq, attention_factor = enc.frequencies()
    np.testing.assert_allclose(np.asarray(inv_freq, np.float64), want, rtol=2e-6)
    assert float(attention_factor) == pytest.approx(factor, rel=1e-6)


@pytest.mark.parametrize("scaling", [YARN, LONGROPE], ids=["yarn", "longrope"])
def test_rope_rotate_applies_the_attention_factor(scaling):
    enc = posenc_jax.get("rope", head_dim=128, scaling=scaling)
    inv_freq = np.asarray(enc.frequencies(seq_len=64)[0], np.float64)
    factor = (0.1 * math.log(8.0) + 1.0 if scaling is YARN
              else math.sqrt(1 + math.log(32.0) / math.log(4096)))
    assert factor > 1.05  # the property below would not see a factor of ~1
    key_q, key_k = jax.random.split(jax.random.key(0))
    q = jax.random.normal(key_q, (64, 2, 128), jnp.float32)
    k = jax.random.normal(key_k, (64, 2, 128), jnp.float32)
    pos = jnp.arange(64, dtype=jnp.int32)
    rq, rk = jax.jit(lambda q, k: enc.rotate({}, q, k, pos, pos))(q, k)
    np.testing.assert_allclose(rq, rotate_ref(np.asarray(q), np.arange(64), inv_freq, factor),
                               rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(rk, rotate_ref(np.asarray(k), np.arange(64), inv_freq, factor),
                               rtol=2e-5, atol=2e-5)


def test_weighted_loss_ignores_zero_weight_targets():
    """A zero weight removes its target: the sums equal those over the kept targets alone,
    and the logits at those positions do not matter (float64 NumPy reference)."""
    key = jax.random.key(1)
    logits = jax.random.normal(key, (2, 5, 7), jnp.float32) * 3
    targets = jax.random.randint(jax.random.key(2), (2, 5), 0, 7)
    weights = jnp.asarray([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]], jnp.float32)
    total, count = jax.jit(step_lib.weighted_xent)(logits, targets, weights)
    lg = np.asarray(logits, np.float64)
    logp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    ce = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
    w = np.asarray(weights, np.float64)
    np.testing.assert_allclose(float(total), (ce * w).sum(), rtol=1e-5)
    assert float(count) == w.sum() == 7
    garbage = jnp.where(weights[..., None] == 0, 1e4, logits)  # change only unweighted rows
    total2, _ = jax.jit(step_lib.weighted_xent)(garbage, targets, weights)
    np.testing.assert_allclose(float(total2), float(total), rtol=1e-6)


def test_alibi_penalises_keys_on_both_sides_equally():
    enc = posenc_jax.get("alibi", num_heads=4)
    pos = jnp.arange(9, dtype=jnp.int32)
    bias = np.asarray(enc.bias({}, pos, pos))                                # [H, L, L]
    np.testing.assert_array_equal(bias, np.transpose(bias, (0, 2, 1)))
    assert (bias[:, 4, :4] < 0).all() and (bias[:, 4, 5:] < 0).all()
