"""gpt-oss and Llama 4 (text) checkpoints: the tiny random ones of
scripts/make_pretrained_golden_moe.py (transformers 5.25, every feature on: sinks, alternating
windows, YaRN x32 without truncation, attention biases, the clamped SwiGLU experts; chunked
RoPE layers, a NoPE layer with the query temperature, QK L2-norm, llama3 scaling with equal band
factors, interleaved dense / MoE layers with a shared expert).

The logits at every position are test_pretrained_tiny's (every record with a fixture there);
here: the greedy continuation with the KV cache equals transformers', bfloat16 tracks
transformers' bfloat16, the kernel gives the same logits, the split of the fused expert tensors
(both ways), the tensor errors naming the file and the tensor. The configs:
test_pretrained_moe_configs.py."""

import pathlib
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from posenc_jax import pretrained
from posenc_jax.model.generate import generate
from posenc_jax.pretrained.families import by_model_type
from posenc_jax.pretrained.names import targets
from posenc_jax.pretrained.safetensors_io import open_safetensors
from posenc_jax.pretrained.save import _inverse

TINY = pathlib.Path(__file__).parents[1] / "data" / "pretrained" / "tiny"
FAMILIES = ("gpt_oss", "llama4_text")


@nnx.jit
def forward(model, tokens):
    return model(tokens)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_with_the_cache_equals_transformers(family):
    """32 greedy tokens after a 12-token prompt (our generate: prefill + cached decode, past
    the window / chunk of 8 and through several temperature floors) are transformers'."""
    golden = np.load(TINY / family / "logits.npz")
    lm = pretrained.load(TINY / family, attention="dense")
    prompt = jnp.asarray(golden["greedy_prompt"])
    new = golden["greedy_new"]
    out = np.asarray(generate(lm.model, prompt, max_new_tokens=new.shape[1]))
    np.testing.assert_array_equal(out[:, prompt.shape[1]:], new)


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_tracks_transformers_bfloat16(family):
    """Loaded in bfloat16, our logits are within bfloat16 rounding of transformers' own bfloat16
    logits (0.11 / 0.09 seen); against float32 a routing flip may move a position far (gpt-oss:
    1.2 at position 5, in transformers' bfloat16 as in ours)."""
    golden = np.load(TINY / family / "logits.npz")
    lm = pretrained.load(TINY / family, dtype="bfloat16", attention="dense")
    got = np.asarray(forward(lm.model, jnp.asarray(golden["token_ids"])), np.float32)
    assert np.abs(got - golden["bfloat16_logits"]).max() < 0.2
    np.testing.assert_array_equal(got.argmax(-1), golden["logits__default"].argmax(-1))


@pytest.mark.parametrize("family, name, split", [
    ("gpt_oss", "model.layers.0.mlp.experts.gate_up_proj", "alternate"),
    ("gpt_oss", "model.layers.1.mlp.experts.gate_up_proj_bias", "alternate"),
    ("llama4_text", "model.layers.1.feed_forward.experts.gate_up_proj", "halves")])
def test_fused_expert_tensors_split_and_join_exactly(family, name, split):
    lm_cfg = pretrained.load(TINY / family, attention="dense").model.config
    target = targets(lm_cfg, by_model_type(family))[name]
    w = open_safetensors(TINY / family).tensor(name)
    gate, up = (part.convert(w) for part in target.parts)
    f = w.shape[-1] // 2
    want = (w[..., 0::2], w[..., 1::2]) if split == "alternate" else (w[..., :f], w[..., f:])
    np.testing.assert_array_equal(gate, want[0])
    np.testing.assert_array_equal(up, want[1])
    np.testing.assert_array_equal(_inverse(target, [gate, up]), w)


def _copy_with(tmp_path, family, change):
    d = pathlib.Path(shutil.copytree(TINY / family, tmp_path / family))
    ckpt = open_safetensors(d)
    tensors = {n: ckpt.tensor(n) for n in ckpt.names()}
    change(tensors)
    save_file(tensors, str(d / "model.safetensors"))
    return d


@pytest.mark.parametrize("family, name", [
    ("gpt_oss", "model.layers.1.mlp.experts.down_proj_bias"),
    ("llama4_text", "model.layers.3.feed_forward.shared_expert.up_proj.weight")])
def test_a_missing_expert_tensor_names_the_checkpoint_and_the_tensor(tmp_path, family, name):
    d = _copy_with(tmp_path, family, lambda t: t.pop(name))
    with pytest.raises(ValueError, match=rf"{family}: tensor '{name}': missing from the "
                       "checkpoint"):
        pretrained.load(d)


@pytest.mark.parametrize("family, name, expected", [
    ("gpt_oss", "model.layers.0.mlp.router.weight", r"\(4, 64\)"),
    ("llama4_text", "model.layers.1.feed_forward.router.weight", r"\(4, 64\)"),
    ("llama4_text", "model.layers.1.feed_forward.experts.gate_up_proj", r"\(4, 64, 64\)")])
def test_a_router_or_expert_of_the_wrong_shape_names_the_file(tmp_path, family, name, expected):
    d = _copy_with(tmp_path, family, lambda t: t.__setitem__(name, t[name][:-1]))
    with pytest.raises(ValueError, match=rf"tensor '{name}': shape .* does not fit the config "
                       rf"\(expected {expected}\)") as info:
        pretrained.load(d)
    assert str(d / "model.safetensors") in str(info.value)


def test_a_dense_mlp_tensor_in_a_moe_layer_is_an_extra_tensor(tmp_path):
    """Llama 4's dense and MoE layers share param names; the table keeps them apart."""
    d = _copy_with(tmp_path, "llama4_text", lambda t: t.__setitem__(
        "model.layers.1.feed_forward.gate_proj.weight", np.zeros((48, 64), np.float32)))
    with pytest.raises(ValueError, match=r"'model.layers.1.feed_forward.gate_proj.weight': not "
                       "a parameter of this 4-layer model"):
        pretrained.load(d)


@pytest.mark.parametrize("family, attention", [("gpt_oss", "pallas"), ("llama4_text", "pallas")])
def test_the_kernel_gives_transformers_logits(family, attention):
    """Sinks and windows (gpt-oss), chunks, NoPE and the temperature (Llama 4) through the
    Pallas kernel (interpret mode here): within 1e-4 as the dense path (blockwise: 2.6e-6 /
    3.1e-6 measured, not repeated here; attention-level tests hold dense = blockwise)."""
    golden = np.load(TINY / family / "logits.npz")
    lm = pretrained.load(TINY / family, attention=attention)
    got = np.asarray(forward(lm.model, jnp.asarray(golden["token_ids"])))
    np.testing.assert_allclose(got, golden["logits__default"], atol=1e-4, rtol=0)
