"""posenc_jax.pretrained.gguf: GGUF files read as Hugging Face checkpoints.

Tiny GGUF files written here with gguf.GGUFWriter (always run): the config built from the
metadata, q/k rows un-permuted (against llama.cpp's permutation done here in NumPy), Gemma norms
minus 1, quantised tensors equal to gguf's own dequantisation, and every way a file can be
wrong. The real SmolLM2 / Gemma 3 files (scripts/fetch_pretrained.sh, $POSENC_PRETRAINED_DIR):
config and tensors against what transformers 5.24 built (tests/data/pretrained/*.json, *.npz).
"""

from __future__ import annotations

import json
import os
import pathlib

import gguf
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc_jax.pretrained import gguf as pgguf

DATA = pathlib.Path(__file__).parents[1] / "data" / "pretrained"
REAL_DIR = pathlib.Path(os.environ.get("POSENC_PRETRAINED_DIR",
                                       pathlib.Path(__file__).parents[2] / ".pretrained"))
REAL = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
E, F, H, KV, D, V = 32, 64, 4, 2, 8, 64


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf order for q/k rows: per head [2, d/2] -> [d/2, 2]."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def hf_weights(arch: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    hd = 16 if arch == "gemma3" else D
    w = {"model.embed_tokens.weight": rng.normal(size=(V, E)),
         "model.norm.weight": rng.normal(size=E),
         "model.layers.0.input_layernorm.weight": rng.normal(size=E),
         "model.layers.0.self_attn.q_proj.weight": rng.normal(size=(H * hd, E)),
         "model.layers.0.self_attn.k_proj.weight": rng.normal(size=(KV * hd, E)),
         "model.layers.0.self_attn.v_proj.weight": rng.normal(size=(KV * hd, E)),
         "model.layers.0.self_attn.o_proj.weight": rng.normal(size=(E, H * hd)),
         "model.layers.0.post_attention_layernorm.weight": rng.normal(size=E),
         "model.layers.0.mlp.gate_proj.weight": rng.normal(size=(F, E)),
         "model.layers.0.mlp.up_proj.weight": rng.normal(size=(F, E)),
         "model.layers.0.mlp.down_proj.weight": rng.normal(size=(E, F))}
    if arch == "gemma3":
        for n in ("self_attn.q_norm", "self_attn.k_norm"):
            w[f"model.layers.0.{n}.weight"] = rng.normal(size=hd)
        for n in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
            w[f"model.layers.0.{n}.weight"] = rng.normal(size=E)
    return {k: v.astype(np.float32) for k, v in w.items()}


GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
              "output_norm.weight", "lm_head.weight": "output.weight"}
BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj":
         "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def to_gguf_name(hf: str, arch: str) -> str:
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    part = hf.removeprefix("model.layers.0.").removesuffix(".weight")
    block = dict(BLOCK, post_attention_layernorm="ffn_norm")
    if arch == "gemma3":
        block.update(post_attention_layernorm="post_attention_norm",
                     pre_feedforward_layernorm="ffn_norm",
                     post_feedforward_layernorm="post_ffw_norm")
    return f"blk.0.{block[part]}.weight"


def write_tiny(path: pathlib.Path, arch: str = "llama", *, quantize: tuple[str, ...] = (),
               extra: dict | None = None, untied: bool = False) -> dict[str, np.ndarray]:
    """A 1-block GGUF of `arch` from hf_weights; returns the HF weights it encodes."""
    hf = hf_weights(arch)
    if untied:
        hf["lm_head.weight"] = np.random.default_rng(9).normal(size=(V, E)).astype(np.float32)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(50000.0)
    if arch == "llama":
        w.add_rope_dimension_count(D)
    if arch == "gemma3":
        w.add_key_length(16)
        w.add_value_length(16)
        w.add_sliding_window(8)
    w.add_token_list([f"t{i}" for i in range(V)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for key, value in (extra or {}).items():
        w.add_string(key, value)
    for name, value in hf.items():
        stored = value
        if arch == "llama" and ".q_proj" in name:
            stored = llama_cpp_permute(value, H)
        elif arch == "llama" and ".k_proj" in name:
            stored = llama_cpp_permute(value, KV)
        if arch == "gemma3" and name.endswith("norm.weight"):
            stored = value + np.float32(1.0)
        if name in quantize:
            q = gguf.quants.quantize(stored, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(to_gguf_name(name, arch), q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(to_gguf_name(name, arch), stored)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


@given(heads=st.integers(1, 4), half=st.integers(1, 6), cols=st.integers(1, 3))
def test_unpermute_inverts_llama_cpp_permutation(heads, half, cols):
    w = np.arange(heads * 2 * half * cols, dtype=np.float32).reshape(heads * 2 * half, cols)
    np.testing.assert_array_equal(pgguf._unpermute_rows(llama_cpp_permute(w, heads), heads), w)


def test_tiny_llama_config_and_tensors(tmp_path):
    path = tmp_path / "tiny.gguf"
    hf = write_tiny(path, quantize=("model.layers.0.mlp.up_proj.weight",))
    ckpt = pgguf.open_gguf(path)
    cfg = ckpt.config
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is True
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (E, F, 1)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (H, KV, D)
    assert cfg["rope_parameters"] == {"rope_theta": 50000.0, "rope_type": "default"}
    assert cfg["rms_norm_eps"] == float(np.float32(1e-5)) and cfg["vocab_size"] == V
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["max_position_embeddings"]) == (1, 2, 128)
    assert sorted(ckpt.names()) == sorted(hf)
    for name, want in hf.items():
        assert ckpt.shape(name) == want.shape
        got = ckpt.tensor(name)
        assert got.dtype == np.float32 and got.shape == want.shape, name
        if name.endswith("up_proj.weight"):  # Q8_0: gguf's own round trip, then close
            q = gguf.quants.quantize(want, gguf.GGMLQuantizationType.Q8_0)
            np.testing.assert_array_equal(
                got, gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0))
            np.testing.assert_allclose(got, want, atol=np.abs(want).max() / 100)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)


def test_tiny_gemma3_norms_minus_one_and_config(tmp_path):
    path = tmp_path / "g.gguf"
    hf = write_tiny(path, "gemma3", untied=True)
    ckpt = pgguf.open_gguf(path)
    cfg = ckpt.config
    assert cfg["model_type"] == "gemma3_text" and cfg["tie_word_embeddings"] is False
    assert cfg["head_dim"] == 16 and cfg["sliding_window"] == 8
    assert cfg["rope_parameters"] == {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 50000.0}}
    assert cfg["layer_types"] == ["sliding_attention"]
    assert cfg["query_pre_attn_scalar"] == 256 and cfg["hidden_activation"] == "gelu_pytorch_tanh"
    assert sorted(ckpt.names()) == sorted(hf)
    for name, want in hf.items():  # q/k not permuted for gemma3; every *norm back to w
        np.testing.assert_allclose(ckpt.tensor(name), want, rtol=0, atol=1e-6, err_msg=name)


