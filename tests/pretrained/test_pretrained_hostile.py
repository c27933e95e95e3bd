"""Hostile checkpoints, GGUF files and tokenizers (issue 34): each row a file that lies about
itself or a call that cannot work, and the exact words of the error it must give.

The classes, not only the examples: every tensor of either format floating point and finite
(`tensor_values`); every GGUF metadata key we read of the type the spec gives it, and in range
(`gguf_metadata`); a tensor or key named twice refused; a tokenizer's metadata checked when it
is built (merges, special ids, token count against the embedding); Hugging Face config values
typed; `save` refusing a path it would misuse. Files are written here from scratch (a 1-block
llama: E=32, 4 heads, 2 kv heads, D=8, a 257-token byte-level vocabulary).
"""

from __future__ import annotations

import json
import pathlib
import struct
import sys

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import GGUFValueType as T

from posenc_jax import pretrained
from posenc_jax.encodings import hf_config as enc_hf
from posenc_jax.pretrained import gguf_tokenizer
from posenc_jax.pretrained.safetensors_io import open_safetensors
from posenc_jax.pretrained.tokenizer import Tokenizer

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import pretrained_fakes  # noqa: E402

E, F, H, KV, D = 32, 64, 4, 2, 8
TOKENS = [*gguf_tokenizer.byte_alphabet().values(), "ab"]  # 257: bytes, then one merge
V = len(TOKENS)
NORM = "model.norm.weight"


def _weights(vocab: int = V) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = {"token_embd": (vocab, E), "output_norm": (E,), "blk.0.attn_norm": (E,),
              "blk.0.attn_q": (H * D, E), "blk.0.attn_k": (KV * D, E),
              "blk.0.attn_v": (KV * D, E), "blk.0.attn_output": (E, H * D),
              "blk.0.ffn_norm": (E,), "blk.0.ffn_gate": (F, E), "blk.0.ffn_up": (F, E),
              "blk.0.ffn_down": (E, F)}
    return {f"{k}.weight": rng.normal(0, 0.3, s).astype(np.float32) for k, s in shapes.items()}


def write_gguf(path: pathlib.Path, *, kv: dict | None = None, tensors: dict | None = None,
               tokens: list[str] = TOKENS, vocab: int = V,
               rename: tuple[bytes, bytes] | None = None) -> pathlib.Path:
    """A 1-block llama GGUF. `kv`: key -> (value, GGUFValueType) added or replacing the
    defaults, or None to leave a default key out; `tensors`: GGUF name -> array replacing
    one; `rename`: (old, new) bytes of equal length patched into the written file."""
    keys = {"general.name": ("tiny", T.STRING), "llama.block_count": (1, T.UINT32),
            "llama.context_length": (128, T.UINT32), "llama.embedding_length": (E, T.UINT32),
            "llama.feed_forward_length": (F, T.UINT32),
            "llama.attention.head_count": (H, T.UINT32),
            "llama.attention.head_count_kv": (KV, T.UINT32),
            "llama.attention.layer_norm_rms_epsilon": (1e-5, T.FLOAT32),
            "llama.rope.freq_base": (10000.0, T.FLOAT32), "llama.vocab_size": (vocab, T.UINT32),
            "llama.rope.dimension_count": (D, T.UINT32),
            "tokenizer.ggml.model": ("gpt2", T.STRING),
            "tokenizer.ggml.tokens": (tokens, T.ARRAY),
            "tokenizer.ggml.merges": (["a b"], T.ARRAY),
            "tokenizer.ggml.bos_token_id": (1, T.UINT32),
            "tokenizer.ggml.eos_token_id": (2, T.UINT32)}
    keys.update(kv or {})
    w = gguf.GGUFWriter(str(path), "llama")
    for key, entry in keys.items():
        if entry is not None:
            value, vtype = entry
            sub = {str: T.STRING, int: T.INT32, float: T.FLOAT32}.get(type(value[0])) if (
                vtype == T.ARRAY) else None
            w.add_key_value(key, value, vtype, sub_type=sub)
    for name, value in {**_weights(vocab), **(tensors or {})}.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if rename is not None:
        raw = path.read_bytes()
        assert raw.count(rename[0]) == 1 and len(rename[0]) == len(rename[1])
        path.write_bytes(raw.replace(*rename))
    return path


