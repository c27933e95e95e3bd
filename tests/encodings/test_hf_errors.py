"""rotate_like_hf / the HF readers: every refusal named in issue 12 (by its text), the
model-class defaults, and the acceptance differences from transformers, each decided.

Acceptance differences (README "Hugging Face models"):
* refused here, accepted by transformers: `beta_fast: 0` (transformers' `or 32` reads 0 as
  the default: an accident of a truthiness test; we ask for a positive value); a dict whose
  `type` and `rope_type` disagree (transformers silently takes rope_type; we cannot tell
  which the author meant); a partial_rotary_factor on a scaled RoPE of a model that rotates
  the whole head dim (transformers fails later with a shape error); 3-D positions on a
  non-MRoPE model (transformers returns a 5-D tensor);
* accepted here, refused by transformers' generic path: YaRN without `factor` when both
  lengths are known (factor = max / original, transformers 5.x's own inference elsewhere),
  and Phi-3's old `type: "su"` (= longrope; transformers' Phi-3 config maps it the same way).
"""

import numpy as np
import pytest

from posenc_jax import hf_config

LLAMA = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 2,
         "max_position_embeddings": 4096, "rope_theta": 10000.0}
GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 256, "num_attention_heads": 2,
          "head_dim": 128, "num_hidden_layers": 6}
QWEN2_VL = {"model_type": "qwen2_vl", "hidden_size": 256, "num_attention_heads": 2,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
PHI3 = {"model_type": "phi3", "hidden_size": 384, "num_attention_heads": 4,
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
        "partial_rotary_factor": 1.0,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48,
                         "long_factor": [2.0] * 48}}


def qk(d=128, length=4, b=1):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((b, length, 2, d)).astype(np.float32),
            rng.standard_normal((b, length, 1, d)).astype(np.float32))


POS = np.arange(4)[None]


@pytest.mark.parametrize("config, d, positions, layer_type, match", [
    (GEMMA3, 128, POS, "global", (r"unknown layer_type='global'; the config's layer_types are "
                                 r"\['full_attention', 'sliding_attention'\]")),
    (GEMMA3, 128, POS, None, (r"this config has per-layer RoPE \(layer types \['full_attention',"
                             r" 'sliding_attention'\]\); pass layer_type= one of them")),
    (LLAMA, 128, POS, "full_attention", (r"layer_type='full_attention' given, but this config "
                                        r"has one RoPE for every layer")),
    ({**QWEN2_VL, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 16]}}, 128, POS,
     None, r"mrope_section=\[16, 24, 16\] sums to 56 but must sum to rotary_dim / 2 = 64"),
    (LLAMA, 128, np.zeros((3, 1, 4), int), None,
     (r"position_ids of shape \(3, 1, 4\) \(\[3, B, L\]\) are for multimodal RoPE models; "
     r"model_type='llama' takes \[B, L\]")),
    (QWEN2_VL, 128, np.zeros((2, 1, 4), int), None,
     r"position_ids must be \[B, L\] or \[3, B, L\], got shape \(2, 1, 4\)"),
    (LLAMA, 64, POS, None, r"q has head dim D=64 but the config's head dim is 128"),
    (GEMMA3, 256, POS, "full_attention",
     r"q has head dim D=256 but the config's head dim for layer_type='full_attention' is 128"),
    ({**PHI3, "rope_scaling": {**PHI3["rope_scaling"], "short_factor": [1.0] * 47}}, 96, POS,
     None, r"short_factor must have rotary_dim / 2 = 48 entries \(rotary_dim=96\), got 47"),
    (LLAMA, 128, np.arange(5)[None], None,
     (r"position_ids must be \[B, L\] = \[1, 4\] \(or \[3, B, L\] for multimodal RoPE\) to "
     r"match q, got shape \(1, 5\)")),
    ({**LLAMA, "partial_rotary_factor": 0.5, "rope_scaling": {"type": "linear", "factor": 2.0}},
     128, POS, None, (r"model_type='llama' applies cos/sin over the whole head dim 128, but "
                     r"partial_rotary_factor gives rotary dim 64")),
    ({"model_type": "deepseek_v2", "hidden_size": 256, "num_attention_heads": 2,
      "qk_rope_head_dim": 64, "qk_nope_head_dim": 128}, 192, POS, None,
     (r"model_type='deepseek_v2' has MLA keys \(qk_nope_head_dim=128\); rotate_like_hf mirrors "
     r"deepseek_v3's MLA layout only")),
    ({k: v for k, v in LLAMA.items() if k != "model_type"} | {"partial_rotary_factor": 0.5},
     128, POS, None, r"partial_rotary_factor=0.5 without a model_type is ambiguous"),
])
def test_bad_input_raises_naming_the_value(config, d, positions, layer_type, match):
    q, k = qk(d)
    with pytest.raises(ValueError, match=match):
        hf_config.rotate_like_hf(config, q, k, positions, layer_type=layer_type)


