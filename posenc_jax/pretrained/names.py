"""Hugging Face tensor names -> the NNX model's params, with the layout change of each.

    model.embed_tokens.weight                   [V, E]      -> embedding [V, E]
    model.layers.N.self_attn.q_proj.weight      [H*D, E]    -> layers.N.attn.q_proj [E, H, D]
    model.layers.N.self_attn.k_proj / v_proj    [K*D, E]    -> attn.k_proj / v_proj [E, K, D]
    model.layers.N.self_attn.o_proj.weight      [E, H*D]    -> attn.o_proj [H, D, E]
    model.layers.N.self_attn.{q,k,v}_proj.bias  [H*D|K*D]   -> attn.{q,k,v}_bias [H|K, D]
    model.layers.N.self_attn.{q,k}_norm.weight  [D]         -> attn.{q,k}_norm.scale
    model.layers.N.mlp.{gate,up}_proj.weight    [F, E]      -> mlp.gate / mlp.up [E, F]
    model.layers.N.mlp.down_proj.weight         [E, F]      -> mlp.down [F, E]
    model.layers.N.<norm>.weight                [E]         -> the block's norms (family order)
    model.norm.weight                           [E]         -> final_norm.scale
    lm_head.weight                              [V, E]      -> unembed [E, V] (untied only)

A tied model ignores an `lm_head.weight` (some exports write the tied copy); Gemma 3's
multimodal checkpoints prefix the text model (`model.language_model.`, `language_model.model.`)
and their vision tower and projector are ignored. Rotary `inv_freq` buffers of old exports are
ignored too. Anything else is an extra tensor, and an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from posenc_jax.pretrained.families import Architecture

__all__ = ["Target", "ignored", "targets"]

PREFIXES = ("model.", "model.language_model.", "language_model.model.")
_IGNORED_STARTS = ("vision_tower.", "model.vision_tower.", "multi_modal_projector.",
                   "model.multi_modal_projector.")
_OURS = ("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm")


@dataclasses.dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: our param's path, the Hugging Face shape it must have,
    and the layout change (np [HF shape] -> np [our shape])."""

    path: tuple
    hf_shape: tuple[int, ...]
    convert: Callable[[np.ndarray], np.ndarray]


def _same(x: np.ndarray) -> np.ndarray:
    return x


def _transpose(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.T)


def _in_heads(n: int, d: int):
    return lambda w: np.ascontiguousarray(w.T).reshape(w.shape[1], n, d)


def _out_heads(n: int, d: int):
    return lambda w: np.ascontiguousarray(w.T).reshape(n, d, w.shape[0])


def _bias(n: int, d: int):
    return lambda b: b.reshape(n, d)


def ignored(name: str, *, tied: bool) -> bool:
    """Tensors a checkpoint may carry that the text model does not read."""
    return (name.endswith("rotary_emb.inv_freq") or name.startswith(_IGNORED_STARTS)
            or (tied and name in ("lm_head.weight", "language_model.lm_head.weight")))


def prefix_of(names) -> str:
    """The text model's prefix in these names ("model." for plain causal LMs)."""
    for prefix in PREFIXES[::-1]:
        if f"{prefix}embed_tokens.weight" in names:
            return prefix
    return PREFIXES[0]


def targets(cfg, arch: Architecture, prefix: str = "model.") -> dict[str, Target]:
    """{Hugging Face name: Target} for every param of a `Transformer(cfg)` of family `arch`."""
    e, v, f = cfg.embed_dim, cfg.vocab_size, cfg.mlp_dim
    h, k, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    out = {f"{prefix}embed_tokens.weight": Target(("embedding",), (v, e), _same),
           f"{prefix}norm.weight": Target(("final_norm", "scale"), (e,), _same)}
    if not cfg.tie_embeddings:
        head = "language_model.lm_head.weight" if prefix == "language_model.model." else (
            "lm_head.weight")
        out[head] = Target(("unembed",), (v, e), _transpose)
    norms = dict(zip(arch.norms, _OURS))
    for i in range(cfg.num_layers):
        p, ours = f"{prefix}layers.{i}.", ("layers", i)
        attn = ours + ("attn",)
        out[p + "self_attn.q_proj.weight"] = Target(attn + ("q_proj",), (h * d, e),
                                                    _in_heads(h, d))
        for name, n in (("k", k), ("v", k)):
            out[p + f"self_attn.{name}_proj.weight"] = Target(
                attn + (f"{name}_proj",), (n * d, e), _in_heads(n, d))
        out[p + "self_attn.o_proj.weight"] = Target(attn + ("o_proj",), (e, h * d),
                                                    _out_heads(h, d))
        if cfg.qkv_bias:
            for name, n in (("q", h), ("k", k), ("v", k)):
                out[p + f"self_attn.{name}_proj.bias"] = Target(
                    attn + (f"{name}_bias",), (n * d,), _bias(n, d))
        if cfg.qk_norm:
            for name in ("q", "k"):
                out[p + f"self_attn.{name}_norm.weight"] = Target(
                    attn + (f"{name}_norm", "scale"), (d,), _same)
        gated = cfg.mlp_activation != "gelu"
        for name in ("gate", "up") if gated else ("up",):
            out[p + f"mlp.{name}_proj.weight"] = Target(ours + ("mlp", name), (f, e),
                                                        _transpose)
        out[p + "mlp.down_proj.weight"] = Target(ours + ("mlp", "down"), (e, f), _transpose)
        for hf_name, mine in norms.items():
            out[p + f"{hf_name}.weight"] = Target(ours + (mine, "scale"), (e,), _same)
    return out
