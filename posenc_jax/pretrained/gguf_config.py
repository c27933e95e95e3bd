"""A GGUF file's metadata as the Hugging Face config.json dict transformers 5.24 builds from it.

transformers reads a few `<arch>.*` and `tokenizer.ggml.*` keys, renames them, and passes them
to the family's config class, whose defaults fill the rest. `hf_config` does the same with the
same renames and the defaults those classes write into config.json (their `to_diff_dict()`), so
the result equals transformers' `AutoConfig.from_pretrained(dir, gguf_file=...).to_diff_dict()`
less `transformers_version` and the name/path keys (checked on both real models, SmolLM2 and
Gemma 3, in tests/pretrained/test_pretrained_gguf.py). Floats stored as float32 in the file stay
float32 values (eps 1e-5 reads 9.999999747378752e-06), as in transformers.

Everything family-specific -- the architectures read, their keys, defaults, tensor names and
per-layer settings -- is in the family records (`Family.gguf`, chosen by
`families.for_gguf`: the architecture, and `general.name` where transformers looks at it).
`hf_tensor_name` maps GGUF tensor names to Hugging Face ones through the record's tables.
"""

from __future__ import annotations

import re
from typing import Any

from posenc_jax.pretrained.families import GGUF, for_gguf

__all__ = ["IGNORED", "hf_config", "hf_tensor_name"]

_TOKENIZER_KEYS = {
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}
# Tensors some converters add that transformers' models have no parameter for (it drops them).
IGNORED = frozenset({"rope_freqs.weight"})
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


def hf_config(fields: dict[str, Any], tensor_names: list[str], *, where: str) -> dict[str, Any]:
    """The config.json dict for a GGUF file whose metadata is `fields` (key -> parsed value).

    `where` (the file's path) is named in errors. Raises ValueError for an architecture no
    record reads or a missing `general.architecture`.
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
    cfg["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    if spec.complete is not None:
        spec.complete(cfg, theta)
    return cfg
