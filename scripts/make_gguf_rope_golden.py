"""Writes tests/data/pretrained/gguf_rope/: a tiny Llama 3.1-style model as safetensors and as GGUF.

Run in the throwaway venv (torch + transformers 5.24 + gguf + accelerate), from the repository
root:  /work/goldenvenv/bin/python scripts/make_gguf_rope_golden.py

* twin/: a random 2-layer Llama (head dim 16, rope_theta 50) saved by transformers with
  `rope_parameters: {rope_type: llama3, factor 8, low_freq_factor 1, high_freq_factor 4,
  original_max_position_embeddings 32}`; every weight rounded to float16 values first, so the
  GGUF files (F16 matrices, F32 vectors) hold exactly the same numbers. With base 50 and
  L0 = 32 the 8 frequencies fall in all three llama3 bands (wavelengths 6.3 | 10.3 16.7 27.3 |
  44.6 ... 194), and the 64 tokens go to twice L0, so the factors move every logit.
* llama31.gguf: what llama.cpp's convert_hf_to_gguf.py writes for it: q/k rows permuted, no
  `rope.scaling.*` key, and the tensor `rope_freqs.weight` [8] float32 made by llama.cpp's
  `LlamaModel.generate_extra_tensors` formula (float32 torch frequencies, Python-float
  arithmetic; with L0 read from the rope parameters, where llama.cpp reads a top-level key and
  falls back to 8192). yarn.gguf / linear.gguf: the same weights, no rope_freqs, with
  `rope.scaling.type` yarn (factor 8 = 256 / 32, original_context_length 32, beta_fast 32,
  beta_slow 1) / linear (factor 4), as convert_hf_to_gguf.py writes those types.
* logits.npz: `token_ids` [1, 64] int32 and [1, 64, V] float32 logits: `hf_llama3` (the twin),
  `hf_default` (the same weights, plain RoPE), `hf_yarn`, `hf_linear` (the twin under those
  rope_parameters) and `hf_gguf_llama3` (transformers 5.24 loading llama31.gguf itself).
"""

from __future__ import annotations

import math
import pathlib

import gguf
import numpy as np
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from make_pretrained_golden_tiny import _logits, _randomize

OUT = pathlib.Path("tests/data/pretrained/gguf_rope")
THETA, L0, SEQ, VOCAB, HEADS, KV, HEAD_DIM = 50.0, 32, 64, 64, 4, 2, 16
LLAMA3 = {"rope_type": "llama3", "rope_theta": THETA, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": L0}
CASES = {"llama3": LLAMA3, "default": {"rope_type": "default", "rope_theta": THETA},
         "yarn": {"rope_type": "yarn", "rope_theta": THETA, "factor": 8.0,
                  "original_max_position_embeddings": L0, "beta_fast": 32.0, "beta_slow": 1.0},
         "linear": {"rope_type": "linear", "rope_theta": THETA, "factor": 4.0}}
SPEC = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HEAD_DIM,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "bos_token_id": 1,
        "eos_token_id": 2, "tie_word_embeddings": False}
EQUAL = [(500000.0, 128, 16.0, 8192, 1.0), (500000.0, 128, 8.0, 8192, 1.0),
         (THETA, HEAD_DIM, 8.0, L0, 1.0), (10000.0, 64, 4.0, 1024, 2.0)]
GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
              "output_norm.weight", "lm_head.weight": "output.weight"}
BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj":
         "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
         "post_attention_layernorm": "ffn_norm"}


def llama_cpp_rope_freqs(p: dict, dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors, with L0 = p's original."""
    freqs = 1.0 / (p["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old = p["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def _gguf_name(name: str) -> str:
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    _, _, i, rest = name.split(".", 3)
    return f"blk.{i}.{BLOCK[rest.removesuffix('.weight')]}.weight"


def write_gguf(path: pathlib.Path, state: dict, rope: dict) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama31")
    w.add_block_count(SPEC["num_hidden_layers"])
    w.add_context_length(SPEC["max_position_embeddings"])
    w.add_embedding_length(SPEC["hidden_size"])
    w.add_feed_forward_length(SPEC["intermediate_size"])
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(SPEC["rms_norm_eps"])
    w.add_rope_freq_base(THETA)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_vocab_size(VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if rope["rope_type"] == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    elif rope["rope_type"] == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    for name, value in state.items():
        value = value.numpy()
        if ".q_proj" in name:
            value = _permute(value, HEADS)
        elif ".k_proj" in name:
            value = _permute(value, KV)
        w.add_tensor(_gguf_name(name), value.astype(np.float16 if value.ndim == 2 else
                                                    np.float32))
    if rope["rope_type"] == "llama3":
        w.add_tensor("rope_freqs.weight", llama_cpp_rope_freqs(rope, HEAD_DIM))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_equal_factors() -> None:
    out = {}
    for theta, dim, factor, original, low in EQUAL:
        config = transformers.LlamaConfig(
            hidden_size=dim, num_attention_heads=1, head_dim=dim, rope_parameters={
                "rope_type": "llama3", "rope_theta": theta, "factor": factor,
                "low_freq_factor": low, "high_freq_factor": low,
                "original_max_position_embeddings": original})
        inv, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
        out[f"{theta:g}_{dim}_{factor:g}_{original}_{low:g}"] = inv.numpy()
        print(theta, dim, factor, original, low, "finite:", bool(np.isfinite(out[
            f"{theta:g}_{dim}_{factor:g}_{original}_{low:g}"]).all()))
    np.savez(OUT / "llama3_equal.npz", **out)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    write_equal_factors()
    torch.manual_seed(3232)
    config = transformers.LlamaConfig(**SPEC, rope_parameters=dict(LLAMA3))
    model = transformers.LlamaForCausalLM(config).eval()
    _randomize(model, gemma=False)
    with torch.no_grad():  # float16 values, so the F16 GGUF holds the same numbers
        for p in model.parameters():
            p.copy_(p.half().float())
    model.save_pretrained(OUT / "twin", safe_serialization=True)
    state = {k: v for k, v in model.state_dict().items() if "rotary_emb" not in k}
    ids = torch.randint(3, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(7))
    arrays = {"token_ids": ids.numpy().astype(np.int32)}
    for case, rope in CASES.items():
        other = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(**SPEC, rope_parameters=dict(rope))).eval()
        other.load_state_dict(state, strict=False)
        arrays[f"hf_{case}"] = _logits(other, ids)
    for case, name in (("llama3", "llama31.gguf"), ("yarn", "yarn.gguf"),
                       ("linear", "linear.gguf")):
        write_gguf(OUT / name, state, CASES[case])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        OUT, gguf_file="llama31.gguf", dtype=torch.float32).eval()
    arrays["hf_gguf_llama3"] = _logits(loaded, ids)
    np.savez(OUT / "logits.npz", **arrays)
    for case in ("default", "gguf_llama3"):
        diff = np.abs(arrays[f"hf_{case}"] - arrays["hf_llama3"]).max()
        print(f"max |hf_{case} - hf_llama3| = {diff:.4g}")


if __name__ == "__main__":
    main()
