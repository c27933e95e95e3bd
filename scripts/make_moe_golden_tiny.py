"""Tiny random-weight MoE checkpoints for tests/pretrained/test_pretrained_moe.py and the
tiny-family tests: tests/data/pretrained/tiny/{qwen3_moe,mixtral}/.

Qwen3-MoE: three layers (0 and 2 sparse, 1 dense through `mlp_only_layers`), 4 experts, top 2
renormalised (`norm_topk_prob`, as Qwen3-30B-A3B). Mixtral: two layers of 4 experts, top 2,
a sliding window of 8. Made as scripts/make_pretrained_golden_tiny.py makes the
dense families (fixed torch seed, every param redrawn with std 1/sqrt(fan in), norms around 1),
saved with `save_pretrained` (transformers 5 writes one tensor per expert), reloaded and checked
to give the same logits. logits.npz: `token_ids` [1, 32], `logits__<case>` [1, 32, V] for each
case of cases.json, `greedy_prompt` [1, 8] and `greedy_tokens` [1, 24] (`generate`, greedy, 16
new tokens with the cache, no EOS stop). moe_gguf/ (`--only gguf`): a llama.cpp-style qwen3moe
GGUF of an all-sparse twin and its transformers logits (`write_gguf`).

    /work/goldenvenv/bin/python scripts/make_moe_golden_tiny.py [--dir tests/data/pretrained]
        [--only qwen3_moe,mixtral]
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

import gguf
import make_pretrained_golden_tiny as tiny
import numpy as np
import torch
import transformers

SPEC = dict(tiny.COMMON, model_type="qwen3_moe", num_hidden_layers=3, tie_word_embeddings=False,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[1],
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
MIXTRAL = dict(tiny.COMMON, model_type="mixtral", num_hidden_layers=2, tie_word_embeddings=False,
               num_local_experts=4, num_experts_per_tok=2, intermediate_size=16, sliding_window=8,
               rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
CASES = {"default": None, "yarn2": dict(tiny.YARN2, rope_theta=1000000.0)}
FAMILIES = {"qwen3_moe": (SPEC, 2000), "mixtral": (MIXTRAL, 2001)}


def _randomize(model: torch.nn.Module) -> None:
    """Norms around 1, embeddings N(0, 1), every other weight N(0, 1 / fan in) (the stacked
    experts [X, out, in] by their last axis)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))


def write(root: pathlib.Path, family: str) -> None:
    spec, seed = FAMILIES[family]
    out = root / "tiny" / family
    out.mkdir(parents=True, exist_ok=True)
    ids = torch.from_numpy(np.random.default_rng(0).integers(
        3, tiny.VOCAB, size=(1, tiny.SEQ)).astype(np.int64))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny._config(spec, None),
                                                          dtype=torch.float32).eval()
    _randomize(model)
    model.save_pretrained(out, safe_serialization=True)
    arrays = {"token_ids": ids.numpy().astype(np.int32)}
    for case, rope in CASES.items():
        m = model if rope is None else tiny._with_rope(spec, rope, model.state_dict())
        arrays[f"logits__{case}"] = tiny._logits(m, ids)
    again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    np.testing.assert_array_equal(tiny._logits(again, ids), arrays["logits__default"])
    prompt = ids[:, :8]
    with torch.no_grad():
        greedy = model.generate(prompt, max_new_tokens=16, do_sample=False, min_new_tokens=16,
                                eos_token_id=None, pad_token_id=0)
    arrays["greedy_prompt"] = prompt.numpy().astype(np.int32)
    arrays["greedy_tokens"] = greedy.numpy().astype(np.int32)
    np.savez_compressed(out / "logits.npz", **arrays)
    (out / "cases.json").write_text(json.dumps(CASES, indent=1) + "\n")
    print(f"tiny/{family}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)


GGUF_SPEC = dict(SPEC, num_hidden_layers=2, mlp_only_layers=[])  # llama.cpp: every layer sparse
GGUF_BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
              "mlp.gate": "ffn_gate_inp"}


