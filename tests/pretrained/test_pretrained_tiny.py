"""posenc_jax.pretrained on tiny random-weight checkpoints of each family: logits within 1e-4 of
transformers 5.24's (tests/data/pretrained/tiny, written by scripts/make_pretrained_golden.py),
with and without a rope_scaling, and on prefixes of the tokens where the golden has them
(Phi-3's LongRoPE on both sides of its original length); prefill + decode equal to the full
forward; the errors naming the file and the tensor. The families are the records' (every
record with a fixture directory)."""

import json
import pathlib
import shutil
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from posenc_jax import pretrained
from posenc_jax.model.kv_cache import init_cache
from posenc_jax.pretrained.families import FAMILIES as RECORDS
from posenc_jax.pretrained.loader import build
from posenc_jax.pretrained.safetensors_io import open_safetensors

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import pretrained_fakes

TINY = pathlib.Path(__file__).parents[1] / "data" / "pretrained" / "tiny"
FAMILIES = [r.model_type for r in RECORDS if (TINY / r.model_type).is_dir()]
CASES = [(f, c) for f in FAMILIES for c in json.loads((TINY / f / "cases.json").read_text())]
PREFIXES = [(f, key) for f in FAMILIES for key in sorted(np.load(TINY / f / "logits.npz"))
            if "__first" in key]


@nnx.jit
def forward(model, tokens):
    return model(tokens)


@pytest.mark.parametrize("family, case", CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_tiny_checkpoint_logits_equal_transformers(family, case):
    golden = np.load(TINY / family / "logits.npz")
    rope = json.loads((TINY / family / "cases.json").read_text())[case]
    lm = pretrained.load(TINY / family, rope_scaling=rope, attention="dense")
    got = np.asarray(forward(lm.model, jnp.asarray(golden["token_ids"])))
    np.testing.assert_allclose(got, golden[f"logits__{case}"], atol=1e-4, rtol=0)


def test_every_record_with_a_fixture_is_tested():
    assert set(FAMILIES) == {p.name for p in TINY.iterdir() if p.is_dir()}
    assert "phi3" in FAMILIES and ("phi3", "logits__default__first16") in PREFIXES


@pytest.mark.parametrize("family, key", PREFIXES, ids=[f"{f}-{k}" for f, k in PREFIXES])
def test_prefix_logits_equal_transformers(family, key):
    """The first n tokens alone. Phi-3: n = 16 = original_max_position_embeddings takes the
    short factors (max position + 1 <= 16), n = 17 the long ones, as transformers does."""
    golden = np.load(TINY / family / "logits.npz")
    case, n = key.removeprefix("logits__").split("__first")
    rope = json.loads((TINY / family / "cases.json").read_text())[case]
    lm = pretrained.load(TINY / family, rope_scaling=rope, attention="dense")
    tokens = jnp.asarray(golden["token_ids"][:, :int(n)])
    got = np.asarray(forward(lm.model, tokens))
    np.testing.assert_allclose(got, golden[key], atol=1e-4, rtol=0)


def test_phi3_short_and_long_factors_give_different_logits():
    """The goldens of both sides differ, so the prefix test sees a wrong factor set."""
    golden = np.load(TINY / "phi3" / "logits.npz")
    full = golden["logits__default"]
    assert np.abs(golden["logits__default__first16"] - full[:, :16]).max() > 0.1
    np.testing.assert_allclose(golden["logits__default__first17"], full[:, :17], atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "phi3", "gpt_oss", "llama4_text"])
def test_prefill_then_decode_equals_the_full_forward(family):
    lm = pretrained.load(TINY / family, attention="dense")
    tokens = jnp.asarray(np.load(TINY / family / "logits.npz")["token_ids"])
    full = forward(lm.model, tokens)
    step = nnx.jit(lambda m, t, p, c: m(t, p, cache=c))
    cache = init_cache(lm.model, 1, tokens.shape[1])
    out, cache = step(lm.model, tokens[:, :20], jnp.arange(20)[None], cache)
    outs = [out]
    for i in range(20, tokens.shape[1]):
        out, cache = step(lm.model, tokens[:, i:i + 1], jnp.full((1, 1), i), cache)
        outs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=1e-5)


def test_bfloat16_load_stays_close_and_holds_bfloat16_params():
    golden = np.load(TINY / "llama" / "logits.npz")
    lm = pretrained.load(TINY / "llama", dtype="bfloat16", attention="dense")
    assert lm.model.embedding[...].dtype == jnp.bfloat16
    got = np.asarray(forward(lm.model, jnp.asarray(golden["token_ids"])), np.float32)
    assert np.abs(got - golden["logits__default"]).max() < 0.1


def _copy(tmp_path, family="qwen2"):
    return pathlib.Path(shutil.copytree(TINY / family, tmp_path / family))


def _rewrite(directory, change):
    file = directory / "model.safetensors"
    ckpt = open_safetensors(directory)
    tensors = {n: ckpt.tensor(n) for n in ckpt.names()}
    change(tensors)
    save_file(tensors, str(file))
    return file


def test_a_missing_tensor_names_the_checkpoint_and_the_tensor(tmp_path):
    d = _copy(tmp_path)
    _rewrite(d, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    with pytest.raises(ValueError, match=r"qwen2: tensor 'model.layers.1.self_attn.k_proj.bias'"
                       r": missing from the checkpoint"):
        pretrained.load(d)


def test_a_wrong_shape_names_the_file_and_the_tensor(tmp_path):
    d = _copy(tmp_path)
    name = "model.layers.0.mlp.up_proj.weight"
    file = _rewrite(d, lambda t: t.__setitem__(name, t[name][:-1]))
    with pytest.raises(ValueError) as info:
        pretrained.load(d)
    assert str(file) in str(info.value) and name in str(info.value)
    assert "does not fit the config (expected (64, 32))" in str(info.value)


def test_an_extra_tensor_names_the_file_and_the_tensor(tmp_path):
    d = _copy(tmp_path)
    file = _rewrite(d, lambda t: t.__setitem__("model.layers.2.mlp.up_proj.weight",
                                               np.zeros((64, 32), np.float32)))
    with pytest.raises(ValueError, match="not a parameter of this 2-layer model") as info:
        pretrained.load(d)
    assert str(file) in str(info.value)


def test_an_unknown_model_type_names_the_checkpoint(tmp_path):
    d = _copy(tmp_path)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match=r"qwen2: unsupported model_type='gpt2'; supported: "):
        pretrained.load(d)


def test_a_sharded_index_naming_an_absent_file_is_an_error(tmp_path):
    d = _copy(tmp_path, "llama")
    (d / "model-00002-of-00004.safetensors").unlink()
    with pytest.raises(ValueError, match="names model-00002-of-00004.safetensors, which is"):
        pretrained.load(d)


@pytest.mark.parametrize("family", sorted(pretrained_fakes.CONFIGS))
def test_every_tensor_lands_in_its_param(tmp_path, family):
    """Layout round trip without transformers: each random HF tensor is found, converted."""
    config = pretrained_fakes.hf_config(family)
    tensors = pretrained_fakes.hf_tensors(config)
    d = pretrained_fakes.write(tmp_path / family, config, tensors, shards=2)
    model, cfg, _ = build(open_safetensors(d), attention="dense")
    q = tensors["model.layers.1.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(
        model.layers[1].attn.q_proj[...],
        q.T.reshape(cfg.embed_dim, cfg.num_heads, cfg.head_dim))
    np.testing.assert_array_equal(model.layers[0].mlp.down[...],
                                  tensors["model.layers.0.mlp.down_proj.weight"].T)
