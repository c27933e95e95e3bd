"""posenc_jax.encodings.hf_config / hf_config.from_hf_config: parity with Hugging Face transformers.

tests/data/hf_rope_golden.json holds transformers' own `inv_freq` and `attention_scaling`,
taken from each model's rotary-embedding module after its forward at the given length, for
transformers 4.57.6 (`rope_scaling`) and 5.24.0 (`rope_scaling` and `rope_parameters`); it
is written by scripts/make_hf_golden.py. Neither torch nor transformers is needed here.
"""

import json
import math
import pathlib
import warnings

import numpy as np
import pytest

import posenc_jax
from posenc_jax.encodings import hf_config

GOLDEN = json.loads((pathlib.Path(__file__).parents[1] / "data" / "hf_rope_golden.json").read_text())
CASES = GOLDEN["cases"]
ROWS = [(name, version, seq_len)
        for name, case in CASES.items()
        for version, record in case["hf"].items() if "error" not in record
        for seq_len in record["by_seq_len"]]


def test_golden_file_covers_what_the_issue_names():
    assert {"4.57.6", "5.24.0"} <= set(GOLDEN["versions"])
    for name in ("llama3.1-8b", "qwen2.5-7b-yarn", "phi3.5-mini-longrope", "deepseek-v3",
                 "linear", "dynamic", "default-llama2", "default-partial-rotary",
                 "qwen2.5-yarn-rope_parameters", "llama3-rope_parameters"):
        assert "5.24.0" in CASES[name]["hf"], name
    assert len(ROWS) >= 50
    assert len(CASES["phi3.5-mini-longrope"]["config"]["rope_scaling"]["long_factor"]) == 48


@pytest.mark.parametrize("name, version, seq_len", ROWS)
def test_from_hf_config_matches_transformers(name, version, seq_len):
    config = {"model_type": CASES[name]["model_type"], **CASES[name]["config"]}
    want = CASES[name]["hf"][version]["by_seq_len"][seq_len]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. a lone `mscale`, which transformers ignores too
        inv, factor = hf_config.from_hf_config(
            config, seq_len=None if seq_len == "none" else int(seq_len))
    np.testing.assert_allclose(np.asarray(inv), np.array(want["inv_freq"], np.float32),
                               rtol=2e-6, atol=0)
    assert float(factor) == pytest.approx(want["attention_factor"], rel=1e-6)


def test_the_two_transformers_generations_agree_where_both_read_the_config():
    """A property of the data: every shared case is bit-identical across 4.57 and 5.24."""
    shared = [c["hf"] for c in CASES.values()
              if all(v in c["hf"] and "error" not in c["hf"][v] for v in ("4.57.6", "5.24.0"))]
    assert len(shared) >= 15
    for hf in shared:
        assert hf["4.57.6"]["by_seq_len"] == hf["5.24.0"]["by_seq_len"]


def test_known_numbers():
    """Values quoted in the closing note, and the published formulas they come from."""
    _, yarn_af = hf_config.from_hf_config(CASES["qwen2.5-7b-yarn"]["config"])
    assert float(yarn_af) == pytest.approx(0.1 * math.log(4) + 1, rel=1e-7)
    _, phi_af = hf_config.from_hf_config(CASES["phi3.5-mini-longrope"]["config"])
    assert float(phi_af) == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)), rel=1e-7)
    _, ds_af = hf_config.from_hf_config(CASES["deepseek-v3"]["config"])
    assert float(ds_af) == 1.0  # mscale == mscale_all_dim: the temperature moves to the softmax


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v2-lite",
                                  "deepseek-yarn-mscale-ratio"])
def test_mla_softmax_scale_factor(name):
    want = CASES[name]["hf"]["5.24.0"]["softmax_scale_factor"]
    assert hf_config.softmax_scale_factor(CASES[name]["config"]) == pytest.approx(want, rel=1e-12)
    # transformers 4.57's DeepSeek-V2 attention omitted it (a bug fixed in 5.x):
    if name == "deepseek-v2-lite":
        assert CASES[name]["hf"]["4.57.6"]["softmax_scale_factor"] == 1.0 != want
    assert hf_config.softmax_scale_factor(CASES["llama3.1-8b"]["config"]) == 1.0