def write_safetensors_raw(path: pathlib.Path, tensors: dict[str, tuple[str, np.ndarray]]):
    """A safetensors file written byte by byte: name -> (dtype code, array), so any dtype
    (float8, bool) can be written."""
    header, blobs, offset = {}, [], 0
    for name, (code, array) in tensors.items():
        blob = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": code, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def hf_dir(tmp: pathlib.Path, *, config: dict | None = None, norm=None, code: str = "F32",
           index: dict | None = None) -> pathlib.Path:
    """A tiny llama directory; `norm` replaces model.norm.weight (written with dtype `code`)."""
    cfg = pretrained_fakes.hf_config("llama", **(config or {}))
    tensors = pretrained_fakes.hf_tensors(pretrained_fakes.hf_config("llama"))
    d = pretrained_fakes.write(tmp / "ckpt", cfg, tensors)
    if norm is not None:
        rows = {n: ("F32", v) for n, v in tensors.items()}
        rows[NORM] = (code, norm)
        write_safetensors_raw(d / "model.safetensors", rows)
    if index is not None:
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d


def norm_like(fill=None, dtype=np.float32) -> np.ndarray:
    value = np.ones(32, dtype=np.float32)
    if fill is not None:
        value[3] = fill
    return value.astype(dtype)


def load_gguf(tmp, **kw):
    return pretrained.load(write_gguf(tmp / "m.gguf", **kw))


def gguf_tokenizer_of(tmp, **kw):
    return Tokenizer.from_gguf(write_gguf(tmp / "t.gguf", **kw))


def loaded(tmp):
    cfg = pretrained_fakes.hf_config("llama")
    d = pretrained_fakes.write(tmp / "src", cfg, pretrained_fakes.hf_tensors(cfg))
    return pretrained.load(d)


def _f8():
    return norm_like(2.0).astype(ml_dtypes.float8_e4m3fn)


