"""posenc_jax.encodings.rope_scaling.validate: every bad value raises naming the key and the value,
unknown keys warn naming them, and the normalised dict is what Hugging Face would use."""

import warnings

import jax
import jax.numpy as jnp
import pytest

from posenc_jax import hf_config
from posenc_jax.encodings import rope_scaling

SHORT = [1.0] * 32
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
LONGROPE = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": SHORT, "factor": 4.0,
            "original_max_position_embeddings": 4096}


def without(d, key):
    return {k: v for k, v in d.items() if k != key}


BAD = [
    ({"rope_type": "foo"}, ValueError, r"unknown rope_type='foo'; valid: default, linear"),
    ({"rope_type": "yarn", "type": "linear", "factor": 2.0}, ValueError,
     r"rope_type='yarn' and type='linear'"),
    (without(LLAMA3, "factor"), ValueError, r"rope_type='llama3' requires the key 'factor'"),
    (without(LLAMA3, "low_freq_factor"), ValueError, r"requires the key 'low_freq_factor'"),
    (without(LLAMA3, "high_freq_factor"), ValueError, r"requires the key 'high_freq_factor'"),
    (without(LLAMA3, "original_max_position_embeddings"), ValueError,
     r"rope_type='llama3' requires the key 'original_max_position_embeddings'; got keys"),
    (without(LONGROPE, "short_factor"), ValueError, r"requires the key 'short_factor'"),
    (without(LONGROPE, "long_factor"), ValueError, r"requires the key 'long_factor'"),
    ({"type": "linear"}, ValueError, r"rope_type='linear' requires the key 'factor'"),
    ({"type": "dynamic", "factor": 2.0}, ValueError,
     r"'dynamic' requires the key 'original_max_position_embeddings' \(or pass max_position"),
    ({"type": "linear", "factor": 0.5}, ValueError, r"factor must be >= 1, got factor=0.5"),
    ({**YARN, "factor": 0.25}, ValueError, r"factor must be >= 1, got factor=0.25"),
    ({**LLAMA3, "factor": 0.9}, ValueError, r"factor must be >= 1, got factor=0.9"),
    ({"type": "linear", "factor": "8"}, TypeError, r"factor must be a number, got factor='8'"),
    ({**YARN, "beta_fast": 1.0, "beta_slow": 32.0}, ValueError,
     r"beta_fast must be > beta_slow, got beta_fast=1 and beta_slow=32"),
    ({**YARN, "beta_fast": 2.0, "beta_slow": 2.0}, ValueError, r"beta_fast=2 and beta_slow=2"),
    ({**YARN, "beta_slow": 0.0}, ValueError, r"beta_slow must be > 0, got beta_slow=0"),
    ({**YARN, "truncate": "no"}, TypeError, r"truncate must be a bool \(True or False\), got truncate='no'"),
    ({**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 1.0}, ValueError,
     r"low_freq_factor must be <= high_freq_factor, got low_freq_factor=4 and high_freq_factor=1"),
    ({**LLAMA3, "low_freq_factor": 2.5, "high_freq_factor": 2.0}, ValueError,
     r"low_freq_factor=2.5 and high_freq_factor=2"),
    ({**LONGROPE, "short_factor": [1.0] * 31}, ValueError,
     r"short_factor must have rotary_dim / 2 = 32 entries \(rotary_dim=64\), got 31"),
    ({**LONGROPE, "long_factor": [1.0] * 64}, ValueError,
     r"long_factor must have rotary_dim / 2 = 32 entries \(rotary_dim=64\), got 64"),
    ({**LONGROPE, "long_factor": [1.0] * 31 + [0.0]}, ValueError,
     r"long_factor\[31\] must be > 0, got long_factor\[31\]=0"),
    ({**YARN, "attention_factor": -1.0}, ValueError,
     r"attention_factor must be > 0, got attention_factor=-1"),
    ({**LONGROPE, "attention_factor": -0.5}, ValueError,
     r"attention_factor must be > 0, got attention_factor=-0.5"),
    ({**YARN, "rope_theta": 0.0}, ValueError, r"rope_theta must be > 0, got rope_theta=0"),
    ({"rope_type": "default", "rope_theta": -10000}, ValueError,
     r"rope_theta must be > 0, got rope_theta=-10000"),
    ({**YARN, "original_max_position_embeddings": 0}, ValueError,
     r"original_max_position_embeddings must be >= 1, got original_max_position_embeddings=0"),
    ({"rope_type": "default", "partial_rotary_factor": 1.5}, ValueError,
     r"partial_rotary_factor must be in \(0, 1\], got partial_rotary_factor=1.5"),
    ({**without(LONGROPE, "factor")}, ValueError,
     r"'longrope' needs 'factor' or 'attention_factor' \(or max_position_embeddings="),
]