def write_gguf(root: pathlib.Path) -> None:
    """moe_gguf/qwen3moe.gguf: a 2-layer Qwen3-MoE (every layer sparse, as llama.cpp's qwen3moe
    has them) as convert_hf_to_gguf.py writes it: F32 tensors, experts stacked [X, F, E] as
    ffn_{gate,up,down}_exps, the router as ffn_gate_inp, `expert_count`, `expert_used_count`,
    `expert_feed_forward_length`; logits.npz: the safetensors model's logits (`hf`) and
    transformers 5.25's own load of the GGUF (`hf_gguf`), for `token_ids`."""
    out = root / "moe_gguf"
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(2002)
    model = transformers.AutoModelForCausalLM.from_config(tiny._config(GGUF_SPEC, None),
                                                          dtype=torch.float32).eval()
    _randomize(model)
    ids = torch.from_numpy(np.random.default_rng(0).integers(
        3, tiny.VOCAB, size=(1, tiny.SEQ)).astype(np.int64))
    w = gguf.GGUFWriter(str(out / "qwen3moe.gguf"), "qwen3moe")
    w.add_name("tiny-qwen3moe")
    for add, key in (("block_count", "num_hidden_layers"),
                     ("context_length", "max_position_embeddings"),
                     ("embedding_length", "hidden_size"),
                     ("feed_forward_length", "intermediate_size"),
                     ("expert_feed_forward_length", "moe_intermediate_size"),
                     ("expert_count", "num_experts"), ("expert_used_count", "num_experts_per_tok"),
                     ("head_count", "num_attention_heads"), ("head_count_kv", "num_key_value_heads"),
                     ("key_length", "head_dim"), ("value_length", "head_dim"),
                     ("layer_norm_rms_eps", "rms_norm_eps")):
        getattr(w, f"add_{add}")(GGUF_SPEC[key])
    w.add_rope_freq_base(GGUF_SPEC["rope_parameters"]["rope_theta"])
    w.add_vocab_size(tiny.VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(tiny.VOCAB)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    for name, value in state.items():
        if name in top:
            w.add_tensor(top[name], value)
            continue
        _, _, i, rest = name.split(".", 3)
        rest = rest.removesuffix(".weight")
        if rest in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
            continue
        w.add_tensor(f"blk.{i}.{GGUF_BLOCK[rest]}.weight", value)
    for i in range(GGUF_SPEC["num_hidden_layers"]):  # per expert [F, E] stacked: [X, F, E]
        gate_up = state[f"model.layers.{i}.mlp.experts.gate_up_proj"]       # [X, 2F, E]
        f = GGUF_SPEC["moe_intermediate_size"]
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, :f]))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, f:]))
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight",
                     state[f"model.layers.{i}.mlp.experts.down_proj"])           # [X, E, F]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    arrays = {"token_ids": ids.numpy().astype(np.int32), "hf": tiny._logits(model, ids)}
    try:
        theirs = transformers.AutoModelForCausalLM.from_pretrained(
            out, gguf_file="qwen3moe.gguf", dtype=torch.float32).eval()
        arrays["hf_gguf"] = tiny._logits(theirs, ids)
    except Exception as err:  # noqa: BLE001 (recorded, not fatal: transformers' own reader)
        print(f"transformers could not load the GGUF: {type(err).__name__}: {err}")
    np.savez_compressed(out / "logits.npz", **arrays)
    print(f"moe_gguf/qwen3moe.gguf: {sorted(arrays)}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="tests/data/pretrained")
    parser.add_argument("--only", default=",".join([*FAMILIES, "gguf"]))
    args = parser.parse_args()
    for name in args.only.split(","):
        if name == "gguf":
            write_gguf(pathlib.Path(args.dir))
        else:
            write(pathlib.Path(args.dir), name)