G = "(GGUF 'output_norm.weight')"
ROWS = [
    # -- tensor values and dtypes: one rule for both formats (tensor_values) --------------
    ("st-nan", lambda t: pretrained.load(hf_dir(t, norm=norm_like(np.nan))), ValueError,
     ["model.safetensors: tensor 'model.norm.weight': holds 1 non-finite values (1 NaN, "
      "0 infinite) of 32; a checkpoint's weights must be finite"]),
    ("st-inf", lambda t: pretrained.load(hf_dir(t, norm=norm_like(-np.inf))), ValueError,
     ["tensor 'model.norm.weight': holds 1 non-finite values (0 NaN, 1 infinite)"]),
    ("st-int", lambda t: pretrained.load(hf_dir(t, norm=norm_like(dtype=np.int32),
                                                code="I32")), ValueError,
     ["model.safetensors: tensor 'model.norm.weight': dtype I32 is not a floating-point "
      "type; weights must be one of F64, F32, F16, BF16, F8_E4M3, F8_E5M2"]),
    ("st-bool", lambda t: pretrained.load(hf_dir(t, norm=norm_like(dtype=np.bool_),
                                                 code="BOOL")), ValueError,
     ["tensor 'model.norm.weight': dtype BOOL is not a floating-point type"]),
    ("st-unknown-dtype", lambda t: open_safetensors(hf_dir(
        t, norm=norm_like(dtype=np.uint8), code="F8_E8M0")).tensor(NORM), ValueError,
     ["tensor 'model.norm.weight': dtype F8_E8M0 is a floating-point type this reader does "
      "not read; weights must be one of F64, F32, F16, BF16, F8_E4M3, F8_E5M2"]),
    ("st-f8-nan", lambda t: open_safetensors(hf_dir(
        t, norm=norm_like(np.nan).astype(ml_dtypes.float8_e4m3fn), code="F8_E4M3")).tensor(
        NORM), ValueError, ["tensor 'model.norm.weight': holds 1 non-finite values (1 NaN"]),
    ("gguf-nan", lambda t: load_gguf(t, tensors={"output_norm.weight": norm_like(np.nan)}),
     ValueError, [f"tensor 'model.norm.weight' {G}: holds 1 non-finite values (1 NaN"]),
    ("gguf-int", lambda t: load_gguf(t, tensors={"output_norm.weight": norm_like(
        dtype=np.int32)}), ValueError,
     ["m.gguf: tensor 'model.norm.weight': has integer GGUF type I32; weights must be "
      "floating point (F32, F16, BF16 or a quantised type)"]),
    # -- the GGUF container: names and alignment -----------------------------------------
    ("gguf-duplicate-tensor", lambda t: load_gguf(t, rename=(b"blk.0.attn_k.weight",
                                                           b"blk.0.attn_q.weight")),
     ValueError, ["m.gguf: tensor 'blk.0.attn_q.weight' appears twice in the tensor table "
                  "(a GGUF file names each tensor once)"]),
    ("gguf-duplicate-key", lambda t: load_gguf(t, kv={"general.namf": ("x", T.STRING)},
                                               rename=(b"general.namf", b"general.name")),
     ValueError, ["m.gguf: metadata key 'general.name' appears twice (corrupt file?)"]),
    ("gguf-alignment-zero", lambda t: load_gguf(t, kv={"general.alignment": (0, T.UINT32)}),
     ValueError, ["metadata 'general.alignment' must be a power of two >= 1 (the GGUF spec; "
                  "32 when absent), got 0"]),
    ("gguf-alignment-odd", lambda t: load_gguf(t, kv={"general.alignment": (24, T.UINT32)}),
     ValueError, ["'general.alignment' must be a power of two", "got 24"]),
    # -- GGUF metadata: types and ranges (gguf_metadata) ---------------------------------
    ("gguf-head-count-zero", lambda t: load_gguf(t, kv={
        "llama.attention.head_count": (0, T.UINT32)}), ValueError,
     ["m.gguf: GGUF metadata 'llama.attention.head_count' = 0 is out of range, expected an "
      "integer type (uint32) >= 1"]),
    ("gguf-head-count-str", lambda t: load_gguf(t, kv={
        "llama.attention.head_count": ("4", T.STRING)}), ValueError,
     ["GGUF metadata 'llama.attention.head_count' is string ('4'), expected an integer type "
      "(uint32) >= 1 (the GGUF spec; llama.cpp refuses it too)"]),
    ("gguf-embedding-float", lambda t: load_gguf(t, kv={
        "llama.embedding_length": (32.0, T.FLOAT32)}), ValueError,
     ["GGUF metadata 'llama.embedding_length' is float32 (32.0), expected an integer type"]),
    ("gguf-freq-base-str", lambda t: load_gguf(t, kv={
        "llama.rope.freq_base": ("1e4", T.STRING)}), ValueError,
     ["GGUF metadata 'llama.rope.freq_base' is string ('1e4'), expected float32, finite "
      "and > 0"]),
    ("gguf-freq-base-negative", lambda t: load_gguf(t, kv={
        "llama.rope.freq_base": (-1.0, T.FLOAT32)}), ValueError,
     ["'llama.rope.freq_base' = -1.0 is out of range, expected float32, finite and > 0"]),
    ("gguf-eps-inf", lambda t: load_gguf(t, kv={
        "llama.attention.layer_norm_rms_epsilon": (np.inf, T.FLOAT32)}), ValueError,
     ["'llama.attention.layer_norm_rms_epsilon' = inf is out of range"]),
    ("gguf-token-types-strings", lambda t: load_gguf(t, kv={
        "tokenizer.ggml.token_type": (["x"] * V, T.ARRAY)}), ValueError,
     ["GGUF metadata 'tokenizer.ggml.token_type' is array[string] (257 entries), expected "
      "an array of integers (array[int32])"]),
    ("gguf-eos-negative", lambda t: load_gguf(t, kv={
        "tokenizer.ggml.eos_token_id": (-1, T.INT32)}), ValueError,
     ["GGUF metadata 'tokenizer.ggml.eos_token_id' = -1 is out of range, expected an "
      "integer type (uint32), a token id >= 0"]),
    ("gguf-add-bos-str", lambda t: load_gguf(t, kv={
        "tokenizer.ggml.add_bos_token": ("yes", T.STRING)}), ValueError,
     ["'tokenizer.ggml.add_bos_token' is string ('yes'), expected bool"]),
    # -- the tokenizer, checked when it is built -----------------------------------------
    ("tok-no-merges", lambda t: gguf_tokenizer_of(t, kv={"tokenizer.ggml.merges": None}),
     ValueError, ["t.gguf: tokenizer.ggml.model='gpt2' (byte-level BPE) needs "
                  "tokenizer.ggml.merges, which the file lacks or leaves empty"]),
    ("tok-merge-not-a-pair", lambda t: gguf_tokenizer_of(t, kv={
        "tokenizer.ggml.merges": (["a b c"], T.ARRAY)}), ValueError,
     ["tokenizer.ggml.merges holds 'a b c', not two tokens joined by one space"]),
    ("tok-merge-outside-vocab", lambda t: gguf_tokenizer_of(t, kv={
        "tokenizer.ggml.merges": (["a zz"], T.ARRAY)}), ValueError,
     ["t.gguf: tokenizer.ggml.merges do not fit tokenizer.ggml.tokens ("]),
    ("tok-bos-past-vocab", lambda t: gguf_tokenizer_of(t, kv={
        "tokenizer.ggml.bos_token_id": (10**9, T.UINT32),
        "tokenizer.ggml.add_bos_token": (True, T.BOOL)}), ValueError,
     ["t.gguf: tokenizer.ggml.bos_token_id = 1000000000 is outside the vocabulary "
      "[0, 257) of tokenizer.ggml.tokens"]),
    ("tok-bos-past-vocab-no-add", lambda t: gguf_tokenizer_of(t, kv={
        "tokenizer.ggml.bos_token_id": (10**9, T.UINT32)}), ValueError,
     ["tokenizer.ggml.bos_token_id = 1000000000 is outside the vocabulary"]),
    ("tok-eos-past-vocab", lambda t: gguf_tokenizer_of(t, kv={
        "tokenizer.ggml.eos_token_id": (V, T.UINT32)}), ValueError,
     ["tokenizer.ggml.eos_token_id = 257 is outside the vocabulary [0, 257)"]),
    ("tok-fewer-tokens-than-rows", lambda t: load_gguf(t, tokens=TOKENS[:250]), ValueError,
     ["m.gguf: tokenizer.ggml.tokens has 250 tokens but the embedding has 257 rows: ids "
      "250..256 would have no text (llama.cpp needs one token per row)"]),
    ("tok-types-length", lambda t: gguf_tokenizer_of(t, kv={
        "tokenizer.ggml.token_type": ([1, 1], T.ARRAY)}), ValueError,
     ["tokenizer.ggml.token_type has 2 entries, tokenizer.ggml.tokens 257: one type per "
      "token"]),
    ("tok-decode-float", lambda t: gguf_tokenizer_of(t).decode([1.5]), TypeError,
     ["decode: ids must be ints (token ids), got 1.5 (float) in ids"]),
    ("tok-decode-str", lambda t: gguf_tokenizer_of(t).decode(["3"]), TypeError,
     ["decode: ids must be ints (token ids), got '3' (str) in ids"]),
    ("tok-decode-bool", lambda t: gguf_tokenizer_of(t).decode([True]), TypeError,
     ["got True (bool) in ids"]),
    ("tok-decode-float-array", lambda t: gguf_tokenizer_of(t).decode(np.asarray([1.0])),
     TypeError, ["got 1.0 (float) in ids"]),
    # -- Hugging Face config values and the shard index ----------------------------------
    ("hf-tie-str", lambda t: pretrained.load(hf_dir(t, config={"tie_word_embeddings": "no"})),
     TypeError, ["config.json tie_word_embeddings must be true or false, got 'no' (str)"]),
    ("hf-tie-int", lambda t: pretrained.load(hf_dir(t, config={"tie_word_embeddings": 0})),
     TypeError, ["tie_word_embeddings must be true or false, got 0 (int)"]),
    ("hf-kv-heads-zero", lambda t: pretrained.load(hf_dir(t, config={
        "num_key_value_heads": 0})), ValueError,
     ["num_key_value_heads must be >= 1, got num_key_value_heads=0"]),
    ("hf-weight-map-int", lambda t: open_safetensors(hf_dir(t, index={
        "weight_map": {NORM: 3}})), ValueError,
     ["model.safetensors.index.json: weight_map['model.norm.weight'] must be a file name "
      "(a non-empty str), got 3 (int)"]),
    # -- save ----------------------------------------------------------------------------
    ("save-empty-dir", lambda t: pretrained.save(loaded(t), ""), ValueError,
     ["save: directory must be a non-empty path, got directory='' (it would write into the "
      "current directory; pass '.' to mean that)"]),
    ("save-dir-is-file", lambda t: (t / "f").write_text("x") and pretrained.save(
        loaded(t), t / "f"), ValueError, ["save: directory=", "is a file, not a directory"]),
    ("save-tokenizer-missing", lambda t: pretrained.save(loaded(t), t / "out",
                                                          tokenizer="/nonexistent"),
     ValueError, ["save: tokenizer='/nonexistent' is not a directory (give a directory "
                  "holding tokenizer.json / tokenizer_config.json, or a Tokenizer); nothing "
                  "written"]),
]

