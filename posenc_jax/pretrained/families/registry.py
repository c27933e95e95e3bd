"""The one list of model families, and the lookups by model_type and by GGUF architecture.

`FAMILIES` is in the order errors list them; `CHOICE` is the order in which an export asks
`Family.claims` when no family is named (the most specific first: Gemma 3's post-norms, Gemma's
sqrt(E) embeddings, Qwen2's qkv bias, Qwen3-MoE's QK-norm with experts, Qwen3's QK-norm,
Mixtral's experts in every layer, Mistral's window, else Llama); a family
whose `claims` is None is exported only when named (Phi-3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc_jax.pretrained.families import (
    gemma,
    gemma3,
    gpt_oss,
    llama,
    llama4,
    mistral,
    mixtral,
    phi3,
    qwen2,
    qwen3,
    qwen3_moe,
)
from posenc_jax.pretrained.families.record import Family

__all__ = ["CHOICE", "FAMILIES", "by_model_type", "claimed", "for_gguf", "gguf_archs",
           "model_types"]

FAMILIES: tuple[Family, ...] = (llama.FAMILY, mistral.FAMILY, qwen2.FAMILY, qwen3.FAMILY,
                                gemma.FAMILY, gemma3.FAMILY, phi3.FAMILY, qwen3_moe.FAMILY,
                                mixtral.FAMILY, gpt_oss.FAMILY, llama4.FAMILY)
CHOICE: tuple[Family, ...] = (gemma3.FAMILY, gemma.FAMILY, qwen2.FAMILY, qwen3_moe.FAMILY,
                              qwen3.FAMILY, mixtral.FAMILY, mistral.FAMILY, llama.FAMILY)


def model_types() -> tuple[str, ...]:
    """Every model_type a record reads (aliases included), in `FAMILIES`' order."""
    return tuple(t for f in FAMILIES for t in (f.model_type, *f.aliases))


def by_model_type(model_type: Any, *, where: Any = None) -> Family:
    """The record reading `model_type` (its own or an alias). ValueError naming `where` and the
    supported model_types otherwise."""
    for family in FAMILIES:
        if model_type == family.model_type or model_type in family.aliases:
            return family
    head = f"{where}: " if where is not None else ""
    raise ValueError(f"{head}unsupported model_type={model_type!r}; supported: "
                     f"{', '.join(map(repr, model_types()))}")


def gguf_archs() -> tuple[str, ...]:
    """The GGUF `general.architecture`s read, each once, in the loaders' order."""
    return tuple(dict.fromkeys(f.gguf.arch for f in FAMILIES if f.gguf is not None))


def for_gguf(fields: Mapping[str, Any], *, where: Any) -> Family:
    """The record for a GGUF file's metadata: its `general.architecture`, and among records of
    that arch the one whose `name` is the file's `general.name`, else the arch's default."""
    arch = fields.get("general.architecture")
    matches = [f for f in FAMILIES if f.gguf is not None and f.gguf.arch == arch]
    if not matches:
        raise ValueError(f"{where}: GGUF general.architecture={arch!r} is not supported "
                         f"(supported: {', '.join(gguf_archs())})")
    named = [f for f in matches if f.gguf.name is not None
             and f.gguf.name == fields.get("general.name")]
    return (named or [f for f in matches if f.gguf.name is None])[0]


def claimed(cfg: Any) -> Family:
    """The first record in `CHOICE` whose `claims(cfg)` holds (Llama claims every model)."""
    return next(f for f in CHOICE if f.claims(cfg))
