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

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

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


def test_gguf_and_safetensors_twin_load_to_the_same_logits():
    np.testing.assert_allclose(logits(DATA / "llama31.gguf"), logits(DATA / "twin"),
                               atol=2e-5, rtol=0)
