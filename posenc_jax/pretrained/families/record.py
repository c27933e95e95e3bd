"""One model family as one record: what a loader, a GGUF reader and an exporter need to know.

Each family lives in its own module beside this one (`llama.py`, `mistral.py`, `qwen2.py`,
`qwen3.py`, `gemma.py`, `gemma3.py`, `phi3.py`, `qwen3_moe.py`, `mixtral.py`, `gpt_oss.py`,
`llama4.py`), in the style of jax-ml/bonsai's `models/<family>/params.py`: one `Family` value
holding

- the config mapping: the model class's defaults for keys a config.json may omit, its
  activation key and names, qkv bias, QK-norm, the Gemma features and where its sliding
  windows go (read by `families.mapping.config_kwargs`), and for what no field says (a mixture
  of experts, per-layer patterns) one pair of hooks: `read_keys` (config.json -> kwargs) and
  `write_keys` (the same keys written on export);
- the Hugging Face tensor table: checkpoint name -> our param path(s) and layout
  (`Row`; a row with several paths is a fused tensor, split on load and fused on export; a
  `*` in its name is a per-expert tensor, seen stacked; `Row.moe` keeps the rows of dense and
  MoE layers apart);
- the GGUF architecture, its metadata keys, the config class defaults transformers writes, its
  tensor names and their fixes (llama.cpp's permuted q/k rows, Gemma's stored `1 + w`);
- the transformers class it exports as, and when an export chooses it by the model's features.

`families.registry` is the one place that lists the records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from posenc_jax.pretrained.families.transforms import Layout

__all__ = ["GGUF", "SPLITS", "Family", "Row", "refuse"]

SPLITS = ("rows", "halves", "alternate")


def refuse(where: Any, key: str, value: Any, allowed: str) -> ValueError:
    """The ValueError for a config setting a record cannot compute, naming `where` (the
    checkpoint), the key, its value and what is allowed (the mapping's and every hook's)."""
    return ValueError(f"{where}: config {key}={value!r} is not supported here ({allowed})")


@dataclasses.dataclass(frozen=True)
class Row:
    """One checkpoint tensor: its Hugging Face name (`{i}`: the layer; written as in a plain
    causal LM, "model." / "lm_head." being moved under a multimodal prefix by the loader), the
    param path(s) it fills (`{i}` again) and the layout of each part. How the stored tensor is
    cut into our params:

    - one path: the whole tensor; a `*` in the name (`...experts.*.w1.weight`): stored one
      tensor per expert, seen stacked over the experts [X, ...] (`pretrained.experts`);
    - several paths: the tensor is their Hugging Face forms joined as `split` says:

        "rows"       concatenated along axis 0 (Phi-3's qkv_proj, gate_up_proj)
        "halves"     concatenated along the last axis (Llama 4's experts.gate_up_proj
                     [X, E, 2F]: gate = [..., :F], up = [..., F:])
        "alternate"  interleaved along the last axis (gpt-oss's experts.gate_up_proj and its
                     bias: gate = [..., 0::2], up = [..., 1::2])

    moe: which layers the row belongs to -- None (any layer that has the params), True (only
    the layers whose MLP is the mixture of experts: `LayerSpec.moe`), False (only the dense
    ones). Dense and MoE layers share param names (`mlp.gate` is [E, F] in one, [X, E, F] in
    the other: Qwen3-MoE's `mlp_only_layers`, Llama 4's interleaving), so the MLP rows of
    such layers say which they are (`llama.MLP`, Phi-3's gate_up_proj: False; the routers and
    experts of Qwen3-MoE, Mixtral and Llama 4: True) and neither kind claims the other's
    params (gpt-oss, all layers experts, leaves its rows None)."""

    hf: str
    paths: tuple[tuple[str, ...], ...]
    layout: Layout
    split: str = "rows"
    moe: bool | None = None

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ValueError(f"Row {self.hf}: split={self.split!r}, valid: {SPLITS}")


@dataclasses.dataclass(frozen=True)
class GGUF:
    """A family's GGUF side (transformers 5.24's reading of llama.cpp's files).

    arch: `general.architecture`; name: a `general.name` that selects this family over the
    arch's default one (transformers' rule for Mistral), None for the default;
    keys: `<arch>.<key>` -> config.json key; defaults: what the config class writes into
    config.json when not given; block / top: GGUF tensor part -> Hugging Face part;
    fixes: GGUF block part -> fn(w [HF layout] float32, config dict) -> w as transformers holds
    it; complete: fn(config dict, rope_theta) filling the family's per-layer settings."""

    arch: str
    keys: Mapping[str, str]
    defaults: Mapping[str, Any]
    block: Mapping[str, str]
    top: Mapping[str, str]
    fixes: Mapping[str, Callable[[np.ndarray, Mapping[str, Any]], np.ndarray]] = (
        dataclasses.field(default_factory=dict))
    complete: Callable[[dict, float], None] | None = None
    name: str | None = None


