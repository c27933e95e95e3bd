"""posenc_jax.pretrained.gguf_rope: GGUF RoPE metadata (`rope.scaling.*`, `rope_freqs.weight`) as
rope_parameters, without transformers.

The divisors are made here by llama.cpp's formula (convert_hf_to_gguf.py
LlamaModel.generate_extra_tensors, a loop in float64 over float32 frequencies) for real Llama
3.1 / 3.2 shapes and Llama 4 Scout's step; the recovered rule must be the published one, with
the original context from the key when the file has it (the vector alone fixes only the band
edges L0 / low and L0 / high). Vectors no llama3 rule makes become per-pair divisors, which the
registry turns into exactly inv_freq / r. Errors: unknown type, contradictions, bad shapes, keys
without a rope_parameters meaning, each naming the file and the key or tensor.
"""

import math

import gguf
import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from posenc_jax.encodings import rope_scaling
from posenc_jax.pretrained import gguf_rope
from posenc_jax.pretrained.gguf import open_gguf
from posenc_jax.pretrained.gguf_config import hf_config


def llama_cpp_divisors(theta, dim, factor, low, high, original):
    """llama.cpp's rope_freqs: per float32 frequency, in Python floats, stored float32."""
    def divisor(freq: float) -> float:
        wavelen = 2 * math.pi / freq
        smooth = (original / wavelen - low) / (high - low)
        return (1.0 if wavelen < original / high else factor if wavelen > original / low
                else 1 / ((1 - smooth) / factor + smooth))
    exps = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    return np.float32([divisor(float(f)) for f in 1.0 / (np.float32(theta) ** exps)])


def params(freqs=None, *, theta=500000.0, dim=128, context=131072, **keys):
    fields = {f"llama.{k.replace('__', '.')}": v for k, v in keys.items()}
    return gguf_rope.rope_parameters(fields, freqs, arch="llama", theta=theta, rotary_dim=dim,
                                     context_length=context, where="m.gguf")


def llama3(factor, low, high, original, theta):
    return {"rope_theta": theta, "rope_type": "llama3", "factor": factor,
            "low_freq_factor": low, "high_freq_factor": high,
            "original_max_position_embeddings": original}


@pytest.mark.parametrize("theta, dim, factor", [(500000.0, 128, 8.0), (500000.0, 64, 32.0),
                                                (500000.0, 128, 32.0)],
                         ids=["llama3.1-8b", "llama3.2-1b", "llama3.2-3b"])
def test_real_llama3_divisors_give_the_published_rule(theta, dim, factor):
    r = llama_cpp_divisors(theta, dim, factor, 1.0, 4.0, 8192)
    assert params(r, theta=theta, dim=dim) == llama3(factor, 1.0, 4.0, 8192, theta)


def test_the_original_context_key_fixes_the_scale():
    """L0 = 64 with low 2 / high 8 has the same band edges as 32 / 1 / 4: the same vector."""
    r = llama_cpp_divisors(50.0, 16, 8.0, 2.0, 8.0, 64)
    np.testing.assert_allclose(r, llama_cpp_divisors(50.0, 16, 8.0, 1.0, 4.0, 32), rtol=1e-6)
    assert params(r, theta=50.0, dim=16) == llama3(8.0, 1.0, 4.0, 32, 50.0)
    keyed = params(r, theta=50.0, dim=16, rope__scaling__original_context_length=64)
    assert keyed == llama3(8.0, 2.0, 8.0, 64, 50.0)


def test_llama4_scout_step_is_recovered():
    r = llama_cpp_divisors(500000.0, 128, 16.0, 1.0, 1.0 + 1e-12, 8192)
    assert set(np.unique(r)) == {1.0, 16.0}
    assert params(r) == llama3(16.0, 1.0, 1.0, 8192, 500000.0)


@pytest.mark.parametrize("r", [np.array([1.0, 3.0, 2.0, 8.0], np.float32),
                               np.array([1.0, 1.0, 2.5, 8.0], np.float32),
                               np.array([1.0, 0.5, 0.5, 0.5], np.float32)],
                         ids=["not-monotone", "one-blend-entry", "below-one"])
def test_divisors_no_llama3_rule_makes_are_kept_per_pair(r):
    got = params(r, theta=10000.0, dim=8, context=4096)
    assert got == {"rope_theta": 10000.0, "rope_type": "longrope", "short_factor": list(r),
                   "long_factor": list(r), "original_max_position_embeddings": 4096,
                   "attention_factor": 1.0}
    cfg = {k: v for k, v in got.items() if k != "rope_theta"}
    for length in (16, 100000):
        inv, af = rope_scaling.frequencies(cfg, rotary_dim=8, base=10000.0, seq_len=length)
        plain = 10000.0 ** (-np.arange(0, 8, 2) / 8)
        np.testing.assert_allclose(np.asarray(inv), plain / r, rtol=1e-6)
        assert float(af) == 1.0


