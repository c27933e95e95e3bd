"""Qwen3-MoE: Qwen3 (QK-norm, no qkv bias) whose MLPs are mixtures of experts (`model.moe`):
softmax over all experts, top k, renormalised when `norm_topk_prob` (the class default: not);
layer i is sparse unless it is in `mlp_only_layers` or (i + 1) % `decoder_sparse_step` != 0
(those keep the dense MLP of `intermediate_size`).

    model.layers.N.mlp.gate.weight                  [X, E]  -> mlp.router [E, X]   transpose
    model.layers.N.mlp.experts.J.{gate,up}_proj     [F, E]  -> mlp.gate / mlp.up [X, E, F]
    model.layers.N.mlp.experts.J.down_proj          [E, F]  -> mlp.down [X, F, E]

(J = 0 .. X-1, seen stacked: `posenc_jax.pretrained.experts`; X = `num_experts`, which
transformers 5 saves as `num_local_experts`; F = `moe_intermediate_size`; k =
`num_experts_per_tok`). The load-balancing loss coefficient stays 0 (`router_aux_loss_coef` acts
in transformers only with `output_router_logits`): set `moe_aux_loss_coef` to fine-tune with it.

GGUF (llama.cpp's `qwen3moe`: every layer sparse): `blk.N.ffn_gate_inp` is the router,
`ffn_{gate,up,down}_exps` [X, F, E] / [X, E, F] the stacked experts (already the stacks'
names), `expert_count`, `expert_used_count`, `expert_feed_forward_length` the MoE keys;
norm_topk_prob is true there (llama.cpp's qwen3moe graph renormalises; transformers' GGUF
default too). transformers 5.25 does not read `expert_feed_forward_length` (its experts stay at
the class's 768 and the load fails on their shapes); here it is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc_jax.checks import boolean, integer, json_count
from posenc_jax.pretrained.families import llama, qwen2, qwen3
from posenc_jax.pretrained.families.record import GGUF, Family, Row
from posenc_jax.pretrained.families.transforms import EXPERTS_TRANSPOSE, TRANSPOSE

__all__ = ["EXPERTS", "FAMILY", "expert_rows", "read_keys", "write_keys"]

MLP = ("layers", "{i}", "mlp")


def expert_rows(prefix: str, projections: tuple[tuple[str, str], ...]) -> tuple[Row, ...]:
    """The router `<prefix>gate.weight` -> mlp.router and the stacked experts
    `<prefix>experts.*.<theirs>.weight` -> mlp.<ours> for (theirs, ours) in `projections`,
    on the MoE layers only (`Row.moe`; the dense layers of `mlp_only_layers` keep
    `llama.MLP`'s rows)."""
    return (Row(f"{prefix}gate.weight", ((*MLP, "router"),), TRANSPOSE, moe=True),
            *(Row(f"{prefix}experts.*.{theirs}.weight", ((*MLP, ours),), EXPERTS_TRANSPOSE,
                  moe=True) for theirs, ours in projections))


EXPERTS = expert_rows(f"{llama.LAYER}mlp.", (("gate_proj", "gate"), ("up_proj", "up"),
                                             ("down_proj", "down")))


def read_keys(flat: Mapping[str, Any], out: dict, where: Any) -> None:
    """The TransformerConfig MoE kwargs of a Qwen3-MoE config.json into `out` (module
    docstring); none for a config without experts."""
    n = flat.get("num_local_experts", flat.get("num_experts", 128))
    n = 0 if n == 0 else json_count("num_experts", n)
    if not n:
        return
    layers = json_count("num_hidden_layers", flat["num_hidden_layers"])
    step = json_count("decoder_sparse_step", flat["decoder_sparse_step"])
    dense = {integer("mlp_only_layers[]", i) for i in flat.get("mlp_only_layers") or ()}
    sparse = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
    norm = boolean("norm_topk_prob", flat["norm_topk_prob"])
    out.update(num_experts=n,
               experts_per_token=json_count("num_experts_per_tok", flat["num_experts_per_tok"]),
               moe_mlp_dim=json_count("moe_intermediate_size", flat["moe_intermediate_size"]),
               router="softmax_topk_norm" if norm else "softmax_topk",
               moe_layers=None if len(sparse) == layers else sparse)


def write_keys(cfg: Any, out: dict) -> None:
    """The config.json keys of `cfg`'s experts into the draft `out` (read back by
    `read_keys`)."""
    sparse = range(cfg.num_layers) if cfg.moe_layers is None else cfg.moe_layers
    out.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
               moe_intermediate_size=cfg.moe_mlp_dim,
               norm_topk_prob=cfg.router == "softmax_topk_norm", decoder_sparse_step=1,
               mlp_only_layers=[i for i in range(cfg.num_layers) if i not in sparse])


GGUF_BLOCK = {**llama.GGUF_BLOCK, "ffn_gate_inp": "mlp.gate",
              **{f"ffn_{x}_exps": f"mlp.experts.*.{x}_proj" for x in ("gate", "up", "down")}}
GGUF_KEYS = {**llama.GGUF_KEYS, "attention.key_length": "head_dim",
             "expert_count": "num_experts", "expert_used_count": "num_experts_per_tok",
             "expert_feed_forward_length": "moe_intermediate_size"}

FAMILY = Family(
    model_type="qwen3_moe",
    defaults={**qwen3.FAMILY.defaults, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "norm_topk_prob": False, "moe_intermediate_size": 768, "num_experts_per_tok": 8},
    hf_tensors=qwen3.FAMILY.hf_tensors + EXPERTS,
    export_class="Qwen3MoeForCausalLM",
    qk_norm=True,
    windows="qwen",
    gguf=GGUF(arch="qwen3moe", keys=GGUF_KEYS,
              defaults={**qwen2.GGUF_DEFAULTS, "head_dim": 128, "attention_bias": False,
                        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                        "moe_intermediate_size": 768, "num_experts_per_tok": 8},
              block=GGUF_BLOCK, top=llama.GGUF_TOP, complete=qwen2.all_full),
    claims=lambda cfg: cfg.qk_norm and cfg.num_experts > 0,
    read_keys=read_keys,
    write_keys=write_keys,
)