@pytest.mark.parametrize("scaling, error, match", BAD, ids=[m[:40] for _, _, m in BAD])
def test_bad_values_raise_naming_key_and_value(scaling, error, match):
    with pytest.raises(error, match=match):
        rope_scaling.validate(scaling, rotary_dim=64)
    with pytest.raises(error, match=match):  # and at the dispatch used on every forward pass
        rope_scaling.frequencies(scaling, rotary_dim=64, base=10000.0)


def test_rotary_dim_and_type_errors():
    with pytest.raises(ValueError, match=r"rotary_dim must be even and >= 2 for rope_type="
                                         r"'linear', got rotary_dim=7"):
        rope_scaling.validate({"type": "linear", "factor": 2.0}, rotary_dim=7)
    with pytest.raises(ValueError, match=r"even and >= 4 for rope_type='ntk', got rotary_dim=2"):
        rope_scaling.validate({"type": "ntk", "factor": 2.0}, rotary_dim=2)
    with pytest.raises(TypeError, match=r"rope scaling must be a dict \(or None\), got list"):
        rope_scaling.validate([("type", "linear")], rotary_dim=8)
    with pytest.raises(ValueError, match=r"scaling has rope_theta=500000 but base=10000.0"):
        rope_scaling.frequencies({**LLAMA3, "rope_theta": 500000.0}, rotary_dim=64,
                                 base=10000.0)


def test_unknown_keys_warn_naming_them():
    with pytest.warns(UserWarning, match=r"rope_type='linear' ignores unknown key\(s\) "
                                         r"\['fator', 'mrope_section'\]; it takes \['factor'\]"):
        out = rope_scaling.validate({"type": "linear", "factor": 2.0, "fator": 3.0,
                                     "mrope_section": [1, 2]}, rotary_dim=8)
    assert out == {"rope_type": "linear", "factor": 2.0}
    with pytest.warns(UserWarning, match=r"YaRN: mscale=2 is ignored unless both mscale and "
                                         r"mscale_all_dim are non-zero"):
        out = rope_scaling.validate({**YARN, "mscale": 2.0}, rotary_dim=64)
    assert "mscale" not in out


