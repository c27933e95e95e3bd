"""`pretrained.save` (no torch): load -> save -> load round trips and the refusals.

- every tiny family fixture (tests/data/pretrained/tiny/, made by transformers), as it is and
  extended (YaRN x2; Gemma 3: linear x8 on its full-attention layers): the export reads back with identical params, identical logits and the
  same TransformerConfig, and its logits still match transformers' own on the source;
- a model trained by our trainer (`python -m train.export`): exports as Gemma (sqrt(E)
  embeddings), loads back with its logits, and load -> save -> load is bit-identical;
- shards: past `max_shard_bytes` the weights are split with an index the reader follows; an
  export over an earlier one leaves no stale shard;
- a model no transformers family can express is refused naming the part, writing nothing.
"""

import importlib.util
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax.model.transformer import Transformer, TransformerConfig
from posenc_jax.pretrained import shards
from posenc_jax.pretrained.families import FAMILIES as RECORDS
from posenc_jax.pretrained.loader import build
from posenc_jax.pretrained.safetensors_io import open_safetensors
from posenc_jax.pretrained.save import save

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from pretrained_fakes import forward

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "pretrained" / "tiny"
FAMILIES = tuple(r.model_type for r in RECORDS if (TINY / r.model_type).is_dir())
pytestmark = pytest.mark.filterwarnings("ignore:the load_module")


class Loaded:
    """What `pretrained.load` returns, from a safetensors directory."""

    def __init__(self, directory, rope_scaling=None):
        self.model, self.config, self.hf_config = build(
            open_safetensors(directory), rope_scaling=rope_scaling, attention="dense")
        self.tokenizer = None


def params(model):
    return jax.tree.leaves(nnx.state(model, nnx.Param))


def assert_same_params(a, b):
    pa, pb = params(a), params(b)
    assert len(pa) == len(pb)
    for x, y in zip(pa, pb):
        assert x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))


def cases(family):
    """The fixture's own config and its first extended one, if any ({name: rope dict or None})."""
    table = json.loads((TINY / family / "cases.json").read_text())
    extended = [k for k in table if k != "default"][:1]
    return {"default": None, **{name: table[name] for name in extended}}


CASES = [(family, case) for family in FAMILIES for case in cases(family)]


@pytest.mark.parametrize("family,case", CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_load_save_load_is_identical(family, case, tmp_path):
    source = Loaded(TINY / family, rope_scaling=cases(family)[case])
    files = save(source, tmp_path / "out")
    assert "config.json" in files and "model.safetensors" in files
    back = Loaded(tmp_path / "out")
    assert back.config == source.config
    assert_same_params(source.model, back.model)
    golden = np.load(TINY / family / "logits.npz")
    tokens = jnp.asarray(golden["token_ids"])
    ours = np.asarray(back.model(tokens))
    np.testing.assert_array_equal(ours, np.asarray(source.model(tokens)))
    np.testing.assert_allclose(ours, golden[f"logits__{case}"], atol=2e-4, rtol=0)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == family
    if case != "default":  # extended: the scaled RoPE is in the config
        rope = config["rope_parameters"]
        rope = rope.get("full_attention", rope)
        want = cases(family)[case]
        assert rope["rope_type"] == want.get("full_attention", want)["rope_type"] != "default"


def test_sharded_export_has_an_index_the_reader_follows(tmp_path):
    source = Loaded(TINY / "llama")
    out = tmp_path / "out"
    files = save(source, out, max_shard_bytes=40_000)
    index = json.loads((out / shards.INDEX_NAME).read_text())
    parts = sorted(f for f in files if f.endswith(".safetensors"))
    assert len(parts) > 1 and parts[0] == f"model-00001-of-{len(parts):05d}.safetensors"
    assert sorted(set(index["weight_map"].values())) == parts
    assert index["metadata"]["total_size"] == sum(
        int(np.prod(open_safetensors(out).shape(n))) * 4 for n in index["weight_map"])
    assert_same_params(source.model, Loaded(out).model)
    files = save(source, out)  # again, unsharded: no stale shard or index is left
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def test_plan_shards():
    sizes = {"a": 30, "b": 30, "c": 100, "d": 10}
    assert shards.plan_shards(sizes, max_shard_bytes=60) == [["a", "b"], ["c"], ["d"]]
    assert shards.plan_shards(sizes, max_shard_bytes=1000) == [["a", "b", "c", "d"]]
    with pytest.raises(ValueError, match="max_shard_bytes must be positive, got 0"):
        shards.plan_shards(sizes, max_shard_bytes=0)


def test_tokenizer_files_are_copied(tmp_path):
    files = save(Loaded(TINY / "llama"), tmp_path / "out", tokenizer=TINY / "llama")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert name in files
        assert (tmp_path / "out" / name).read_bytes() == (TINY / "llama" / name).read_bytes()


def _tiny_config(data_dir):
    spec = importlib.util.spec_from_file_location("cfg_tiny", ROOT / "configs" / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.dataset.data_dir = str(data_dir)
    config.mesh.data = 1
    config.eval.lengths = ()
    return config


def test_model_trained_here_exports_as_gemma(tmp_path):
    from train import export, trainer
    from train.evaluation import load_model

    workdir = tmp_path / "run"
    trainer.train_and_evaluate(_tiny_config(tmp_path / "data"), str(workdir),
                               devices=jax.devices()[:1], progress=False)
    files = export.export(str(workdir), str(tmp_path / "hf"))
    assert sorted(files) == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["model_type"], config["hidden_act"], config["max_position_embeddings"]) == (
        "gemma", "silu", 32)
    trained, _ = load_model(str(workdir), devices=jax.devices()[:1])
    back = Loaded(tmp_path / "hf")
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 32)), jnp.int32)
    np.testing.assert_allclose(np.asarray(forward(back.model, tokens)),
                               np.asarray(forward(trained, tokens)),
                               atol=1e-5, rtol=0)  # the norms moved from s to 1 + (s - 1)
    save(back, tmp_path / "again")
    again = Loaded(tmp_path / "again")
    assert again.config == back.config
    assert_same_params(back.model, again.model)


