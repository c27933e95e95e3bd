"""A GGUF file's metadata, every key we read checked for its type and value before use.

    fields = checked_fields(parsed, where="model.gguf")   # parsed: gguf_format.GGUFFile

The GGUF spec (ggml's docs/gguf.md) and llama.cpp's writer (gguf-py's `GGUFWriter.add_*`)
give each standard key one value type: sizes and token ids are unsigned integers, the RoPE
base and the norm epsilon float32, names strings, the vocabulary an array of strings, and so
on. llama.cpp refuses a key of another type ("key ... has wrong type"); so does this, by kind
(any integer type where an integer is due, float32 or float64 where a float is), rather than
converting quietly (a float `embedding_length`, the string "1e4" as `rope.freq_base`). Values
are checked too: sizes >= 1, token ids >= 0, the RoPE base and epsilon finite and > 0.
Keys this package never reads pass unchecked: the spec lets writers add their own.

Every message names the file, the key, its GGUF type and value, and what is expected; all
are ValueError (a file's content, not a Python argument).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["ARCH_KEYS", "GENERAL_KEYS", "checked_fields"]

_INTEGERS = frozenset({"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64",
                       "int64"})
_FLOATS = frozenset({"float32", "float64"})
# kind -> (accepted GGUF types, the words of the message)
_KINDS = {
    "size": (_INTEGERS, "an integer type (uint32) >= 1"),
    "count": (_INTEGERS, "an integer type (uint32) >= 0"),
    "token": (_INTEGERS, "an integer type (uint32), a token id >= 0"),
    "positive": (_FLOATS, "float32, finite and > 0"),
    "real": (_FLOATS, "float32, finite"),
    "bool": (frozenset({"bool"}), "bool"),
    "string": (frozenset({"string"}), "string"),
    "strings": (frozenset({"array[string]"}), "array[string]"),
    "ints": ({f"array[{t}]" for t in _INTEGERS}, "an array of integers (array[int32])"),
    "floats": ({f"array[{t}]" for t in _FLOATS}, "an array of floats (array[float32])"),
}
#: Keys without the architecture prefix -> kind.
GENERAL_KEYS = {
    "general.architecture": "string", "general.name": "string", "general.alignment": "size",
    "general.file_type": "count", "general.quantization_version": "count",
    "tokenizer.ggml.model": "string", "tokenizer.ggml.pre": "string",
    "tokenizer.ggml.tokens": "strings", "tokenizer.ggml.merges": "strings",
    "tokenizer.ggml.scores": "floats", "tokenizer.ggml.token_type": "ints",
    "tokenizer.ggml.bos_token_id": "token", "tokenizer.ggml.eos_token_id": "token",
    "tokenizer.ggml.unknown_token_id": "token", "tokenizer.ggml.padding_token_id": "token",
    "tokenizer.ggml.add_bos_token": "bool", "tokenizer.ggml.add_eos_token": "bool",
    "tokenizer.ggml.add_sep_token": "bool", "tokenizer.ggml.add_space_prefix": "bool",
    "tokenizer.chat_template": "string",
}
#: `<arch>.<key>` -> kind, for every architecture.
ARCH_KEYS = {
    "context_length": "size", "embedding_length": "size", "block_count": "size",
    "feed_forward_length": "size", "vocab_size": "size", "attention.head_count": "size",
    "attention.head_count_kv": "size", "attention.key_length": "size",
    "attention.value_length": "size", "attention.sliding_window": "size",
    "rope.dimension_count": "size", "rope.freq_base": "positive",
    "attention.layer_norm_rms_epsilon": "positive",
    # RoPE scaling (gguf's Keys.Rope; their meaning: gguf_rope)
    "rope.scaling.type": "string", "rope.scaling.factor": "real", "rope.scale_linear": "real",
    "rope.scaling.original_context_length": "size", "rope.scaling.attn_factor": "real",
    "rope.scaling.yarn_ext_factor": "real", "rope.scaling.yarn_attn_factor": "real",
    "rope.scaling.yarn_beta_fast": "positive", "rope.scaling.yarn_beta_slow": "positive",
    "rope.scaling.yarn_log_multiplier": "real", "rope.scaling.alpha": "real",
    "rope.scaling.finetuned": "bool",
}


def _short(value: Any) -> str:
    if isinstance(value, (list, np.ndarray)):
        return f"{len(value)} entries"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check(where: str, key: str, kind: str, gguf_type: str, value: Any) -> None:
    types, expected = _KINDS[kind]
    if gguf_type not in types:
        raise ValueError(f"{where}: GGUF metadata {key!r} is {gguf_type} ({_short(value)}), "
                         f"expected {expected} (the GGUF spec; llama.cpp refuses it too)")
    bad = ((kind == "size" and value < 1) or (kind in ("count", "token") and value < 0)
           or (kind == "positive" and not (math.isfinite(value) and value > 0))
           or (kind == "real" and not math.isfinite(value)))
    if bad:
        raise ValueError(f"{where}: GGUF metadata {key!r} = {value!r} is out of range, "
                         f"expected {expected}")


def checked_fields(parsed: Any, *, where: str) -> dict[str, Any]:
    """`parsed.fields` (a `gguf_format.GGUFFile`) after every key of GENERAL_KEYS and
    `<general.architecture>.<ARCH_KEYS>` present in the file has passed its check (module
    docstring). Raises ValueError naming `where`, the key, its type and the expected one."""
    fields, types = parsed.fields, parsed.types
    for key, kind in GENERAL_KEYS.items():
        if key in fields:
            _check(where, key, kind, types[key], fields[key])
    arch = fields.get("general.architecture")
    if isinstance(arch, str):
        for suffix, kind in ARCH_KEYS.items():
            key = f"{arch}.{suffix}"
            if key in fields:
                _check(where, key, kind, types[key], fields[key])
    return fields