@pytest.mark.parametrize(("call", "exc", "words"), [r[1:] for r in ROWS],
                         ids=[r[0] for r in ROWS])
def test_refused_by_name(call, exc, words, tmp_path):
    with pytest.raises(exc) as info:
        call(tmp_path)
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"message lacks {missing}: {message!r}"
    assert words, "a row must assert words of its message"


def test_nothing_is_written_when_save_refuses(tmp_path):
    lm = loaded(tmp_path)
    with pytest.raises(ValueError):
        pretrained.save(lm, tmp_path / "out", tokenizer="/nonexistent")
    assert not (tmp_path / "out").exists()


def test_float8_and_bfloat16_checkpoints_load_through_ml_dtypes(tmp_path):
    """float8 (numpy has no type for it: safetensors' numpy reader crashed) is read from the
    file's bytes; the values are the float8 ones, upcast exactly."""
    for code, value in (("F8_E4M3", _f8()), ("F8_E5M2", norm_like(-3.0).astype(
            ml_dtypes.float8_e5m2)), ("BF16", norm_like(0.125).astype(ml_dtypes.bfloat16))):
        d = hf_dir(tmp_path / code, norm=value, code=code)
        got = open_safetensors(d).tensor(NORM)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, value.astype(np.float32))
    lm = pretrained.load(hf_dir(tmp_path / "load", norm=_f8(), code="F8_E4M3"))
    np.testing.assert_array_equal(np.asarray(lm.model.final_norm.scale[...]),
                                  _f8().astype(np.float32))