def test_rope_kwargs_build_the_same_encoding():
    kwargs = hf_config.rope_kwargs_from_hf_config(CASES["llama3.1-8b"]["config"])
    assert kwargs == {"head_dim": 128, "rotary_dim": 128, "base": 500000.0,
                      "max_position_embeddings": 131072, "layout": "half",
                      "scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192}}
    ds = hf_config.rope_kwargs_from_hf_config(CASES["deepseek-v3"]["config"])
    assert (ds["head_dim"], ds["rotary_dim"]) == (64, 64)  # qk_rope_head_dim, not 7168 // 128
    assert ds["layout"] == "half"  # no model_type: DeepSeek's rope_interleave is not implied
    ds = hf_config.rope_kwargs_from_hf_config({"model_type": "deepseek_v3",
                                               **CASES["deepseek-v3"]["config"]})
    assert ds["layout"] == "interleaved"  # deepseek_v3's class default rope_interleave=True
    for name, seq_len in (("phi3.5-mini-longrope", 131072), ("dynamic", 6000),
                          ("phi4-mini-like-longrope-partial", 8192), ("qwen2.5-7b-yarn", None)):
        config = {"model_type": CASES[name]["model_type"], **CASES[name]["config"]}
        kwargs = hf_config.rope_kwargs_from_hf_config(config)
        enc = posenc_jax.get("rope", **kwargs)
        got, want = enc.frequencies(seq_len), hf_config.from_hf_config(config, seq_len=seq_len)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
        assert float(got[1]) == float(want[1])


BASE = {"hidden_size": 1024, "num_attention_heads": 16, "max_position_embeddings": 8192}


def test_reading_priorities():
    both = {**BASE, "rope_theta": 10000.0,
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}}
    kw = hf_config.rope_kwargs_from_hf_config(both)
    assert kw["base"] == 5e5 and kw["scaling"] == {"rope_type": "linear", "factor": 2.0}
    legacy_wins = {**both, "rope_scaling": {"type": "linear", "factor": 4.0}}
    kw = hf_config.rope_kwargs_from_hf_config(legacy_wins)
    assert kw["base"] == 10000.0 and kw["scaling"]["factor"] == 4.0
    neox = {**BASE, "rotary_pct": 0.25}
    assert hf_config.rope_kwargs_from_hf_config(neox)["rotary_dim"] == 16
    assert hf_config.rope_kwargs_from_hf_config({**BASE, "head_dim": 128})["rotary_dim"] == 128
    assert hf_config.rope_kwargs_from_hf_config(BASE)["scaling"] is None


def test_conflicting_original_lengths_warn_and_follow_transformers():
    yarn = {**BASE, "original_max_position_embeddings": 2048,
            "rope_scaling": {"type": "yarn", "factor": 4.0,
                             "original_max_position_embeddings": 1024}}
    with pytest.warns(UserWarning, match=r"original_max_position_embeddings=2048 at the top "
                                         r"level and 1024 in its rope dict; the top-level"):
        kw = hf_config.rope_kwargs_from_hf_config(yarn)
    assert kw["scaling"]["original_max_position_embeddings"] == 2048
    dyn = {**BASE, "rope_scaling": {"type": "dynamic", "factor": 2.0,
                                    "original_max_position_embeddings": 1024}}
    with pytest.warns(UserWarning, match=r"transformers ignores rope_scaling's original_max_"
                                         r"position_embeddings=1024 and uses max_position_"
                                         r"embeddings=8192"):
        kw = hf_config.rope_kwargs_from_hf_config(dyn)
    assert kw["scaling"]["original_max_position_embeddings"] == 8192


@pytest.mark.parametrize("config, error, match", [
    ({**BASE, "rope_parameters": {"full_attention": {"rope_type": "default"},
                                  "sliding_attention": {"rope_type": "default"}}},
     ValueError, (r"keyed by layer type \['full_attention', 'sliding_attention'\] but the "
                 r"config has no layer_types")),
    ({**BASE, "model_type": "phi3", "partial_rotary_factor": 0.3},
     ValueError, r"int\(64 \* 0.3\) = 19 must be even"),
    ({**BASE, "rope_theta": 0}, ValueError, r"rope_theta must be > 0, got rope_theta=0"),
    ({**BASE, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0}},
     ValueError, r"'llama3' requires the key 'original_max_position_embeddings'"),
    ({**BASE, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
     ValueError, r"rope_type='mrope' needs the model_type of a multimodal RoPE model"),
    ({"max_position_embeddings": 10}, ValueError, r"needs head_dim \(or hidden_size and num_"),
    ("config.json", TypeError, r"config must be a dict \(a parsed config.json\), got str"),
])
def test_bad_configs(config, error, match):
    with pytest.raises(error, match=match):
        hf_config.from_hf_config(config)
