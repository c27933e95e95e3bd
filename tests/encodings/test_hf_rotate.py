"""rotate_like_hf against transformers 5.24's own rotary modules and apply functions.

tests/data/hf_rotate_golden.json (written by scripts/make_hf_golden.py in a throwaway venv; no
torch here) holds, per model config and layer type, transformers' inv_freq, attention scaling
and q/k rotated by the model's own apply function; q and k are redrawn here from the stored
seed. Published configs of Gemma 3 (1b, 4b, 27b), Gemma 4 (e2b, 26b-a4b), Qwen2-VL-7B,
Qwen2.5-VL (3B, 7B), Qwen3-VL (4B, 8B), DeepSeek-V3, Llama 3.1, Phi-3.5-mini and Phi-4-mini,
in both config forms, every layer type, text positions up to 20,000 and image/video grids.

Tolerances, and why:
* frequencies: relative 2e-6 (1e-6 when the rotary dim is a power of two). Ours are the
  float64 value rounded once; torch's float32 `pow` and its scaling arithmetic can be an ulp
  or more off, which is all the difference there is (1 ulp observed, 2.8e-7 for llama3).
* rotation with transformers' own frequencies substituted: 2e-6 x max|x| -- only cos/sin
  evaluation and one multiply-add differ (observed 4.8e-7 at |x| ~ 5).
* rotation end to end: the angle error is position x |inv_freq error|; one ulp of a
  frequency near 1 (6e-8) at position 20,000 moves an angle by 1.2e-3 rad, so the bound is
  max|x| x attention x (2 max_pos max|d inv_freq| + 2e-6), computed per case from the data.
"""

import base64
import json
import pathlib
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import posenc_jax
from posenc_jax import hf_config
from posenc_jax.encodings.rope import RotaryBase

DATA = json.loads((pathlib.Path(__file__).parents[1] / "data" / "hf_rotate_golden.json").read_text())
CASES = DATA["cases"]
ROWS = [(name, lt) for name, case in CASES.items() for lt in case["layers"]]


def decode(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), "<f4")


def inputs(name, layer):
    case, rec = CASES[name], CASES[name]["layers"][layer]
    pos = np.asarray(case["positions"], np.int64)
    b, length, d = pos.shape[-2], pos.shape[-1], rec["head_dim"]
    rng = np.random.default_rng(rec["seed"])
    q = rng.standard_normal((b, length, 2, d)).astype(np.float32)
    k = rng.standard_normal((b, length, 1, d)).astype(np.float32)
    want = decode(rec["q_rot"]).reshape(q.shape), decode(rec["k_rot"]).reshape(k.shape)
    return case["config"], q, k, pos, (None if layer == "-" else layer), want, rec


def rotate(config, q, k, pos, layer_type):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. Qwen3-VL's ignored mrope_interleaved=False
        q_rot, k_rot = hf_config.rotate_like_hf(config, q, k, pos, layer_type=layer_type)
    return np.asarray(q_rot), np.asarray(k_rot)


def test_the_golden_file_covers_the_issue():
    assert DATA["transformers"].startswith("5.")
    names = {n.split("/")[0] for n in CASES}
    for model in ("gemma-3-1b", "gemma-3-4b", "gemma-3-27b", "gemma-4-e2b", "gemma-4-26b-a4b",
                  "qwen2-vl-7b", "qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen3-vl-4b",
                  "qwen3-vl-8b", "deepseek-v3", "llama-3.1-8b", "phi-3.5-mini", "phi-4-mini"):
        assert model in names, model
    assert all("error" not in c for c in CASES.values())
    assert {lt for c in CASES.values() for lt in c["layers"]} >= {"full_attention",
                                                                  "sliding_attention", "-"}
    assert max(np.max(c["positions"]) for c in CASES.values()) == 20000
    assert any(c["kind"] == "mrope" for c in CASES.values())
    for model in ("gemma-3-1b", "gemma-3-4b", "gemma-3-27b", "qwen2-vl-7b", "qwen3-vl-4b",
                  "deepseek-v3", "llama-3.1-8b"):  # both config forms
        assert {f"{model}/legacy", f"{model}/v5"} <= set(CASES), model


