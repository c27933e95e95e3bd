"""gpt-oss and Llama 4 (text) configs through their records: what the tiny goldens turn on,
the settings refused by key, the published configs (gpt-oss-20b, Llama-4-Scout in its
multimodal wrapper) read to transformers' tensor names and shapes, and the export's config.json
(the class keys transformers wrote, the refusals). Fast: no forward pass."""

import dataclasses
import json
import pathlib

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from posenc_jax import pretrained
from posenc_jax.model.config import TransformerConfig
from posenc_jax.pretrained.export_config import hf_config
from posenc_jax.pretrained.families import by_model_type, config_kwargs
from posenc_jax.pretrained.names import targets
from posenc_jax.pretrained.safetensors_io import open_safetensors

TINY = pathlib.Path(__file__).parents[1] / "data" / "pretrained" / "tiny"
FAMILIES = ("gpt_oss", "llama4_text")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_golden_exercises_every_feature(family):
    """What the fixture's config turns on, read through the record (so a golden made with a
    feature off would fail here, not pass silently)."""
    config = json.loads((TINY / family / "config.json").read_text())
    kw = config_kwargs(config, where=family)
    tokens = np.load(TINY / family / "logits.npz")["token_ids"].shape[1]
    if family == "gpt_oss":
        assert kw["attention_sinks"] and kw["o_bias"] and kw["qkv_bias"]
        assert kw["sliding_window"] == [8, None] and tokens > 8
        assert kw["encoding_kwargs"]["scaling"]["truncate"] is False
        assert (kw["router"], kw["mlp_activation"]) == ("topk_softmax", "swiglu_clamped")
    else:
        pattern = kw["layer_pattern"]
        assert [e.get("encoding") for e in pattern] == [None, None, None, "nope"]
        assert [e.get("chunk") for e in pattern] == [8, 8, 8, None] and tokens > 8
        assert [bool(e.get("qk_l2_norm")) for e in pattern] == [True, True, True, False]
        assert pattern[3]["temperature"] and kw["attn_temperature"]["floor_scale"] < tokens / 4
        assert kw["encoding_kwargs"]["layout"] == "interleaved"
        scaling = kw["encoding_kwargs"]["scaling"]
        assert scaling["low_freq_factor"] == scaling["high_freq_factor"]
        assert kw["moe_layers"] == (1, 3) and kw["shared_expert_mlp_dim"] == 32
        assert kw["mlp_dim"] == 48 and kw["router"] == "sigmoid_topk"


def _config(family):
    return json.loads((TINY / family / "config.json").read_text())


@pytest.mark.parametrize("family, change, match", [
    ("gpt_oss", {"swiglu_limit": 10.0},
     r"gpt_oss: config swiglu_limit=10.0 is not supported here \(only 7.0"),
    ("gpt_oss", {"swiglu_alpha": 1.0}, r"config swiglu_alpha=1.0 is not supported"),
    ("gpt_oss", {"quantization_config": {"quant_method": "mxfp4"}},
     r"quantization_config \(quant_method='mxfp4'\) is not supported"),
    ("gpt_oss", {"layer_types": ["sliding_attention"]}, r"config layer_types=\['sliding"),
    ("gpt_oss", {"num_experts_per_tok": 5}, r"num_experts_per_tok=5 .*at most num_local_"),
    ("llama4_text", {"no_rope_layers": [1, 1, 1]},
     r"no_rope_layers=\[1, 1, 1\] .*one entry per layer \(num_hidden_layers=4\)"),
    ("llama4_text", {"layer_types": ["chunked_attention"] * 3 + ["sliding_attention"]},
     r"config layer_types=.* \(entries 'chunked_attention' or 'full_attention'\)"),
    ("llama4_text", {"attention_chunk_size": None, "layer_types": ["chunked_attention"] * 4},
     r"attention_chunk_size=None .*layer_types has chunked layers"),
    ("llama4_text", {"hidden_act": "gelu"}, r"config hidden_act='gelu' is not supported"),
    ("llama4_text", {"attention_bias": "yes"}, r"attention_bias must be true or false"),
    ("llama4_text", {"attn_temperature_tuning": "yes"}, r"attn_temperature_tuning must be a bool"),
    ("llama4_text", {"attn_temperature_tuning": -1}, r"attn_temperature_tuning must be >= 0"),
])
def test_unsupported_settings_are_refused_naming_the_key(family, change, match):
    with pytest.raises((ValueError, TypeError), match=match):
        config_kwargs({**_config(family), **change}, where=family)