@dataclasses.dataclass(frozen=True)
class Family:
    """A model family (see the module docstring).

    model_type: config.json's `model_type` (what export writes); aliases: other model_types
    read the same way (Gemma 3's multimodal `gemma3`, whose text_config is read);
    defaults: the model class's values for keys config.json may omit;
    activation_key / activations: the config key naming the MLP activation, and its values ->
    our `mlp_activation`; qkv_bias, qk_norm: fixed by the class; attention_bias: the class
    reads config.json's `attention_bias` as biases on q, k, v AND o (gpt-oss; a family without
    it refuses a true `attention_bias`); sinks: a learned sink logit per head (gpt-oss);
    gemma: (1 + w) norms, post-norms, sqrt(E) embeddings, query_pre_attn_scalar, soft-cap;
    scaled: sqrt(E) embeddings and (1 + w) norms only (Gemma 1);
    windows: "none", "all" (every layer, `sliding_window`), "qwen" (layers >=
    max_window_layers when use_sliding_window) or "layer_types" (the `layer_types` list);
    partial_rotary: the class rotates the first int(D * partial_rotary_factor) features;
    hf_tensors: the Hugging Face tensor table; gguf: the GGUF side or None;
    export_class: the transformers class written in `architectures`; rope_top_level: keys of
    the RoPE dict an export also writes at the top of config.json, where the class reads them
    first (Phi-3's original_max_position_embeddings);
    claims: fn(TransformerConfig) -> bool, whether an export without a named family picks this
    one (asked in the registry's order), None: only when named;
    expresses: the features beyond the shared decoder an export as this family can write
    (`export_features.FEATURES`: "sinks", "o_bias", "chunk", "qk_l2_norm", "temperature"; and
    "nope": NoPE layers), checked before any key is written; "sinks" / "o_bias" exactly when
    `sinks` / `attention_bias` (their keys write them back; a record that disagrees is refused);
    read_keys: the family's own config.json keys -> `TransformerConfig` kwargs, beyond what the
    fields above say: fn(flat config dict (class defaults filled in), kwargs so far, where)
    updating the kwargs in place -- the mixture of experts (num_experts, router, moe_layers,
    ...; `posenc_jax.model.moe`), per-layer patterns, a model's fixed constants -- and raising
    ValueError naming `where` and the key for a setting the model cannot compute; None: no
    keys of its own (`families.mapping.config_kwargs` calls it last);
    write_keys: its inverse for export: fn(TransformerConfig, config.json draft) writing those
    keys into the draft (`export_config` calls it last in its draft, then reads the draft back
    through `read_keys` and compares, so a key it gets wrong is a refusal, never a silent
    change); None exactly when `read_keys` is."""

    model_type: str
    defaults: Mapping[str, Any]
    hf_tensors: tuple[Row, ...]
    export_class: str
    aliases: tuple[str, ...] = ()
    activation_key: str = "hidden_act"
    activations: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: {"silu": "swiglu"})
    qkv_bias: bool = False
    qk_norm: bool = False
    attention_bias: bool = False
    sinks: bool = False
    gemma: bool = False
    scaled: bool = False
    windows: str = "none"
    partial_rotary: bool = False
    rope_top_level: tuple[str, ...] = ()
    gguf: GGUF | None = None
    claims: Callable[[Any], bool] | None = None
    expresses: frozenset[str] = frozenset()
    read_keys: Callable[[Mapping[str, Any], dict, Any], None] | None = None
    write_keys: Callable[[Any, dict], None] | None = None

    def __post_init__(self):
        if (self.read_keys is None) != (self.write_keys is None):
            raise ValueError(f"Family {self.model_type}: read_keys and write_keys come as a "
                             "pair (an export must write back what a load reads)")
        for feature, field, has in (("sinks", "sinks", self.sinks),
                                    ("o_bias", "attention_bias", self.attention_bias)):
            if has != (feature in self.expresses):  # the class's key writes it back
                raise ValueError(f"Family {self.model_type}: {field}={has} but {feature!r} "
                                 f"{'not ' if has else ''}in expresses")

    @property
    def norm_offset(self) -> float:
        """The offset of the family's stored norm weights: 1.0 for (1 + w) norms, else 0."""
        return 1.0 if self.gemma or self.scaled else 0.0
