"""Llama 4 text (`llama4_text`, `Llama4ForCausalLM`): chunked RoPE layers with the QK L2-norm,
NoPE global layers with the query temperature, dense and MoE layers interleaved, a shared
expert, the sigmoid top-k router.

    Hugging Face name                                       -> our param            layout
    model.layers.N.feed_forward.gate/up_proj.weight [F', E] -> mlp.gate / mlp.up    transpose
    model.layers.N.feed_forward.down_proj.weight  [E, F']   -> mlp.down             transpose
      (dense layers, F' = intermediate_size_mlp)
    model.layers.N.feed_forward.router.weight     [X, E]    -> mlp.router [E, X]    transpose
    model.layers.N.feed_forward.experts.gate_up_proj [X, E, 2F]
                                                -> mlp.gate, mlp.up [X, E, F]       halves
    model.layers.N.feed_forward.experts.down_proj [X, F, E] -> mlp.down [X, F, E]   same
    model.layers.N.feed_forward.shared_expert.gate/up/down_proj.weight
                                                -> mlp.shared.gate / up / down      transpose
      (MoE layers, F = intermediate_size for the experts and the shared expert)
    (embeddings, lm_head, q / k / v / o and the two norms as Llama's; q / k / v / o biases
    with `attention_bias`)

Config (transformers 5.x `Llama4TextConfig`): layer i rotates iff `no_rope_layers[i]` (default:
every `no_rope_layer_interval`-th layer, 4, is NoPE); `layer_types` (default: "chunked_attention"
on the RoPE layers when `attention_chunk_size` is set) gives the chunks; `use_qk_norm` puts the
weightless L2-norm on q and k of the RoPE layers; `attn_temperature_tuning` (true, or a
non-zero int: the published configs carry 4) scales the NoPE layers' queries by log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1 (p: the query's
position; transformers uses the token's index in its cache, the same for one unpacked sequence);
`moe_layers` (default: every `interleave_moe_layer_step`-th layer) run the experts, the others
the dense MLP. RoPE is the interleaved (complex-pair) layout, with the llama3 scaling of the
published configs, low_freq_factor == high_freq_factor included (`posenc_jax.encodings.hf`).
The multimodal `llama4` checkpoints (`Llama4ForConditionalGeneration`: the text model under
`language_model.`, its `text_config` read) load their text model, the vision model and projector
ignored; an export writes the text model (`Llama4ForCausalLM`). No GGUF reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc_jax.checks import boolean, finite_float, integer, json_count
from posenc_jax.pretrained.families import gpt_oss, llama, qwen2
from posenc_jax.pretrained.families.moe_keys import moe_kwargs, refuse_quantized, single
from posenc_jax.pretrained.families.record import Family, Row, refuse
from posenc_jax.pretrained.families.transforms import SAME, TRANSPOSE

__all__ = ["FAMILY", "layer_pattern"]

FF = llama.LAYER + "feed_forward."
MLP = ("layers", "{i}", "mlp")
DENSE = tuple(Row(f"{FF}{x}_proj.weight", ((*MLP, x),), TRANSPOSE, moe=False)
              for x in ("gate", "up", "down"))
EXPERTS = (
    Row(FF + "router.weight", ((*MLP, "router"),), TRANSPOSE, moe=True),
    Row(FF + "experts.gate_up_proj", ((*MLP, "gate"), (*MLP, "up")), SAME, split="halves",
        moe=True),
    Row(FF + "experts.down_proj", ((*MLP, "down"),), SAME, moe=True),
    *(Row(f"{FF}shared_expert.{x}_proj.weight", ((*MLP, "shared", x),), TRANSPOSE, moe=True)
      for x in ("gate", "up", "down")),
)


def _per_layer(flat: Mapping[str, Any], key: str, n: int, where: Any) -> list | None:
    values = flat.get(key)
    if values is None or values == []:
        return None
    if isinstance(values, (str, Mapping)) or len(values) != n:
        raise refuse(where, key, values, f"one entry per layer (num_hidden_layers={n})")
    return list(values)


def layer_pattern(flat: Mapping[str, Any], n: int, where: Any) -> tuple[list[dict], dict | None]:
    """(one `layer_pattern` entry per layer, the `attn_temperature` or None) from the config
    (module docstring)."""
    interval = json_count("no_rope_layer_interval", flat.get("no_rope_layer_interval", 4))
    ropes = _per_layer(flat, "no_rope_layers", n, where) or [
        int((i + 1) % interval != 0) for i in range(n)]
    ropes = [bool(integer(f"no_rope_layers[{i}]", r, minimum=0, maximum=1))
             for i, r in enumerate(ropes)]
    chunk = flat.get("attention_chunk_size")
    chunk = None if chunk is None else json_count("attention_chunk_size", chunk)
    types = _per_layer(flat, "layer_types", n, where) or [
        "chunked_attention" if r and chunk is not None else "full_attention" for r in ropes]
    for t in types:
        if t not in ("chunked_attention", "full_attention"):
            raise refuse(where, "layer_types", types, "entries 'chunked_attention' or "
                         "'full_attention'")
    if "chunked_attention" in types and chunk is None:
        raise refuse(where, "attention_chunk_size", None, "layer_types has chunked layers")
    qk_norm = boolean("use_qk_norm", flat.get("use_qk_norm", True))
    tuning = flat.get("attn_temperature_tuning", True)
    # the published Scout / Maverick configs carry 4 (Meta's own value; transformers 4.x reads
    # it as true, 5.x's strict config refuses it): an int is on unless 0
    tuning = (integer("attn_temperature_tuning", tuning, minimum=0) != 0
              if isinstance(tuning, int) and not isinstance(tuning, bool)
              else boolean("attn_temperature_tuning", tuning))
    pattern = []
    for rope, kind in zip(ropes, types):
        entry: dict = {} if rope else {"encoding": "nope"}
        if kind == "chunked_attention":
            entry["chunk"] = chunk
        if rope and qk_norm:
            entry["qk_l2_norm"] = True
        if tuning and not rope:
            entry["temperature"] = True
        pattern.append(entry)
    temperature = None
    if tuning and not all(ropes):
        temperature = {"floor_scale": finite_float("floor_scale", flat.get("floor_scale", 8192),
                                                   above=0.0),
                       "attn_scale": finite_float("attn_scale", flat.get("attn_scale", 0.1))}
    return pattern, temperature


def moe_layers(flat: Mapping[str, Any], n: int) -> tuple[int, ...]:
    """`moe_layers`, else every `interleave_moe_layer_step`-th layer (from step - 1)."""
    given = flat.get("moe_layers")
    if given is not None:
        return tuple(integer(f"moe_layers[{j}]", i, minimum=0, maximum=n - 1)
                     for j, i in enumerate(given))
    step = json_count("interleave_moe_layer_step", flat.get("interleave_moe_layer_step", 1))
    return tuple(range(step - 1, n, step))


def read_keys(flat: Mapping[str, Any], out: dict, where: Any) -> None:
    """The layer pattern, the query temperature and the MoE (module docstring)."""
    refuse_quantized(flat, where)
    n = out["num_layers"]
    pattern, temperature = layer_pattern(flat, n, where)
    layers = moe_layers(flat, n)
    experts_dim = out["mlp_dim"]  # intermediate_size: the experts' and the shared expert's
    dense = flat.get("intermediate_size_mlp", 16384)
    out.update(layer_pattern=pattern, attn_temperature=temperature,
               mlp_dim=json_count("intermediate_size_mlp", dense) if len(layers) < n
               else experts_dim,
               **moe_kwargs(flat, where), moe_mlp_dim=experts_dim, router="sigmoid_topk",
               shared_expert_mlp_dim=experts_dim, moe_layers=layers)


def write_keys(cfg: Any, out: dict) -> None:
    """Llama 4's keys for `cfg` (read back by `read_keys` and compared by the exporter)."""
    specs = cfg.layer_specs
    temperature = single("floor_scale / attn_scale", [s.temperature for s in specs])
    floor, scale = temperature or (8192, 0.1)
    out.update(
        attention_bias=cfg.o_bias, no_rope_layers=[int(s.encoding[0] != "nope") for s in specs],
        layer_types=["full_attention" if s.chunk is None else "chunked_attention"
                     for s in specs],
        attention_chunk_size=single("attention_chunk_size", [s.chunk for s in specs]),
        use_qk_norm=any(s.qk_l2_norm for s in specs),
        attn_temperature_tuning=temperature is not None,
        floor_scale=int(floor) if float(floor).is_integer() else floor, attn_scale=scale,
        intermediate_size=cfg.moe_mlp_dim or cfg.mlp_dim, intermediate_size_mlp=cfg.mlp_dim,
        num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
        moe_layers=[i for i, s in enumerate(specs) if s.moe],
        output_router_logits=cfg.moe_aux_loss_coef > 0,
        router_aux_loss_coef=cfg.moe_aux_loss_coef or 0.001)


FAMILY = Family(
    model_type="llama4_text",
    aliases=("llama4",),
    defaults={"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu",
              "num_local_experts": 16, "num_experts_per_tok": 1, "intermediate_size": 8192},
    hf_tensors=(llama.EMBED_HEAD + llama.ATTENTION + qwen2.QKV_BIAS + (gpt_oss.O_BIAS,) + DENSE
                + EXPERTS + llama.NORMS),
    export_class="Llama4ForCausalLM",
    attention_bias=True,
    expresses=frozenset({"o_bias", "nope", "chunk", "qk_l2_norm", "temperature"}),
    read_keys=read_keys,
    write_keys=write_keys,
)