@pytest.mark.parametrize("name, layer", ROWS)
def test_frequencies_match_transformers(name, layer):
    config, _, _, pos, layer_type, _, rec = inputs(name, layer)
    inv, factor = hf_config.from_hf_config(config, layer_type=layer_type,
                                           seq_len=int(pos.max()) + 1)
    want = decode(rec["inv_freq"])
    rotary = 2 * np.count_nonzero(want)
    rtol = 1e-6 if rotary & (rotary - 1) == 0 else 2e-6
    np.testing.assert_allclose(np.asarray(inv), want, rtol=rtol, atol=0)
    assert float(factor) == pytest.approx(rec["attention_factor"], rel=1e-6)


@pytest.mark.parametrize("name, layer", ROWS)
def test_rotation_with_transformers_frequencies_is_exact(name, layer, monkeypatch):
    """Layout, rotary slice, mrope sections, DeepSeek's framing: all exact."""
    config, q, k, pos, layer_type, (want_q, want_k), rec = inputs(name, layer)
    inv, factor = decode(rec["inv_freq"]), np.float32(rec["attention_factor"])
    monkeypatch.setattr(RotaryBase, "frequencies",  # RoPE and MRoPE share it
                        lambda self, seq_len=None: (jnp.asarray(inv), factor))
    got_q, got_k = rotate(config, q, k, pos, layer_type)
    tol = 2e-6 * max(1.0, float(factor)) * float(np.abs(q).max())
    np.testing.assert_allclose(got_q, want_q, rtol=0, atol=tol)
    np.testing.assert_allclose(got_k, want_k, rtol=0, atol=tol)


@pytest.mark.parametrize("name, layer", ROWS)
def test_rotate_like_hf_matches_transformers(name, layer):
    config, q, k, pos, layer_type, (want_q, want_k), rec = inputs(name, layer)
    got_q, got_k = rotate(config, q, k, pos, layer_type)
    inv, _ = hf_config.from_hf_config(config, layer_type=layer_type,
                                      seq_len=int(pos.max()) + 1)
    d_inv = float(np.max(np.abs(np.asarray(inv, np.float64) - decode(rec["inv_freq"]))))
    scale = max(1.0, rec["attention_factor"]) * float(np.abs(q).max())
    tol = scale * (2 * int(pos.max()) * d_inv + 2e-6)
    np.testing.assert_allclose(got_q, want_q, rtol=0, atol=tol)
    np.testing.assert_allclose(got_k, want_k, rtol=0, atol=tol)
    assert tol < 0.02  # the bound itself stays meaningful (angles to ~1e-3 rad)


def test_quirks_visible_in_the_goldens():
    def q_rot(name, layer="-"):
        return decode(CASES[name]["layers"][layer]["q_rot"])

    # LongRoPE picks long factors for the whole batch from the batch max (strict >): the short
    # row of phi-3.5-mini/batch-max equals the long-regime rotation, not the short one
    batch = CASES["phi-3.5-mini/batch-max"]
    assert np.max(batch["positions"][0]) <= 4096 < np.max(batch["positions"][1])
    config, q, k, pos, _, (want_q, _), _ = inputs("phi-3.5-mini/batch-max", "-")
    short_alone, _ = rotate(config, q[:1], k[:1], pos[:1], None)
    assert not np.allclose(short_alone, want_q[:1], atol=1e-3)
    # Qwen3-VL interleaves whatever mrope_interleaved says: the chunked sections do not match
    config, q, k, pos, _, (want_q, _), _ = inputs("qwen3-vl-4b/interleaved-false", "-")
    with pytest.warns(UserWarning, match=r"mrope_interleaved=False is ignored"):
        name, kwargs = hf_config.encoding_from_hf_config(config)
    assert (name, kwargs["interleaved"]) == ("mrope", True)
    chunked = posenc_jax.get("mrope", **{**kwargs, "interleaved": False})
    got, _ = chunked.rotate({}, q, k, pos, pos)
    assert not np.allclose(np.asarray(got), want_q, atol=1e-2)
    # DeepSeek: rope_interleave null is the half layout, a different result
    assert not np.allclose(q_rot("deepseek-v3/legacy"), q_rot("deepseek-v3/rope_interleave-null"))
    # YaRN's `if mscale and mscale_all_dim`: mscale=0 falls back to 0.1 ln(factor) + 1
    af = CASES["deepseek-yarn-mscale-0"]["layers"]["-"]["attention_factor"]
    assert af == pytest.approx(0.1 * np.log(40) + 1, rel=1e-12)