def test_errors_name_the_file_and_tensor(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny(path)
    raw = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(raw[:-100])
    with pytest.raises(ValueError, match=r"cut\.gguf: tensor '[a-z_.0-9]+' ends at byte .*"
                                         r"truncated"):
        pgguf.open_gguf(cut)
    cut.write_bytes(raw[:200])
    with pytest.raises(ValueError, match=r"cut\.gguf: .*(truncated|past the end)"):
        pgguf.open_gguf(cut)
    other = tmp_path / "notgguf.gguf"
    other.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(ValueError, match=r"notgguf\.gguf: not a GGUF file"):
        pgguf.open_gguf(other)
    with pytest.raises(FileNotFoundError, match="nothere.gguf"):
        pgguf.open_gguf(tmp_path / "nothere.gguf")
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got int"):
        pgguf.open_gguf(3)
    with pytest.raises(KeyError, match=r"tiny\.gguf: no tensor 'lm_head\.weight'"):
        pgguf.open_gguf(path).tensor("lm_head.weight")


def test_corrupt_tensor_and_unsupported_arch(tmp_path):
    path = tmp_path / "nan.gguf"
    write_tiny(path)
    raw = bytearray(path.read_bytes())
    raw[-4:] = np.float32(np.nan).tobytes()  # the last tensor's last value
    path.write_bytes(bytes(raw))
    ckpt = pgguf.open_gguf(path)
    last = ckpt.names()[-1]
    with pytest.raises(ValueError, match=rf"nan\.gguf: tensor '{last}' .*1 non-finite"):
        ckpt.tensor(last)
    bad = tmp_path / "bloom.gguf"
    w = gguf.GGUFWriter(str(bad), "bloom")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"bloom\.gguf: GGUF general.architecture='bloom' is "
                                         r"not supported \(supported: llama, qwen2"):
        pgguf.open_gguf(bad)


def test_unknown_tensor_name_is_an_error(tmp_path):
    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for fn, v in ((w.add_block_count, 1), (w.add_embedding_length, 4), (w.add_head_count, 1),
                  (w.add_feed_forward_length, 8), (w.add_vocab_size, 3)):
        fn(v)
    w.add_tensor("blk.0.mystery.weight", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"odd\.gguf: tensor 'blk\.0\.mystery\.weight': no "
                                         r"Hugging Face llama parameter"):
        pgguf.open_gguf(path)


def real_path(key: str) -> pathlib.Path:
    path = REAL_DIR / REAL[key]
    if not path.is_file():
        pytest.skip(f"{path} absent: run `bash scripts/fetch_pretrained.sh {REAL_DIR}`")
    return path


# Keys transformers adds to a loaded model's config that no config.json built from the file has.
LOAD_ONLY = ("dtype", "quantization_config")


@pytest.mark.parametrize("key,layers", [("smollm2", (0, 29)), ("gemma3", (0, 5))])
def test_real_model_matches_transformers(key, layers):
    ckpt = pgguf.open_gguf(real_path(key))
    meta = json.loads((DATA / f"{key}.json").read_text())
    gold = np.load(DATA / f"{key}.npz")
    want = {k: v for k, v in meta["config"].items() if k not in LOAD_ONLY}
    assert ckpt.config == want
    assert sorted(ckpt.names()) == sorted(meta["tensor_names"])
    prefixes = ("model.norm", "model.embed_tokens") + tuple(f"model.layers.{i}." for i in layers)
    checked = 0
    for i, name in enumerate(meta["tensor_names"]):
        if not name.startswith(prefixes):
            continue
        w = ckpt.tensor(name).astype(np.float64).reshape(-1)
        idx = np.round(np.linspace(0, w.size - 1, meta["sample_count"])).astype(np.int64)
        np.testing.assert_array_equal(w[idx].astype(np.float32), gold["tensor_samples"][i],
                                      err_msg=name)
        np.testing.assert_allclose(w.sum(), gold["tensor_sum"][i], rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose((w * w).sum(), gold["tensor_sumsq"][i], rtol=1e-9)
        checked += 1
    assert checked >= 2 * 9 + 2


def test_real_file_truncated_header(tmp_path):
    src = real_path("gemma3")
    cut = tmp_path / "gemma-cut.gguf"
    with open(src, "rb") as f:
        cut.write_bytes(f.read(1_000_000))  # inside the 262,144-token vocabulary
    with pytest.raises(ValueError, match=r"gemma-cut\.gguf: .*(truncated|past the end)"):
        pgguf.open_gguf(cut)
