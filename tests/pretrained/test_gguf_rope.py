"""A Llama 3.1-style GGUF with `rope_freqs.weight` (and twins with `rope.scaling.*` yarn / linear
keys) gives transformers' logits for the same model as safetensors with `rope_parameters:
llama3` (tests/data/pretrained/gguf_rope, written by scripts/make_gguf_rope_golden.py in the
throwaway venv): within 1e-4 in float32 over 64 tokens, twice the original context of 32, so the
factors move every logit past position 32. transformers 5.24 loading the same GGUF drops
`rope_freqs.weight` and gives exactly the unscaled model's logits (`hf_gguf_llama3` ==
`hf_default`, checked here on the golden), more than 2 away from its own safetensors twin; the
test would fail if our reader dropped the factors again (ours differ from the unscaled model by
the same margin)."""

import json
import pathlib
import shutil

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax import pretrained
from posenc_jax.pretrained.api import open_checkpoint
from posenc_jax.pretrained.loader import build

DATA = pathlib.Path(__file__).parents[1] / "data" / "pretrained" / "gguf_rope"
FILES = {"llama3": "llama31.gguf", "yarn": "yarn.gguf", "linear": "linear.gguf"}


@nnx.jit
def forward(model, tokens):
    return model(tokens)


def logits(source) -> np.ndarray:
    model, _, _ = build(open_checkpoint(source), dtype="float32", attention="dense")
    return np.asarray(forward(model, jnp.asarray(np.load(DATA / "logits.npz")["token_ids"])))


@pytest.mark.parametrize("case", sorted(FILES))
def test_gguf_logits_equal_transformers_safetensors_twin(case):
    golden = np.load(DATA / "logits.npz")
    got = logits(DATA / FILES[case])
    np.testing.assert_allclose(got, golden[f"hf_{case}"], atol=1e-4, rtol=0)
    # the scaling matters: far from the plain-RoPE model (position 0 alone is the same)
    gap = np.abs(got - golden["hf_default"]).max(axis=-1)[0]
    assert gap[0] < 1e-5 and gap.max() > 1.0, gap.max()


def test_transformers_gguf_loader_drops_the_factors():
    """What the golden recorded: transformers' own GGUF load is the unscaled model, 2.3 off."""
    golden = np.load(DATA / "logits.npz")
    np.testing.assert_array_equal(golden["hf_gguf_llama3"], golden["hf_default"])
    assert np.abs(golden["hf_gguf_llama3"] - golden["hf_llama3"]).max() > 2.0


def test_gguf_config_rope_equals_the_twin_config_json():
    twin = json.loads((DATA / "twin" / "config.json").read_text())
    cfg = open_checkpoint(DATA / "llama31.gguf").config
    assert cfg["rope_parameters"] == twin["rope_parameters"]
    assert all(type(v) is type(twin["rope_parameters"][k])
               for k, v in cfg["rope_parameters"].items())
    for key in ("head_dim", "num_hidden_layers", "max_position_embeddings", "hidden_size"):
        assert cfg[key] == twin[key]


def test_gguf_export_writes_the_twin_rope_parameters(tmp_path):
    model, _, hf = build(open_checkpoint(DATA / "llama31.gguf"), dtype="float32",
                         attention="dense")
    pretrained.save(model, tmp_path, model_type="llama", hf_config_base=hf)
    twin = json.loads((DATA / "twin" / "config.json").read_text())
    assert json.loads((tmp_path / "config.json").read_text())["rope_parameters"] == twin[
        "rope_parameters"]


def test_gguf_and_safetensors_twin_load_to_the_same_logits():
    np.testing.assert_allclose(logits(DATA / "llama31.gguf"), logits(DATA / "twin"),
                               atol=2e-5, rtol=0)


ODD = np.array([1.0, 1.2, 2.0, 2.5, 6.0, 8.0, 8.0, 8.0], np.float32)  # no llama3 rule's shape


def with_rope_freqs(tmp_path, values) -> pathlib.Path:
    path = tmp_path / "odd.gguf"
    shutil.copy(DATA / "llama31.gguf", path)
    reader = gguf.GGUFReader(path, "r+")
    [t] = [t for t in reader.tensors if t.name == "rope_freqs.weight"]
    t.data[:] = values
    reader.data.flush()
    del reader
    return path


def test_per_pair_divisors_load_and_export_as_transformers_reads_them(tmp_path):
    """Divisors no llama3 rule makes are kept per pair (longrope, short == long): the GGUF, the
    twin under those rope_parameters and our export of the GGUF give the same logits, and the
    export's config.json carries them (transformers' LlamaForCausalLM divides by them)."""
    path = with_rope_freqs(tmp_path, ODD)
    model, _, hf = build(open_checkpoint(path), dtype="float32", attention="dense")
    rope = hf["rope_parameters"]
    assert rope["rope_type"] == "longrope" and rope["short_factor"] == rope["long_factor"]
    np.testing.assert_array_equal(np.float32(rope["short_factor"]), ODD)
    tokens = jnp.asarray(np.load(DATA / "logits.npz")["token_ids"])
    got = np.asarray(forward(model, tokens))
    twin, _, _ = build(open_checkpoint(DATA / "twin"), dtype="float32", attention="dense",
                       rope_scaling=rope)
    np.testing.assert_allclose(got, np.asarray(forward(twin, tokens)), atol=2e-5, rtol=0)
    out = tmp_path / "export"
    pretrained.save(model, out, model_type="llama", hf_config_base=hf)
    written = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert written["rope_type"] == "longrope"
    np.testing.assert_array_equal(np.float32(written["short_factor"]), ODD)
    back, _, _ = build(open_checkpoint(out), dtype="float32", attention="dense")
    np.testing.assert_allclose(np.asarray(forward(back, tokens)), got, atol=2e-5, rtol=0)
