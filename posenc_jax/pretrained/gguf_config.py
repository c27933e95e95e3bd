"""A GGUF file's metadata as the Hugging Face config.json dict transformers 5.24 builds from it.

transformers reads a few `<arch>.*` and `tokenizer.ggml.*` keys, renames them, and passes them
to the family's config class, whose defaults fill the rest. `hf_config` does the same with the
same renames and the defaults those classes write into config.json (their `to_diff_dict()`), so
the result equals transformers' `AutoConfig.from_pretrained(dir, gguf_file=...).to_diff_dict()`
less `transformers_version` and the name/path keys (checked on both real models, SmolLM2 and
Gemma 3, in tests/pretrained/test_pretrained_gguf.py). Floats stored as float32 in the file stay float32
values (eps 1e-5 reads 9.999999747378752e-06), as in transformers.

Supported GGUF architectures: llama (model_type llama, or mistral when `general.name` is exactly
"mistral", transformers' rule), qwen2, qwen3, gemma3 (model_type gemma3_text; a file without a
local rope base gets Gemma 3's default sliding-layer theta 1e4, the file's `rope.freq_base` going
to the full-attention layers). `TENSOR_NAMES` maps GGUF tensor names to Hugging Face ones.
"""

from __future__ import annotations

import re
from typing import Any

SUPPORTED = ("llama", "qwen2", "qwen3", "gemma3")

# GGUF `<arch>.<key>` -> HF config key (transformers' GGUF_CONFIG_MAPPING for these families).
_COMMON_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "rope.freq_base": "rope_theta",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "vocab_size": "vocab_size",
}
_ARCH_KEYS = {
    "llama": {**_COMMON_KEYS, "rope.dimension_count": "head_dim"},
    "qwen2": _COMMON_KEYS,
    "qwen3": _COMMON_KEYS,
    "gemma3": {**_COMMON_KEYS, "attention.key_length": "head_dim",
               "attention.sliding_window": "sliding_window"},
}
_TOKENIZER_KEYS = {
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}

# What each family's config class writes into config.json when not given (transformers 5.24).
_BASE = {"initializer_range": 0.02, "use_cache": True,
         "attention_dropout": 0.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048,
         "rope_theta": 10000.0}
_SILU = {**_BASE, "hidden_act": "silu"}
_QWEN = {**_SILU, "max_position_embeddings": 32768, "use_sliding_window": False,
         "sliding_window": None, "max_window_layers": 28}
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_SILU, "pretraining_tp": 1, "attention_bias": False, "mlp_bias": False},
    "mistral": {**_SILU, "max_position_embeddings": 4096 * 32, "sliding_window": 4096},
    "qwen2": _QWEN,
    "qwen3": {**_QWEN, "head_dim": 128, "attention_bias": False},
    "gemma3_text": {**_BASE, "hidden_activation": "gelu_pytorch_tanh",
                    "max_position_embeddings": 131072, "head_dim": 256,
                    "rope_theta": 1_000_000.0, "attention_bias": False,
                    "query_pre_attn_scalar": 256, "sliding_window": 4096,
                    "final_logit_softcapping": None, "attn_logit_softcapping": None,
                    "use_bidirectional_attention": False, "_sliding_window_pattern": 6},
}
GEMMA3_LOCAL_ROPE_THETA = 10000.0

# GGUF tensor name -> HF tensor name; `{i}` is the block index.
_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}
_GEMMA_BLOCK = {**_BLOCK, "ffn_norm": "pre_feedforward_layernorm",
                "post_attention_norm": "post_attention_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Tensors some converters add that transformers' models have no parameter for (it drops them).
IGNORED = frozenset({"rope_freqs.weight"})
_BLOCK_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")
_TOP_RE = re.compile(r"([a-z_]+)\.(weight|bias)")


def hf_tensor_name(gguf_name: str, arch: str) -> str | None:
    """The HF name of GGUF tensor `gguf_name` (e.g. blk.3.attn_q.weight ->
    model.layers.3.self_attn.q_proj.weight), or None when the family has no such tensor."""
    table = _GEMMA_BLOCK if arch == "gemma3" else _BLOCK
    if m := _BLOCK_RE.fullmatch(gguf_name):
        part = table.get(m.group(2))
        return None if part is None else f"model.layers.{m.group(1)}.{part}.{m.group(3)}"
    if m := _TOP_RE.fullmatch(gguf_name):
        part = _TOP.get(m.group(1))
        return None if part is None else f"{part}.{m.group(2)}"
    return None


def _layer_types(n_layers: int, pattern: int) -> list[str]:
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(n_layers)]


def hf_config(fields: dict[str, Any], tensor_names: list[str], *, where: str) -> dict[str, Any]:
    """The config.json dict for a GGUF file whose metadata is `fields` (key -> parsed value).

    `where` (the file's path) is named in errors. Raises ValueError for an architecture outside
    SUPPORTED or a missing `general.architecture`.
    """
    arch = fields.get("general.architecture")
    if arch not in SUPPORTED:
        raise ValueError(f"{where}: GGUF general.architecture={arch!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED)})")
    model_type = {"gemma3": "gemma3_text"}.get(arch, arch)
    if arch == "llama" and fields.get("general.name") == "mistral":
        model_type = "mistral"
    parsed: dict[str, Any] = {}
    for key, hf_key in _ARCH_KEYS[arch].items():
        if f"{arch}.{key}" in fields:
            parsed[hf_key] = fields[f"{arch}.{key}"]
    for key, hf_key in _TOKENIZER_KEYS.items():
        if key in fields:
            parsed[hf_key] = fields[key]
    if "vocab_size" not in parsed and "tokenizer.ggml.tokens" in fields:
        parsed["vocab_size"] = len(fields["tokenizer.ggml.tokens"])
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                           "intermediate_size", "vocab_size") if k not in parsed]
    if missing:
        raise ValueError(f"{where}: GGUF metadata lacks what gives {', '.join(missing)} "
                         f"(keys {arch}.embedding_length, .block_count, .attention.head_count, "
                         f".feed_forward_length, .vocab_size or tokenizer.ggml.tokens)")
    cfg: dict[str, Any] = {**_DEFAULTS[model_type], **parsed}
    cfg["model_type"] = model_type
    cfg["tie_word_embeddings"] = "output.weight" not in tensor_names
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    if model_type in ("llama", "mistral"):
        cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    theta = float(cfg.pop("rope_theta"))
    if model_type == "gemma3_text":
        cfg["layer_types"] = _layer_types(cfg["num_hidden_layers"], cfg["_sliding_window_pattern"])
        cfg["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_ROPE_THETA},
            "full_attention": {"rope_type": "default", "rope_theta": theta}}
    else:
        cfg["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    if model_type in ("qwen2", "qwen3"):
        cfg["layer_types"] = ["full_attention"] * cfg["num_hidden_layers"]
    return cfg