def test_attention_bias_stays_refused_where_o_proj_has_none():
    config = json.loads((TINY / "llama" / "config.json").read_text())
    with pytest.raises(ValueError, match=r"config attention_bias=True is not supported here "
                       r"\(only false\)"):
        config_kwargs({**config, "attention_bias": True}, where="llama")


def test_llama4_attention_bias_adds_q_k_v_and_o_biases():
    kw = config_kwargs({**_config("llama4_text"), "attention_bias": True}, where="llama4_text")
    assert kw["qkv_bias"] and kw["o_bias"]


def test_export_refuses_what_the_named_family_cannot_hold(tmp_path):
    """Llama 4's interleaved RoPE cannot go out as gpt-oss (nothing written); a router or an MoE
    layout gpt-oss does not have is caught by the read-back."""
    lm = pretrained.load(TINY / "llama4_text", attention="dense")
    with pytest.raises(ValueError, match=r"layer_encodings\[0\]='rope': layout='interleaved' "
                       r"\(this family rotates layout='half'"):
        pretrained.save(lm, tmp_path / "out", model_type="gpt_oss")
    assert not (tmp_path / "out").exists()
    cfg = pretrained.load(TINY / "gpt_oss", attention="dense").model.config
    with pytest.raises(ValueError, match=r"as model_type='gpt_oss', the config.json would not "
                       r"hold: router='softmax_topk_norm' \(reads back as 'topk_softmax'\)"):
        hf_config(dataclasses.replace(cfg, router="softmax_topk_norm"), "gpt_oss")
    with pytest.raises(ValueError, match=r"layer 1's \(window, chunk, qk_l2_norm, temperature, "
                       r"moe\) \(None, None, False, None, False\) \(reads back as"):
        hf_config(dataclasses.replace(cfg, moe_layers=(0,)), "gpt_oss")
    with pytest.raises(ValueError, match=r"sliding_window=\[4, 8\] has several window sizes"):
        hf_config(dataclasses.replace(cfg, sliding_window=(4, 8)), "gpt_oss")
    llama4 = pretrained.load(TINY / "llama4_text", attention="dense").model.config
    with pytest.raises(ValueError, match=r"attention_chunk_size would need several values "
                       r"\[4, 8\]; a transformers config has one"):
        hf_config(dataclasses.replace(llama4, attention_chunk=(4, 8, 8, None), layer_pattern=[
            {k: v for k, v in dict(e).items() if k != "chunk"} for e in llama4.layer_pattern]),
            "llama4_text")


def test_export_writes_the_class_keys_transformers_reads():
    """The exported config.json's family keys equal the fixture's own (which transformers
    wrote); transformers itself loaded both exports and gave the golden logits exactly
    (docs/pretrained.md, measured in the golden venv)."""
    for family, keys in (("gpt_oss", ("attention_bias", "layer_types", "sliding_window",
                                      "num_local_experts", "num_experts_per_tok",
                                      "swiglu_limit", "rope_parameters")),
                         ("llama4_text", ("no_rope_layers", "layer_types", "moe_layers",
                                          "attention_chunk_size", "use_qk_norm", "floor_scale",
                                          "attn_scale", "attn_temperature_tuning",
                                          "intermediate_size", "intermediate_size_mlp"))):
        lm = pretrained.load(TINY / family, attention="dense")
        out = hf_config(lm.model.config, family, base=lm.hf_config)
        config = _config(family)
        assert {k: out[k] for k in keys} == {k: config[k] for k in keys}


def test_gpt_oss_golden_tells_yarn_truncation_apart():
    """At the published original context 4096 the correction range is fractional: truncating
    it (vllm#27722 / sglang#14270 / EasyDeL) changes the frequencies the golden was made with."""
    kw = config_kwargs(_config("gpt_oss"), where="gpt_oss")
    truncated = {**kw, "encoding_kwargs": {**kw["encoding_kwargs"], "scaling": {
        **kw["encoding_kwargs"]["scaling"], "truncate": True}}}
    ours, wrong = (TransformerConfig(**k).layer_encoding(0).frequencies()[0]
                   for k in (kw, truncated))
    ratio = np.asarray(ours) / np.asarray(wrong)  # two of the 8 frequencies move, one by 2x
    assert np.sum(np.abs(ratio - 1) > 0.1) == 2


