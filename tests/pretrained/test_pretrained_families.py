"""The family records (`posenc_jax.pretrained.families`): one record per family, read by the
loader, the GGUF reader and the exporter, and nobody else spelling a family's name.

- the registry: lookups by model_type (aliases too) and by GGUF architecture (Mistral's
  `general.name` rule), errors listing the known names, the export's choice by features;
- per-layer sliding windows of each family's config mapping, layer by layer (Mistral and
  Phi-3: every layer; Qwen2 / Qwen3: layers >= max_window_layers only with use_sliding_window,
  or their layer_types; Gemma 3: its layer_types or the 5-sliding-1-full default), and the
  export writing them so that they read back the same;
- Phi-3's fused tensors: qkv_proj split into q, k, v and gate_up_proj into gate, up on load,
  fused again on export, bit for bit (random tensors, no transformers), partial rotary too;
- the record's hooks: `read_keys` / `write_keys` only as a pair, `expresses` agreeing with
  `sinks` / `attention_bias`; `Row.moe` keeping a dense
  MLP's rows and a MoE layer's (same param names) apart;
- no family name (model_type, GGUF architecture, transformers class) in a string of the
  library outside its record.
"""

import ast
import importlib
import pathlib
import re
import sys

import numpy as np
import pytest
from flax import nnx

from posenc_jax.model.transformer import Transformer, TransformerConfig
from posenc_jax.pretrained import families
from posenc_jax.pretrained.export_config import choose_model_type, hf_config
from posenc_jax.pretrained.gguf_config import hf_config as gguf_hf_config
from posenc_jax.pretrained.loader import build
from posenc_jax.pretrained.names import targets
from posenc_jax.pretrained.safetensors_io import open_safetensors
from posenc_jax.pretrained.save import save

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import pretrained_fakes

ROOT = pathlib.Path(__file__).resolve().parents[2]
S, F = "sliding_attention", "full_attention"


def windows(config: dict) -> tuple | None:
    kwargs = families.config_kwargs({**pretrained_fakes.BASE, **config}, where="test")
    cfg = TransformerConfig(**kwargs)
    return cfg.sliding_window


# ---------------------------------------------------------------- registry

def test_every_model_type_finds_its_record_and_an_unknown_one_lists_them():
    for family in families.FAMILIES:
        for model_type in (family.model_type, *family.aliases):
            assert families.by_model_type(model_type) is family
    known = ", ".join(repr(t) for t in families.model_types())
    assert known.startswith("'llama', 'mistral', 'qwen2', 'qwen3', 'gemma', 'gemma3_text', "
                            "'gemma3', 'phi3'")
    with pytest.raises(ValueError, match=r"^ckpt: unsupported model_type='gpt2'; supported: "
                       + re.escape(known) + "$"):
        families.by_model_type("gpt2", where="ckpt")


def test_gguf_architecture_and_name_choose_the_record():
    def pick(arch, name=None):
        return families.for_gguf({"general.architecture": arch, "general.name": name},
                                 where="f").model_type
    assert [pick("llama"), pick("llama", "mistral"), pick("llama", "Mistral 7B")] == [
        "llama", "mistral", "llama"]
    assert [pick("qwen2"), pick("qwen3"), pick("gemma3")] == ["qwen2", "qwen3", "gemma3_text"]
    with pytest.raises(ValueError, match=r"^f: GGUF general.architecture='gpt2' is not "
                       r"supported \(supported: llama, qwen2, qwen3, gemma3"):
        pick("gpt2")


@pytest.mark.parametrize("kwargs, want", [
    ({"post_norms": True, "embed_scale": "sqrt", "norm_offset": 1.0}, "gemma3_text"),
    ({"embed_scale": "sqrt"}, "gemma"), ({"qkv_bias": True}, "qwen2"),
    ({"qk_norm": True}, "qwen3"), ({"sliding_window": 4}, "mistral"), ({}, "llama")])
def test_export_chooses_the_family_by_features_and_a_named_one_first(kwargs, want):
    cfg = TransformerConfig(vocab_size=8, num_layers=2, embed_dim=8, num_heads=2, mlp_dim=8,
                            **{"embed_scale": None, **kwargs})
    assert choose_model_type(cfg) == want
    assert choose_model_type(cfg, "gemma3") == "gemma3_text"
    assert choose_model_type(cfg, "phi3") == "phi3"
    assert choose_model_type(cfg, "gpt2") == want


# ---------------------------------------------------------------- per-layer windows

QWEN = {"hidden_act": "silu", "num_hidden_layers": 4, "sliding_window": 7,
        "use_sliding_window": True}