def test_all_ones_and_absent_are_plain_rope():
    assert params(np.ones(64, np.float32)) == {"rope_theta": 500000.0, "rope_type": "default"}
    assert params(None) == {"rope_theta": 500000.0, "rope_type": "default"}
    assert params(None, rope__scaling__type="none") == params(None)


def test_scaling_keys_become_rope_parameters():
    assert params(None, rope__scaling__type="linear", rope__scaling__factor=4.0) == {
        "rope_theta": 500000.0, "rope_type": "linear", "factor": 4.0}
    # no type but a factor: linear, llama.cpp's default (also the legacy rope.scale_linear)
    assert params(None, rope__scaling__factor=2.0)["rope_type"] == "linear"
    assert params(None, rope__scale_linear=2.0)["factor"] == 2.0
    assert params(None, rope__scaling__factor=1.0)["rope_type"] == "default"
    yarn = params(None, context=4096, rope__scaling__type="yarn", rope__scaling__factor=4.0,
                  rope__scaling__original_context_length=1024,
                  rope__scaling__yarn_beta_fast=16.0, rope__scaling__yarn_beta_slow=2.0,
                  rope__scaling__yarn_ext_factor=-1.0, rope__scaling__finetuned=True)
    assert yarn == {"rope_theta": 500000.0, "rope_type": "yarn", "factor": 4.0,
                    "original_max_position_embeddings": 1024, "beta_fast": 16.0,
                    "beta_slow": 2.0}
    # ggml multiplies cos / sin by yarn_attn_factor (1 + 0.1 ln s); transformers by
    # attention_factor; without original_context_length: the context length (llama.cpp's)
    scaled = params(None, context=4096, rope__scaling__type="yarn", rope__scaling__factor=4.0,
                    rope__scaling__yarn_attn_factor=0.5)
    assert scaled["attention_factor"] == pytest.approx(0.5 * (1 + 0.1 * math.log(4.0)))
    assert scaled["original_max_position_embeddings"] == 4096


@pytest.mark.parametrize("keys, message", [
    ({"rope__scaling__type": "ntk"}, r"m\.gguf: GGUF metadata 'llama\.rope\.scaling\.type' = "
     r"'ntk' is not a RoPE scaling type \(known: none, linear, yarn, longrope\)"),
    ({"rope__scaling__type": "yarn"}, r"m\.gguf: GGUF metadata 'llama\.rope\.scaling\.type' = "
     r"'yarn' needs 'llama\.rope\.scaling\.factor', which the file lacks"),
    ({"rope__scaling__type": "longrope", "rope__scaling__factor": 4.0},
     r"'longrope' is not read \(its factors are the tensors rope_factors_long"),
    ({"rope__scaling__type": "yarn", "rope__scaling__factor": 4.0,
      "rope__scaling__yarn_ext_factor": 0.5},
     r"'llama\.rope\.scaling\.yarn_ext_factor' = 0\.5 is not supported \(only 1, or < 0"),
    ({"rope__scaling__attn_factor": 2.0},
     r"m\.gguf: GGUF metadata 'llama\.rope\.scaling\.attn_factor' = 2\.0 is not supported"),
    ({"rope__scaling__yarn_log_multiplier": 0.1},
     r"'llama\.rope\.scaling\.yarn_log_multiplier' = 0\.1 is not supported \(only 0\.0"),
    ({"rope__scaling__alpha": 1000.0}, r"'llama\.rope\.scaling\.alpha' is not supported"),
], ids=["unknown-type", "no-factor", "longrope", "ext-factor", "attn-factor", "log-mul", "alpha"])
def test_keys_without_a_meaning_here_are_refused(keys, message):
    with pytest.raises(ValueError, match=message):
        params(None, **keys)


def test_rope_freqs_of_the_wrong_shape_or_values_are_refused():
    with pytest.raises(ValueError, match=r"m\.gguf: tensor 'rope_freqs\.weight' has shape "
                                         r"\(32,\), expected \(64,\): one divisor per rotary "
                                         r"pair \(rotary dim 128\)"):
        params(np.ones(32, np.float32))
    with pytest.raises(ValueError, match=r"tensor 'rope_freqs\.weight' = \[1, 0, 1, 1\] must "
                                         r"hold finite divisors > 0"):
        params(np.array([1, 0, 1, 1], np.float32), dim=8)