def test_model_class_defaults_follow_model_type():
    neox = {"model_type": "gpt_neox", "hidden_size": 256, "num_attention_heads": 2,
            "rope_theta": 5000.0, "rotary_emb_base": 20000}
    kw = hf_config.rope_kwargs_from_hf_config(neox)
    assert (kw["base"], kw["rotary_dim"]) == (20000.0, 32)  # rotary_emb_base; rotary_pct 0.25
    stablelm = {"model_type": "stablelm", "hidden_size": 256, "num_attention_heads": 2}
    assert hf_config.rope_kwargs_from_hf_config(stablelm)["rotary_dim"] == 32
    llama = hf_config.rope_kwargs_from_hf_config({**LLAMA, "partial_rotary_factor": 0.5})
    assert llama["rotary_dim"] == 128  # the default RoPE ignores it
    phi3 = {**PHI3, "max_position_embeddings": 8192}
    del phi3["original_max_position_embeddings"]
    kw = hf_config.rope_kwargs_from_hf_config(phi3)
    assert kw["scaling"]["original_max_position_embeddings"] == 4096  # Phi-3's class default
    ds = hf_config.rope_kwargs_from_hf_config({"model_type": "deepseek_v3", "hidden_size": 256,
                                               "num_attention_heads": 2, "qk_rope_head_dim": 64,
                                               "rope_interleave": None})
    assert ds["layout"] == "half"  # rope_interleave: null means the half layout
    gemma3 = hf_config.rope_kwargs_from_hf_config(GEMMA3, layer_type="sliding_attention")
    assert gemma3["base"] == 10000.0  # Gemma 3's local theta when the file omits it