GEMMA3 = {"model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh",
          "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 6}
WINDOWS = [
    ("llama", {"model_type": "llama", "hidden_act": "silu", "sliding_window": 5}, None),
    ("mistral", {"model_type": "mistral", "hidden_act": "silu", "sliding_window": 5}, (5, 5)),
    ("mistral-null", {"model_type": "mistral", "hidden_act": "silu", "sliding_window": None},
     None),
    ("mistral-default", {"model_type": "mistral", "hidden_act": "silu"}, (4096, 4096)),
    ("phi3", {"model_type": "phi3", "hidden_act": "silu", "sliding_window": 3}, (3, 3)),
    ("phi3-default", {"model_type": "phi3", "hidden_act": "silu"}, None),
    ("qwen2", {**QWEN, "model_type": "qwen2", "max_window_layers": 2}, (None, None, 7, 7)),
    ("qwen3", {**QWEN, "model_type": "qwen3", "max_window_layers": 1}, (None, 7, 7, 7)),
    ("qwen2-from-0", {**QWEN, "model_type": "qwen2", "max_window_layers": 0}, (7, 7, 7, 7)),
    ("qwen2-off", {**QWEN, "model_type": "qwen2", "use_sliding_window": False,
                   "max_window_layers": 0}, None),
    ("qwen2-no-window", {**QWEN, "model_type": "qwen2", "sliding_window": None,
                         "max_window_layers": 0}, None),
    ("qwen3-class-default", {**QWEN, "model_type": "qwen3"}, None),  # max_window_layers 28
    ("qwen2-layer-types", {**QWEN, "model_type": "qwen2", "max_window_layers": 0,
                           "layer_types": [S, F, F, S]}, (7, None, None, 7)),
    ("gemma3", {**GEMMA3, "num_hidden_layers": 4, "layer_types": [S, F, S, S]},
     (6, None, 6, 6)),
    ("gemma3-full-first", {**GEMMA3, "num_hidden_layers": 3, "layer_types": [F, S, F]},
     (None, 6, None)),
    ("gemma3-default-pattern", {**GEMMA3, "num_hidden_layers": 7},
     (6, 6, 6, 6, 6, None, 6)),
]


@pytest.mark.parametrize("config, want", [(c, w) for _, c, w in WINDOWS],
                         ids=[n for n, _, _ in WINDOWS])
def test_each_layer_gets_the_window_its_family_gives_it(config, want):
    assert windows(config) == want


@pytest.mark.parametrize("config, want", [(c, w) for _, c, w in WINDOWS if w is not None],
                         ids=[n for n, _, w in WINDOWS if w is not None])
def test_exported_windows_read_back_layer_by_layer(config, want):
    cfg = TransformerConfig(**families.config_kwargs({**pretrained_fakes.BASE, **config},
                                                      where="test"))
    out = hf_config(cfg, config["model_type"])
    assert windows(out) == want


def test_gguf_gemma3_layer_types_follow_its_pattern_and_qwen_is_all_full():
    fields = {"general.architecture": "gemma3", "gemma3.block_count": 7,
              "gemma3.embedding_length": 16, "gemma3.attention.head_count": 2,
              "gemma3.feed_forward_length": 32, "gemma3.vocab_size": 40}
    cfg = gguf_hf_config(fields, [], where="f")
    assert cfg["layer_types"] == [S, S, S, S, S, F, S]
    assert cfg["rope_parameters"][S]["rope_theta"] == 10000.0
    qwen = gguf_hf_config({k.replace("gemma3.", "qwen2."): v for k, v in fields.items()}
                          | {"general.architecture": "qwen2"}, [], where="f")
    assert qwen["layer_types"] == [F] * 7 and qwen["use_sliding_window"] is False


# ---------------------------------------------------------------- Phi-3's fused tensors

PHI3 = {"model_type": "phi3", "hidden_act": "silu", "head_dim": 8,
        "original_max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_phi3_fused_tensors_split_on_load_and_fuse_on_export(tmp_path, partial):
    config = {**pretrained_fakes.BASE, **PHI3, "partial_rotary_factor": partial}
    tensors = pretrained_fakes.hf_tensors(config)
    assert "model.layers.0.self_attn.qkv_proj.weight" in tensors
    assert not any("q_proj" in n or "gate_proj" in n for n in tensors)
    d = pretrained_fakes.write(tmp_path / "phi3", config, tensors, shards=2)
    model, cfg, hf = build(open_safetensors(d), attention="dense")
    h, k, dim, f = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    assert cfg.layer_encoding(0).rotary_dim == int(dim * partial)
    qkv = tensors["model.layers.1.self_attn.qkv_proj.weight"]
    for name, rows, n in (("q", slice(0, h * dim), h),
                          ("k", slice(h * dim, (h + k) * dim), k),
                          ("v", slice((h + k) * dim, None), k)):
        np.testing.assert_array_equal(getattr(model.layers[1].attn, f"{name}_proj")[...],
                                      qkv[rows].T.reshape(cfg.embed_dim, n, dim))
    gate_up = tensors["model.layers.0.mlp.gate_up_proj.weight"]
    np.testing.assert_array_equal(model.layers[0].mlp.gate[...], gate_up[:f].T)
    np.testing.assert_array_equal(model.layers[0].mlp.up[...], gate_up[f:].T)

    class Loaded:
        pass
    loaded = Loaded()
    loaded.model, loaded.hf_config, loaded.tokenizer = model, hf, None
    save(loaded, tmp_path / "out")
    back = open_safetensors(tmp_path / "out")
    assert sorted(back.names()) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(back.tensor(name), value, err_msg=name)
    _, cfg_again, _ = build(back, attention="dense")
    assert cfg_again == cfg


def test_a_model_trained_here_is_refused_partial_rotary_outside_phi3(tmp_path):
    model = Transformer(TransformerConfig(vocab_size=8, num_layers=1, embed_dim=16,
                                          num_heads=2, mlp_dim=8,
                                          encoding_kwargs={"rotary_dim": 4}),
                        rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"rotary_dim=4 < head_dim=8 \(partial rotary\): this "
                       r"family rotates the whole head \(those that rotate part: phi3\)"):
        save(model, tmp_path / "out", model_type="llama")


# ---------------------------------------------------------------- names only in the records

def _family_names() -> set[str]:
    names = set()
    for f in families.FAMILIES:
        names |= {f.model_type, *f.aliases, f.export_class}
        if f.gguf is not None:
            names |= {f.gguf.arch} | ({f.gguf.name} if f.gguf.name else set())
    return names


#: Files outside the records allowed to spell a family's name, and why.
ALLOWED = {
    "posenc_jax/encodings/hf/families.py": "floor 1's RoPE table per model_type (25 types, "
    "MLA and MRoPE included, read without loading a model); it cannot import the records",
    "posenc_jax/encodings/hf/read.py": "the same RoPE reader (Gemma 3's per-layer RoPE)",
    "posenc_jax/encodings/hf/rotate.py": "the same RoPE reader's messages",
    "posenc_jax/pretrained/gguf_tokenizer.py": "llama.cpp's tokenizer kinds "
    "(tokenizer.ggml.model / .pre), not model families",
}


def _strings(path: pathlib.Path):
    """(line, text) of every string constant that is not a docstring."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                id(node) not in docs):
            yield node.lineno, node.value


#: The modules of `posenc_jax.pretrained.families` that are not a family's record.
MACHINERY = ("__init__", "record", "transforms", "registry", "mapping", "moe_keys")


def _record_modules() -> list[str]:
    folder = ROOT / "posenc_jax" / "pretrained" / "families"
    return sorted(p.stem for p in folder.glob("*.py") if p.stem not in MACHINERY)


@pytest.mark.parametrize("fields,message", [
    ({"read_keys": lambda flat, out, where: None},
     r"read_keys and write_keys come as a pair \(an export must write back what a load reads\)"),
    ({"sinks": True}, r"sinks=True but 'sinks' not in expresses"),
    ({"expresses": frozenset({"o_bias"})}, r"attention_bias=False but 'o_bias' in expresses"),
])
def test_a_record_whose_hooks_disagree_is_refused(fields, message):
    with pytest.raises(ValueError, match=r"^Family mine: " + message):
        families.Family(model_type="mine", defaults={}, hf_tensors=(), export_class="Mine",
                        **fields)


def test_dense_rows_and_moe_rows_claim_only_their_own_layers():
    cfg = TransformerConfig(vocab_size=32, num_layers=2, embed_dim=16, num_heads=2, mlp_dim=32,
                            qk_norm=True, num_experts=4, experts_per_token=2, moe_mlp_dim=8,
                            moe_layers=(1,))
    plan = targets(cfg, families.by_model_type("qwen3_moe"))
    mlp = {n: t.hf_shape for n, t in plan.items() if ".mlp." in n}
    assert mlp == {
        "model.layers.0.mlp.gate_proj.weight": (32, 16),
        "model.layers.0.mlp.up_proj.weight": (32, 16),
        "model.layers.0.mlp.down_proj.weight": (16, 32),
        "model.layers.1.mlp.gate.weight": (4, 16),
        "model.layers.1.mlp.experts.*.gate_proj.weight": (4, 8, 16),
        "model.layers.1.mlp.experts.*.up_proj.weight": (4, 8, 16),
        "model.layers.1.mlp.experts.*.down_proj.weight": (4, 16, 8)}
    dense = targets(cfg, families.by_model_type("llama"))  # its MLP rows: dense layers only
    assert sorted(n for n in dense if ".mlp." in n) == sorted(n for n in mlp if ".0." in n)


def test_every_record_module_is_registered_once():
    found = [importlib.import_module(f"posenc_jax.pretrained.families.{m}").FAMILY
             for m in _record_modules()]
    assert sorted(f.model_type for f in found) == sorted(
        f.model_type for f in families.FAMILIES)
    assert all(any(f is g for g in families.FAMILIES) for f in found)


def test_no_family_name_outside_its_record():
    names = sorted(_family_names(), key=len, reverse=True)
    # "llama.cpp" (the program) is not the llama family
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b(?!\.cpp)")
    records = {f"posenc_jax/pretrained/families/{m}.py" for m in _record_modules()}
    found = []
    for folder in ("posenc_jax", "train"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in records or rel in ALLOWED:
                continue
            found += [f"{rel}:{line}: {text!r}" for line, text in _strings(path)
                      if pattern.search(text) and "tests/data/" not in text]  # a fixture path
    assert not found, "family names outside the records:\n" + "\n".join(found)
    assert set(ALLOWED) <= {p.relative_to(ROOT).as_posix()
                            for p in (ROOT / "posenc_jax").rglob("*.py")}