def write(path, freqs=None, **keys):
    w = gguf.GGUFWriter(str(path), "llama")
    for fn, v in ((w.add_block_count, 1), (w.add_embedding_length, 32), (w.add_head_count, 2),
                  (w.add_feed_forward_length, 8), (w.add_vocab_size, 3),
                  (w.add_rope_dimension_count, 16), (w.add_rope_freq_base, 50.0)):
        fn(v)
    for key, value in keys.items():
        (w.add_string if isinstance(value, str) else w.add_float32)(
            f"llama.{key.replace('__', '.')}", value)
    if freqs is not None:
        w.add_tensor("rope_freqs.weight", freqs)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_file_whose_rope_freqs_contradict_its_type_is_refused(tmp_path):
    r = llama_cpp_divisors(50.0, 16, 8.0, 1.0, 4.0, 32)
    path = write(tmp_path / "both.gguf", r, rope__scaling__type="yarn",
                 rope__scaling__factor=4.0)
    with pytest.raises(ValueError, match=r"both\.gguf: tensor 'rope_freqs\.weight' = \[1, "
                                         r"1\.34361, 2\.55134, 5\.6851, 8, 8, 8, 8\] holds "
                                         r"per-pair frequency divisors \(llama3 scaling\) but "
                                         r"GGUF metadata 'llama\.rope\.scaling\.type' = 'yarn' "
                                         r"declares another scaling"):
        open_gguf(path)
    with pytest.raises(ValueError, match=r"8, 8\] holds per-pair frequency divisors \(llama3 "
                                         r"scaling\) but GGUF metadata 'llama\.rope\.scaling\."
                                         r"factor' = 2\.0 \(linear\) declares another"):
        open_gguf(write(tmp_path / "factor.gguf", r, rope__scaling__factor=2.0))
    # "none" beside the divisors is no contradiction: llama.cpp applies them whatever the type
    ok = open_gguf(write(tmp_path / "none.gguf", r, rope__scaling__type="none"))
    assert ok.config["rope_parameters"] == llama3(8.0, 1.0, 4.0, 32, 50.0)
    assert "rope_freqs.weight" not in ok.names() and ok.names() == []


def test_file_with_an_unknown_type_or_a_mistyped_key_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"odd\.gguf: GGUF metadata 'llama\.rope\.scaling\.type'"
                                         r" = 'dynamic' is not a RoPE scaling type \(known: "
                                         r"none, linear, yarn, longrope\)"):
        open_gguf(write(tmp_path / "odd.gguf", rope__scaling__type="dynamic"))
    with pytest.raises(ValueError, match=r"str\.gguf: GGUF metadata 'llama\.rope\.scaling\."
                                         r"factor' is string \('8'\), expected float32, finite"):
        open_gguf(write(tmp_path / "str.gguf", rope__scaling__factor="8"))


def test_gemma3_scaling_goes_to_its_full_attention_layers_only():
    """As llama.cpp (the file's scale on the global layers) and Gemma 3 4B's config.json:
    full_attention {linear, factor 8, theta 1e6}, sliding_attention plain at 1e4."""
    fields = {"general.architecture": "gemma3", "gemma3.block_count": 6,
              "gemma3.embedding_length": 16, "gemma3.attention.head_count": 2,
              "gemma3.feed_forward_length": 32, "gemma3.vocab_size": 40,
              "gemma3.rope.freq_base": 1e6, "gemma3.rope.scaling.type": "linear",
              "gemma3.rope.scaling.factor": 8.0}
    cfg = hf_config(fields, [], where="g.gguf")
    assert cfg["rope_parameters"] == {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}}


@hypothesis.settings(deadline=None, max_examples=60)
@hypothesis.given(factor=st.sampled_from([2.0, 4.0, 8.0, 16.0, 32.0]),
                  low=st.sampled_from([0.5, 1.0, 2.0]), ratio=st.sampled_from([2.0, 4.0, 8.0]),
                  original=st.integers(64, 1 << 15), log_theta=st.floats(3.0, 6.5),
                  dim=st.sampled_from([64, 128]))
def test_recovered_rule_gives_the_vector_back(factor, low, ratio, original, log_theta, dim):
    """With the original context key: the parameters written. Without: the same band edges
    (L0 / low, L0 / high), low_freq_factor 1. Either way llama.cpp's formula with them
    reproduces the stored vector."""
    theta, high = 10.0 ** log_theta, low * ratio
    r = llama_cpp_divisors(theta, dim, factor, low, high, original)
    blend = (r > 1 + 1e-5) & (r < factor * (1 - 1e-5))
    hypothesis.assume(blend.sum() >= 2 and r[-1] == factor)
    keyed = params(r, theta=theta, dim=dim, rope__scaling__original_context_length=original)
    assert keyed == llama3(factor, low, high, original, theta)
    got = params(r, theta=theta, dim=dim)
    assert got["rope_type"] == "llama3" and got["factor"] == factor
    length = got["original_max_position_embeddings"]
    assert length == pytest.approx(original / low, rel=2e-3, abs=0.5)
    assert length / got["high_freq_factor"] == pytest.approx(original / high, rel=2e-3)
    again = llama_cpp_divisors(theta, dim, factor, got["low_freq_factor"],
                               got["high_freq_factor"], length)
    np.testing.assert_allclose(again, r, rtol=1e-5)
