"""Export of the shapes real checkpoints have and tiny fixtures do not (issue 34's survivors).

A mutation run left alive one-line bugs in export that only a real model's values expose: a
head dim that is not E / H (Gemma 3 270M: E = 640, 4 heads, head_dim 256), a
query_pre_attn_scalar apart from the head dim, sliding windows and layer patterns, a local RoPE
base apart from the global one. Each config here makes every such value distinct from the
value a bug would put in its place, and the written config.json is compared with the values
typed here (not with what the exporter computes), then read back to the same params and logits.
"""

from __future__ import annotations

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax.pretrained.loader import build
from posenc_jax.pretrained.safetensors_io import open_safetensors
from posenc_jax.pretrained.save import save

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import pretrained_fakes  # noqa: E402

SLIDE, FULL = "sliding_attention", "full_attention"
GEMMA3_270M = {  # google/gemma-3-270m's config.json, with 6 of its 18 layers and a tiny vocab
    "hidden_size": 640, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "query_pre_attn_scalar": 256, "sliding_window": 512, "intermediate_size": 64,
    "num_hidden_layers": 6, "layer_types": [SLIDE] * 5 + [FULL], "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768, "rope_local_base_freq": 10000.0,
    "rope_theta": 1_000_000.0, "vocab_size": 48}
DISTINCT = {  # every value apart from the one a wrong variable would give
    **GEMMA3_270M, "num_hidden_layers": 3, "layer_types": [FULL, SLIDE, SLIDE],
    "query_pre_attn_scalar": 192, "sliding_window": 5, "rope_local_base_freq": 12345.0,
    "rope_theta": 54321.0, "final_logit_softcapping": 30.0, "rms_norm_eps": 3e-6,
    "num_key_value_heads": 2}
LLAMA_HEAD_DIM = {"hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 20, "rope_theta": 7777.0, "rms_norm_eps": 2e-5}
CASES = {"gemma3-270m": ("gemma3_text", GEMMA3_270M), "gemma3-distinct": ("gemma3_text",
                                                                          DISTINCT),
         "llama-head-dim": ("llama", LLAMA_HEAD_DIM),
         "qwen3-head-dim": ("qwen3", LLAMA_HEAD_DIM),
         "mistral-window": ("mistral", {**LLAMA_HEAD_DIM, "sliding_window": 7})}


def load(directory):
    model, cfg, _ = build(open_safetensors(directory), attention="dense")
    return model, cfg


def expected(family: str, values: dict) -> dict:
    """The config.json keys the export must write, typed from `values` (not computed)."""
    out = {k: values[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                  "head_dim", "rms_norm_eps")}
    if family == "gemma3_text":
        out.update(query_pre_attn_scalar=values["query_pre_attn_scalar"],
                   sliding_window=values["sliding_window"], layer_types=values["layer_types"],
                   final_logit_softcapping=values.get("final_logit_softcapping"),
                   rope_parameters={
                       SLIDE: {"rope_type": "default",
                               "rope_theta": values["rope_local_base_freq"]},
                       FULL: {"rope_type": "default", "rope_theta": values["rope_theta"]}})
    else:
        out.update(rope_theta=values["rope_theta"], rope_scaling=None)
    if family == "mistral":
        out["sliding_window"] = values["sliding_window"]
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_real_shapes_export_as_typed_and_read_back(case, tmp_path):
    family, values = CASES[case]
    config = pretrained_fakes.hf_config(family, **values)
    config.pop("rope_parameters", None)
    source = pretrained_fakes.write(tmp_path / "src", config,
                                    pretrained_fakes.hf_tensors(config))
    model, cfg = load(source)
    assert cfg.head_dim == values["head_dim"] != values["hidden_size"] // values[
        "num_attention_heads"]
    save(model, tmp_path / "out", hf_config_base=config)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    want = expected(family, values)
    assert {k: written.get(k) for k in want} == want
    back, back_cfg = load(tmp_path / "out")
    assert back_cfg == cfg
    for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)),
                    jax.tree.leaves(nnx.state(back, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (1, 12)), jnp.int32)
    np.testing.assert_array_equal(np.asarray(pretrained_fakes.forward(back, tokens)),
                                  np.asarray(pretrained_fakes.forward(model, tokens)))
