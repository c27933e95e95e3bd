"""The fuzz made permanent: 400 random valid configs against transformers 5.24.

tests/data/hf_fuzz_golden.json (scripts/make_hf_golden.py, two seeds of 200) holds random
configs -- llama, qwen2, mistral (whole head dim), phi3, gpt_neox, stablelm (partial rotary),
deepseek_v3 (MLA); both config forms; every rope type each accepts; head dims 32-256 incl. 80,
96, 160; several seq_len for dynamic NTK and LongRoPE -- with transformers' inv_freq and
attention scaling. Goal: within 2e-6 relative everywhere, 1e-6 for power-of-two rotary dims.

Where we differ from transformers by more than that, the float64 value is the judge: ours is
it rounded once (1 ulp), and transformers' float32 arithmetic is as far from it as from us
(llama3's smooth band at its low edge, where t ~ 0 cancels, amplifies float32 rounding).
"""

import base64
import json
import math
import pathlib
import warnings

import numpy as np
import pytest

from posenc_jax import hf_config

DATA = json.loads((pathlib.Path(__file__).parents[1] / "data" / "hf_fuzz_golden.json").read_text())
CASES = DATA["cases"]


def decode(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), "<f4")


def ours(record):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lone mscale, top-level originals, ...
        inv, factor = hf_config.from_hf_config(record["config"], seq_len=record["seq_len"])
    return np.asarray(inv), float(factor)


def llama3_float64(record) -> np.ndarray:
    """Llama 3.1's scaling in float64 on the float32-rounded exponents (an independent form)."""
    kw = hf_config.rope_kwargs_from_hf_config(record["config"])
    sc, d = kw["scaling"], kw["rotary_dim"]
    inv = 1.0 / kw["base"] ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)).astype(
        np.float64)
    wavelen, orig = 2 * math.pi / inv, sc["original_max_position_embeddings"]
    t = (orig / wavelen - sc["low_freq_factor"]) / (sc["high_freq_factor"] - sc["low_freq_factor"])
    out = np.where(wavelen > orig / sc["low_freq_factor"], inv / sc["factor"],
                   (1 - t) * inv / sc["factor"] + t * inv)
    return np.where(wavelen < orig / sc["high_freq_factor"], inv, out)


def test_the_fuzz_is_broad():
    assert len(CASES) == 400 and DATA["transformers"].startswith("5.")
    assert not [r for r in CASES if "error" in r]  # every generated config is valid for HF
    kinds = {(r["config"].get("rope_scaling") or r["config"].get("rope_parameters") or {}).get(
        "rope_type", "default") for r in CASES}
    assert {"default", "linear", "dynamic", "yarn", "longrope", "llama3"} <= kinds
    assert {r["config"]["model_type"] for r in CASES} >= {"llama", "phi3", "gpt_neox",
                                                          "stablelm", "deepseek_v3"}


@pytest.mark.parametrize("seed", [0, 1])
def test_every_fuzzed_config_matches_transformers(seed):
    rows = CASES[200 * seed: 200 * (seed + 1)]
    worst = 0.0
    for i, record in enumerate(rows):
        inv, factor = ours(record)
        want = decode(record["hf"]["inv_freq"])
        assert inv.shape == want.shape, (i, record["config"])
        assert factor == pytest.approx(record["hf"]["attention_factor"], rel=1e-6)
        rel = float(np.max(np.abs(inv - want) / want))
        worst = max(worst, rel)
        pow2 = inv.shape[0] & (inv.shape[0] - 1) == 0
        if rel <= (1e-6 if pow2 else 2e-6):
            continue
        ref = llama3_float64(record)  # the only method over the bound, see the docstring
        np.testing.assert_allclose(inv, ref, rtol=1.2e-7, atol=0)
        assert np.max(np.abs(want - ref) / ref) > 0.9 * rel, (i, record["config"])
    assert worst < 5e-6