def test_acceptance_differences_are_deliberate():
    yarn = {**LLAMA, "max_position_embeddings": 16384,
            "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 4096}}
    assert hf_config.rope_kwargs_from_hf_config(yarn)["scaling"]["factor"] == 4.0
    su = hf_config.rope_kwargs_from_hf_config({**PHI3, "rope_scaling": {
        **PHI3["rope_scaling"], "type": "su"}})
    assert su["scaling"]["rope_type"] == "longrope"
    with pytest.raises(ValueError, match=r"beta_fast must be > 0"):
        hf_config.rope_kwargs_from_hf_config({**yarn, "rope_scaling": {
            **yarn["rope_scaling"], "factor": 4.0, "beta_fast": 0}})
    with pytest.raises(ValueError, match=r"rope_type='yarn' and type='linear'; they must agree"):
        hf_config.rope_kwargs_from_hf_config({**LLAMA, "rope_scaling": {
            "rope_type": "yarn", "type": "linear", "factor": 2.0}})
    with pytest.raises(ValueError, match=r"rope_type='mrope' needs the model_type of a "
                                         r"multimodal RoPE model"):
        hf_config.rope_kwargs_from_hf_config({**QWEN2_VL, "model_type": "llama"})


def test_longrope_regime_is_strict_and_batch_wide():
    short = hf_config.from_hf_config(PHI3, seq_len=4096)[0]
    long_ = hf_config.from_hf_config(PHI3, seq_len=4097)[0]
    assert float(short[0] / long_[0]) == 2.0
    q, k = qk(96, b=2)
    pos = np.array([[0, 1, 2, 3], [0, 1, 2, 4096]])  # row 1 reaches length 4097
    both, _ = hf_config.rotate_like_hf(PHI3, q, k, pos)
    alone, _ = hf_config.rotate_like_hf(PHI3, q[:1], k[:1], pos[:1])
    assert not np.allclose(np.asarray(both)[:1], np.asarray(alone))  # row 0 went long too


@pytest.mark.parametrize("config, error, match", [
    ({**LLAMA, "hidden_size": "256"}, TypeError, r"hidden_size must be an int, got hidden_size='256'"),
    ({**LLAMA, "num_attention_heads": 0}, ValueError,
     r"num_attention_heads must be >= 1, got num_attention_heads=0"),
    ({**LLAMA, "head_dim": 128.5}, TypeError, r"head_dim must be an int, got head_dim=128.5"),
    ({**LLAMA, "max_position_embeddings": "4096"}, TypeError,
     r"max_position_embeddings must be an int, got max_position_embeddings='4096'"),
    ({**LLAMA, "model_type": 3}, TypeError, r"model_type must be a str, got model_type=3"),
    ({**GEMMA3, "sliding_window_pattern": 0}, ValueError,
     r"sliding_window_pattern must be >= 1, got sliding_window_pattern=0"),
    ({**GEMMA3, "layer_types": ["full_attention"] * 5}, ValueError,
     r"layer_types has 5 entries but num_hidden_layers=6"),
    ({**GEMMA3, "layer_types": "full_attention"}, TypeError, r"layer_types must be a list of str"),
    ({"model_type": "deepseek_v3", "hidden_size": 256, "num_attention_heads": 2,
      "qk_rope_head_dim": 64, "rope_interleave": "false"}, TypeError,
     r"rope_interleave must be a bool \(True or False\), got rope_interleave='false'"),
    ({**QWEN2_VL, "rope_scaling": {"type": "mrope", "mrope_section": "16,24,24"}}, TypeError,
     r"mrope_section must be a list of 3 ints, got mrope_section='16,24,24'"),
    ({**QWEN2_VL, "mrope_interleaved": "false"}, TypeError,
     r"mrope_interleaved must be a bool \(True or False\), got mrope_interleaved='false'"),
])
def test_config_values_are_checked_not_coerced(config, error, match):
    """A string, float or zero where transformers expects an int (or bool) is refused, naming
    the key, instead of being coerced by int() / bool() (bool('false') is True) or failing as
    a ZeroDivisionError."""
    layer_type = "full_attention" if config.get("model_type") == "gemma3_text" else None
    with pytest.raises(error, match=match):
        hf_config.rope_kwargs_from_hf_config(config, layer_type=layer_type)


def test_transformer_config_kwargs_checks_counts():
    with pytest.raises(TypeError, match=r"vocab_size must be an int, got vocab_size='32'"):
        hf_config.transformer_config_kwargs({**LLAMA, "vocab_size": "32", "num_hidden_layers": 2,
                                             "intermediate_size": 64})
    with pytest.raises(ValueError, match=r"config needs 'vocab_size' to build a TransformerConfig "
                                         r"\(or pass vocab_size= as an override\)"):
        hf_config.transformer_config_kwargs({**LLAMA, "num_hidden_layers": 2})
    kw = hf_config.transformer_config_kwargs({**LLAMA, "num_hidden_layers": 2}, vocab_size=32,
                                             mlp_dim=64)  # overrides supply what is missing
    assert (kw["vocab_size"], kw["mlp_dim"], kw["num_layers"]) == (32, 64, 2)


def test_softmax_scale_factor_reads_the_validated_dict():
    mla = {"model_type": "deepseek_v3", "hidden_size": 256, "num_attention_heads": 2,
           "qk_rope_head_dim": 64, "max_position_embeddings": 16384,
           "rope_scaling": {"type": "yarn", "original_max_position_embeddings": 4096,
                            "mscale": 1.0, "mscale_all_dim": 1.0}}
    want = (0.1 * np.log(4.0) + 1.0) ** 2  # factor inferred: 16384 / 4096
    assert hf_config.softmax_scale_factor(mla) == pytest.approx(want, rel=1e-12)
    with pytest.raises(TypeError, match=r"mscale_all_dim must be a number"):
        hf_config.softmax_scale_factor({**mla, "rope_scaling": {**mla["rope_scaling"],
                                                                "mscale_all_dim": "1"}})
    assert hf_config.softmax_scale_factor(GEMMA3, layer_type="full_attention") == 1.0


def test_unknown_model_type_and_non_str_layer_type_are_named():
    """An unknown model_type with a partial factor was told it had no model_type; a layer_type
    of the wrong type was a ValueError 'unknown layer_type=3'."""
    with pytest.raises(ValueError, match=r"partial_rotary_factor=0.5 with model_type='llamax' "
                                         r"\(not a family posenc_jax knows\) is ambiguous"):
        hf_config.rope_kwargs_from_hf_config({**LLAMA, "model_type": "llamax",
                                              "partial_rotary_factor": 0.5})
    with pytest.raises(TypeError, match=r"layer_type must be a str or None, got layer_type=3 "
                                        r"\(int\)"):
        hf_config.rope_kwargs_from_hf_config(GEMMA3, layer_type=3)
