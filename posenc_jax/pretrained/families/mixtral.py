"""Mixtral: Mistral (a sliding window on every layer when `sliding_window` is set) whose every
MLP is a mixture of `num_local_experts` experts of width `intermediate_size`: softmax over all
experts, top `num_experts_per_tok`, renormalised (`model.moe`'s "softmax_topk_norm").

    model.layers.N.block_sparse_moe.gate.weight           [X, E] -> mlp.router [E, X]
    model.layers.N.block_sparse_moe.experts.J.w1 / w3     [F, E] -> mlp.gate / mlp.up [X, E, F]
    model.layers.N.block_sparse_moe.experts.J.w2          [E, F] -> mlp.down [X, F, E]

(J = 0 .. X-1, seen stacked: `posenc_jax.pretrained.experts`.) `router_jitter_noise` acts in
transformers only in training mode and is not read; the load-balancing coefficient stays 0 as
for Qwen3-MoE. No GGUF reader here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc_jax.checks import json_count
from posenc_jax.pretrained.families import llama, mistral
from posenc_jax.pretrained.families.qwen3_moe import expert_rows
from posenc_jax.pretrained.families.record import Family

__all__ = ["EXPERTS", "FAMILY", "read_keys", "write_keys"]

EXPERTS = expert_rows(f"{llama.LAYER}block_sparse_moe.", (("w1", "gate"), ("w3", "up"),
                                                          ("w2", "down")))


def read_keys(flat: Mapping[str, Any], out: dict, where: Any) -> None:
    """The TransformerConfig MoE kwargs of a Mixtral config.json into `out` (every layer
    sparse)."""
    out.update(num_experts=json_count("num_local_experts", flat["num_local_experts"]),
               experts_per_token=json_count("num_experts_per_tok", flat["num_experts_per_tok"]),
               moe_mlp_dim=json_count("intermediate_size", flat["intermediate_size"]),
               router="softmax_topk_norm")


def write_keys(cfg: Any, out: dict) -> None:
    """The config.json keys of `cfg`'s experts into the draft `out` (read back by
    `read_keys`)."""
    out.update(num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
               intermediate_size=cfg.moe_mlp_dim)


FAMILY = Family(
    model_type="mixtral",
    defaults={**llama.FAMILY.defaults, "rms_norm_eps": 1e-5, "sliding_window": None,
              "num_local_experts": 8, "num_experts_per_tok": 2},
    hf_tensors=llama.EMBED_HEAD + llama.ATTENTION + llama.NORMS + EXPERTS,
    export_class="MixtralForCausalLM",
    windows=mistral.FAMILY.windows,
    claims=lambda cfg: cfg.num_experts > 0 and cfg.moe_layers is None,
    read_keys=read_keys,
    write_keys=write_keys,
)