def test_the_multimodal_llama4_checkpoint_loads_its_text_model(tmp_path):
    """`Llama4ForConditionalGeneration`'s layout (names as transformers 5.25 saves them): the
    text model under `language_model.`, its config in `text_config`, a vision model and a
    projector beside it (ignored); the published `attn_temperature_tuning: 4` reads as on."""
    text = _config("llama4_text")
    config = {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
              "text_config": {**text, "attn_temperature_tuning": 4},
              "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 32}}
    d = tmp_path / "llama4"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    ckpt = open_safetensors(TINY / "llama4_text")
    tensors = {f"language_model.{n}": ckpt.tensor(n) for n in ckpt.names()}
    tensors["vision_model.patch_embedding.linear.weight"] = np.ones((32, 588), np.float32)
    tensors["multi_modal_projector.linear_1.weight"] = np.ones((64, 32), np.float32)
    save_file(tensors, str(d / "model.safetensors"))
    ours = pretrained.load(d, attention="dense").model
    plain = pretrained.load(TINY / "llama4_text", attention="dense").model
    assert ours.config == plain.config
    mine, theirs = nnx.to_flat_state(nnx.state(ours, nnx.Param)), nnx.to_flat_state(
        nnx.state(plain, nnx.Param))
    assert [p for p, _ in mine] == [p for p, _ in theirs]
    for (_, a), (_, b) in zip(mine, theirs):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()))


#: The published configs (gpt-oss-20b's config.json less its MXFP4 `quantization_config`, as
#: the bfloat16 re-exports carry it; Llama-4-Scout-17B-16E's text_config), cut to 4 layers.
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 2,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 4, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "rms_norm_eps": 1e-05, "rope_scaling": {
        "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
        "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 201088}
SCOUT_TEXT = {
    "attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0,
    "attn_scale": 0.1, "attn_temperature_tuning": 4, "bos_token_id": 200000,
    "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "interleave_moe_layer_step": 1,
    "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "max_position_embeddings": 10485760, "model_type": "llama4_text",
    "no_rope_layers": [1, 1, 1, 0], "num_attention_heads": 40, "num_experts_per_tok": 1,
    "num_hidden_layers": 4, "num_key_value_heads": 8, "num_local_experts": 16,
    "pad_token_id": 200018, "rms_norm_eps": 1e-05, "rope_scaling": {
        "factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
    "use_qk_norm": True, "vocab_size": 202048}


@pytest.mark.parametrize("config, prefix, shapes", [
    (GPT_OSS_20B, "model.", {
        "model.layers.0.self_attn.q_proj.weight": (4096, 2880),
        "model.layers.0.self_attn.sinks": (64,),
        "model.layers.1.self_attn.o_proj.bias": (2880,),
        "model.layers.0.mlp.router.weight": (32, 2880),
        "model.layers.0.mlp.experts.gate_up_proj": (32, 2880, 5760),
        "model.layers.0.mlp.experts.gate_up_proj_bias": (32, 5760),
        "model.layers.0.mlp.experts.down_proj": (32, 2880, 2880)}),
    ({"model_type": "llama4", "text_config": SCOUT_TEXT}, "language_model.model.", {
        "language_model.model.layers.0.self_attn.k_proj.weight": (1024, 5120),
        "language_model.model.layers.3.feed_forward.router.weight": (16, 5120),
        "language_model.model.layers.3.feed_forward.experts.gate_up_proj": (16, 5120, 16384),
        "language_model.model.layers.3.feed_forward.experts.down_proj": (16, 8192, 5120),
        "language_model.model.layers.3.feed_forward.shared_expert.gate_proj.weight": (8192, 5120),
        "language_model.lm_head.weight": (202048, 5120)}),
], ids=["gpt-oss-20b", "llama-4-scout"])
def test_the_published_configs_read_to_the_published_tensor_shapes(config, prefix, shapes):
    """The published config.json files are read (top-level 4.x `rope_scaling`, Scout's
    `attn_temperature_tuning: 4`, a multimodal wrapper) and the plan expects the tensor names
    and shapes transformers' classes give them (written from those classes, not read from the
    real files, which are not here); the model stays abstract."""
    kw = config_kwargs(config, where="published")
    plan = targets(TransformerConfig(**kw), by_model_type(config["model_type"]), prefix)
    assert {n: plan[n].hf_shape for n in shapes} == shapes
    if config["model_type"] == "gpt_oss":
        assert kw["sliding_window"] == [128, None] * 2 and kw["experts_per_token"] == 4
        with pytest.raises(ValueError, match=r"quant_method='mxfp4'"):
            config_kwargs({**config, "quantization_config": {"quant_method": "mxfp4"}},
                          where="published")
    else:
        assert kw["layer_pattern"][3] == {"encoding": "nope", "temperature": True}
        assert kw["attn_temperature"] == {"floor_scale": 8192.0, "attn_scale": 0.1}
        assert kw["moe_layers"] == (0, 1, 2, 3) and kw["experts_per_token"] == 1