def tiny(**kwargs):
    base = {"vocab_size": 32, "num_layers": 2, "embed_dim": 16, "num_heads": 2, "mlp_dim": 32}
    return Transformer(TransformerConfig(**{**base, **kwargs}), rngs=nnx.Rngs(0))


REFUSED = [
    ({"encoding": "alibi"}, r"encoding='alibi' \(adds a bias to the attention scores\)"),
    ({"encoding": "t5"}, r"encoding='t5' \(adds a bias"),
    ({"encoding": "kerple"}, r"encoding='kerple' \(adds a bias"),
    ({"encoding": "fire"}, r"encoding='fire' \(adds a bias"),
    ({"encoding": "cope"}, r"encoding='cope' \("),
    ({"encoding": "sinusoidal"}, r"encoding='sinusoidal' \(adds position embeddings"),
    ({"encoding": "nope"}, r"encoding='nope' does not encode positions at all \(NoPE\)"),
    ({"encoding": "nope", "layer_encodings": ["rope", "nope"]},
     r"layer_encodings\[1\]='nope' does not encode positions"),
    ({"encoding": "nope", "layer_encodings": [("rope", {"base": 1e4}), ("rope", {"base": 1e5})]},
     r"layer_encodings gives 2 different RoPEs to the layers; only Gemma 3"),
    ({"encoding_kwargs": {"layout": "interleaved"}}, r"layout='interleaved'"),
    ({"encoding_kwargs": {"rotary_dim": 4}}, r"rotary_dim=4 < head_dim=8 \(partial rotary\)"),
    ({"encoding_kwargs": {"scaling": {"rope_type": "ntk", "factor": 2.0}}},
     r"rope_type='ntk' is not a transformers rope_type"),
    ({"mlp_activation": "gelu"}, r"mlp_activation='gelu' \(an ungated MLP\)"),
    ({"causal": False}, r"causal=False \(bidirectional attention\)"),
    ({"embed_scale": 2.0}, r"embed_scale=2.0 \(a constant other than sqrt\(E\)\)"),
    ({"embed_scale": None, "qkv_bias": True, "qk_norm": True},
     (r"as model_type='qwen2', the config.json would not hold: qk_norm=True \(reads back as "
      r"False\)")),
    ({"embed_scale": None, "sliding_window": [4, 8]}, r"sliding_window=\[4, 8\] has several"),
    ({"embed_scale": None, "attention_sinks": True},
     (r"attention_sinks=True \(gpt-oss / Llama 4 features\): model_type='llama' has no config "
      r"key for it \(the families that have one: attention_sinks=True: gpt_oss\)")),
    ({"embed_scale": None, "attention_chunk": 8},
     r"attention_chunk \(gpt-oss / Llama 4 .*attention_chunk: llama4_text\)"),
    ({"embed_scale": None, "o_bias": True}, r"o_bias=True \(.*o_bias=True: gpt_oss, llama4_text"),
    ({"embed_scale": None, "sliding_window": 4, "sink_tokens": 2},
     r"sink_tokens=2 \(.*sink_tokens=2: none\)"),
    ({"embed_scale": None, "attn_temperature": {"floor_scale": 8, "attn_scale": 0.1},
      "layer_pattern": [{"temperature": True, "qk_l2_norm": True}]},
     r"qk_l2_norm, attn_temperature \(gpt-oss"),
]


@pytest.mark.parametrize("kwargs,message", REFUSED, ids=[str(k) for k, _ in REFUSED])
def test_inexpressible_models_are_refused_naming_the_part(kwargs, message, tmp_path):
    with pytest.raises(ValueError, match=r"^cannot export this model as a transformers "
                                         r"checkpoint: .*" + message):
        save(tiny(**kwargs), tmp_path / "out")
    assert not (tmp_path / "out").exists()