def test_normalised_dict_fills_defaults_and_is_a_fixed_point():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing here deserves a warning
        cases = {
            "yarn": ({"type": "yarn", "factor": 4}, 32768),
            "longrope": ({"type": "su", "short_factor": SHORT, "long_factor": SHORT,
                          "original_max_position_embeddings": 32768}, 131072),
            "longrope-no-original": ({"type": "longrope", "short_factor": SHORT,
                                      "long_factor": SHORT}, 8192),
            "dynamic": ({"type": "dynamic", "factor": 2.0}, 4096),
            "llama3": (LLAMA3, None),
        }
        got = {k: rope_scaling.validate(s, rotary_dim=64, max_position_embeddings=m)
               for k, (s, m) in cases.items()}
        for out in got.values():
            assert rope_scaling.validate(out, rotary_dim=64) == out
    assert got["yarn"] == {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                           "beta_slow": 1.0, "truncate": True,
                           "original_max_position_embeddings": 32768}
    assert got["longrope"]["rope_type"] == "longrope"  # Phi-3's old name "su"
    assert got["longrope"]["factor"] == 131072 / 32768  # inferred as max / original
    assert got["longrope-no-original"]["original_max_position_embeddings"] == 8192
    assert got["longrope-no-original"]["factor"] == 1.0  # as Hugging Face: original := max
    assert got["dynamic"]["original_max_position_embeddings"] == 4096
    assert got["llama3"] == {**LLAMA3, "factor": 8.0}
    assert rope_scaling.validate({"rope_type": "default"}, rotary_dim=8) == {
        "rope_type": "default"}


DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}
LONG2 = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": [2.0] * 32,
         "original_max_position_embeddings": 64, "factor": 4.0}


@pytest.mark.parametrize("seq_len, error, match", [
    (-1, ValueError, r"seq_len must be >= 1, got seq_len=-1"),
    (0, ValueError, r"seq_len must be >= 1, got seq_len=0"),
    (True, TypeError, r"seq_len must be an int, got seq_len=True \(bool\)"),
    (100.0, TypeError, r"seq_len must be an int, got seq_len=100.0 \(float\)"),
    ("100", TypeError, r"seq_len must be an int, got seq_len='100' \(str\)"),
])
@pytest.mark.parametrize("scaling", [DYNAMIC, LONG2])
def test_seq_len_is_checked(scaling, seq_len, error, match):
    """A negative or zero length silently meant the short regime (LongRoPE) or no scaling
    (dynamic), and a float was truncated by regime(); now each names the value."""
    with pytest.raises(error, match=match):
        rope_scaling.frequencies(scaling, rotary_dim=64, base=10000.0, seq_len=seq_len)
    with pytest.raises(error, match=match):
        rope_scaling.regime(scaling, seq_len=seq_len)


def test_seq_len_arrays_checked_by_dtype_and_concrete_value():
    with pytest.raises(TypeError, match=r"seq_len must be an int or an integer array, got dtype "
                                        r"float32"):
        rope_scaling.frequencies(LONG2, rotary_dim=64, base=10000.0, seq_len=jnp.float32(100))
    with pytest.raises(ValueError, match=r"seq_len must be >= 1, got seq_len=0"):
        rope_scaling.frequencies(LONG2, rotary_dim=64, base=10000.0, seq_len=jnp.int32(0))
    traced = jax.jit(lambda s: rope_scaling.frequencies(LONG2, rotary_dim=64, base=10000.0,
                                                        seq_len=s)[0])(jnp.int32(100))
    host = rope_scaling.frequencies(LONG2, rotary_dim=64, base=10000.0, seq_len=100)[0]
    assert jnp.allclose(traced, host, rtol=1e-6)


@pytest.mark.parametrize("value, error", [(4096.0, None), (4096.5, TypeError), ("4096", TypeError),
                                          (float("nan"), ValueError), (-4096, ValueError)])
def test_json_counts_read_alike_in_scaling_and_hf_config(value, error):
    """rope_scaling's original length and the HF reader's head_dim / max_position_embeddings
    go through one check (checks.json_count): an integral float from a JSON writer is its int,
    anything else is refused with the same exception."""
    llama = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 2,
             "max_position_embeddings": 8192}
    calls = [lambda: rope_scaling.validate({**YARN, "original_max_position_embeddings": value},
                                           rotary_dim=64),
             lambda: hf_config.rope_kwargs_from_hf_config({**llama, "head_dim": value}),
             lambda: hf_config.rope_kwargs_from_hf_config({**llama,
                                                           "max_position_embeddings": value})]
    for call in calls:
        if error is None:
            call()
        else:
            with pytest.raises(error):
                call()