def test_real_kinds_of_metadata_pass(tmp_path):
    """What llama.cpp writes passes: the tiny file loads, its tokenizer merges "a b", and a
    special id at the last token is inside the vocabulary."""
    lm = load_gguf(tmp_path, kv={"tokenizer.ggml.eos_token_id": (V - 1, T.UINT32)})
    assert lm.tokenizer.encode("ab") == [V - 1]
    assert lm.tokenizer.decode(np.asarray([V - 1])) == "ab"


def test_yarn_original_above_max_warns_as_transformers_does():
    """transformers 5.24 warns (`_validate_yarn_rope_parameters`: the explicit factor differs
    from max_position_embeddings / original_max_position_embeddings) and uses the explicit
    factor; so does this, naming both lengths."""
    config = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128,
              "rope_theta": 1e4, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 256}}
    with pytest.warns(UserWarning, match=r"yarn: factor=4.0 but max_position_embeddings / "
                                         r"original_max_position_embeddings = 128 / 256 = 0.5; "
                                         r"original_max_position_embeddings=256 is above "
                                         r"max_position_embeddings=128; the explicit factor "
                                         r"is used, as transformers does"):
        kwargs = enc_hf.rope_kwargs_from_hf_config(config)
    assert kwargs["scaling"]["factor"] == 4.0
    assert kwargs["scaling"]["original_max_position_embeddings"] == 256
