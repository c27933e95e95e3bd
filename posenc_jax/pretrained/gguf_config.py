"""A GGUF file's metadata as the Hugging Face config.json dict transformers 5.24 builds from it.

transformers reads a few `<arch>.*` and `tokenizer.ggml.*` keys, renames them, and passes them
to the family's config class, whose defaults fill the rest. `hf_config` does the same with the
same renames and the defaults those classes write into config.json (their `to_diff_dict()`), so
the result equals transformers' `AutoConfig.from_pretrained(dir, gguf_file=...).to_diff_dict()`
less `transformers_version` and the name/path keys (checked on both real models, SmolLM2 and
Gemma 3, in tests/pretrained/test_pretrained_gguf.py). Floats stored as float32 in the file stay
float32 values (eps 1e-5 reads 9.999999747378752e-06), as in transformers.

Where we differ from transformers on purpose: the RoPE scaling. transformers reads no
`rope.scaling.*` key (but gpt-oss's) and drops `rope_freqs.weight`; `hf_config` puts both into
`rope_parameters` (`gguf_rope`), for every family: a Llama 3.1 GGUF's config then equals its
safetensors twin's config.json (`rope_type: llama3` ...). A family whose `complete` makes one
RoPE per layer type (Gemma 3) gets the scaling on its full-attention layers, as llama.cpp
applies the file's scale to the global layers only.

Everything family-specific -- the architectures read, their keys, defaults, tensor names and
per-layer settings -- is in the family records (`Family.gguf`, chosen by
`families.for_gguf`: the architecture, and `general.name` where transformers looks at it).
`hf_tensor_name` maps GGUF tensor names to Hugging Face ones through the record's tables.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from posenc_jax.pretrained import gguf_rope
from posenc_jax.pretrained.families import GGUF, for_gguf

__all__ = ["READ_APART", "hf_config", "hf_tensor_name"]

_TOKENIZER_KEYS = {
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}
# Tensors no model parameter holds: read into the config (`hf_config`'s rope_freqs).
READ_APART = frozenset({gguf_rope.ROPE_FREQS})
_BLOCK_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")
_TOP_RE = re.compile(r"([a-z_]+)\.(weight|bias)")


def gguf_part(gguf_name: str) -> str | None:
    """The GGUF tensor's part ("attn_q" of blk.3.attn_q.weight, "output_norm"), or None."""
    m = _BLOCK_RE.fullmatch(gguf_name) or _TOP_RE.fullmatch(gguf_name)
    return None if m is None else m.group(m.lastindex - 1)


def hf_tensor_name(gguf_name: str, spec: GGUF) -> str | None:
    """The HF name of GGUF tensor `gguf_name` in a file of `spec`'s family (e.g.
    blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight), or None when the family has
    no such tensor."""
    if m := _BLOCK_RE.fullmatch(gguf_name):
        part = spec.block.get(m.group(2))
        return None if part is None else f"model.layers.{m.group(1)}.{part}.{m.group(3)}"
    if m := _TOP_RE.fullmatch(gguf_name):
        part = spec.top.get(m.group(1))
        return None if part is None else f"{part}.{m.group(2)}"
    return None


def hf_config(fields: dict[str, Any], tensor_names: list[str], *, where: str,
              rope_freqs: np.ndarray | None = None) -> dict[str, Any]:
    """The config.json dict for a GGUF file whose metadata is `fields` (key -> parsed value).

    `rope_freqs`: the file's `rope_freqs.weight` [rotary_dim / 2] float32, or None (module
    docstring, `gguf_rope`). `where` (the file's path) is named in errors. Raises ValueError for
    an architecture no record reads, a missing `general.architecture`, or RoPE scaling metadata
    that `gguf_rope` refuses.
    """
    family = for_gguf(fields, where=where)
    spec, arch = family.gguf, family.gguf.arch
    parsed: dict[str, Any] = {}
    for key, hf_key in spec.keys.items():
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
    cfg: dict[str, Any] = {**spec.defaults, **parsed}
    cfg["model_type"] = family.model_type
    cfg["tie_word_embeddings"] = "output.weight" not in tensor_names
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    theta = float(cfg.pop("rope_theta"))
    rotary_dim = fields.get(f"{arch}.rope.dimension_count") or fields.get(
        f"{arch}.attention.key_length") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rope = gguf_rope.rope_parameters(fields, rope_freqs, arch=arch, theta=theta,
                                     rotary_dim=rotary_dim,
                                     context_length=cfg["max_position_embeddings"], where=where)
    cfg["rope_parameters"] = rope
    if spec.complete is not None:
        spec.complete(cfg, theta)
        per_type = cfg["rope_parameters"]
        if rope["rope_type"] != "default" and "full_attention" in per_type:
            per_type["full_attention"] = {**rope, "rope_theta": per_type["full_attention"][
                "rope_theta"]}
    return cfg
