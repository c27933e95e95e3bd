"""Read RoPE settings from a Hugging Face transformers `config.json` dict, as transformers does.

Both generations of the format are read: transformers 4.x (`rope_scaling` next to top-level
`rope_theta` / `partial_rotary_factor`) and 5.x (`rope_parameters`, possibly keyed by layer
type). Beyond one global RoPE:

* per-layer RoPE (Gemma 3, Gemma 4 incl. `proportional` and `global_head_dim`): pass
  `layer_type=`; `layer_encodings_from_hf` / `transformer_config_kwargs` build a
  `TransformerConfig` with one encoding per layer;
* multimodal RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL interleaved): the `mrope` encoding;
* DeepSeek-V3's MLA layout: the kwargs carry `layout="interleaved"` (rope_interleave) and
  `rotate_like_hf` handles the pass-through prefix and the de-interleaved output;
* model-class defaults (GPT-NeoX's rotary_emb_base / rotary_pct 0.25, StableLM's 0.25, Phi-3's
  original length 4096, Llama-style models ignoring partial_rotary_factor for the default
  RoPE) follow `model_type`; a dict that is ambiguous without one is refused.

The reading order and the transformers behaviours mirrored (or refused) are documented in
`posenc_jax.encodings.hf.read` and the README's "Hugging Face models" section; parity is
tested on numbers written by scripts/make_hf_golden.py (transformers 4.57.6 and 5.24.0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc_jax.encodings import rope_scaling
from posenc_jax.encodings.hf.layers import layer_encodings_from_hf, transformer_config_kwargs
from posenc_jax.encodings.hf.read import LayerRope, read_layer
from posenc_jax.encodings.hf.rotate import encoding_for_layer, rotate_like_hf
from posenc_jax.encodings.rope_scaling import get_mscale

__all__ = [
    "LayerRope",
    "encoding_for_layer",
    "encoding_from_hf_config",
    "from_hf_config",
    "layer_encodings_from_hf",
    "read_layer",
    "rope_kwargs_from_hf_config",
    "rotate_like_hf",
    "softmax_scale_factor",
    "transformer_config_kwargs",
]

_ROPE_KEYS = ("head_dim", "rotary_dim", "base", "scaling", "max_position_embeddings", "layout")


def rope_kwargs_from_hf_config(config: Mapping[str, Any], *,
                               layer_type: str | None = None) -> dict[str, Any]:
    """The `rope` encoding's hyperparameters for a transformers config.json dict (one layer
    type of a per-layer model; the text-only RoPE of a multimodal model).

    Returns {"head_dim", "rotary_dim", "base", "scaling" (a validated dict or None),
    "max_position_embeddings" (or None), "layout"}, so that
    `posenc_jax.get("rope", **rope_kwargs_from_hf_config(cfg))` matches transformers.
    DeepSeek (MLA): head_dim is qk_rope_head_dim, the rotary part, which transformers puts
    after the qk_nope_head_dim pass-through features.
    """
    kwargs = read_layer(config, layer_type).kwargs
    return {key: kwargs[key] for key in _ROPE_KEYS}


def encoding_from_hf_config(config: Mapping[str, Any], *,
                            layer_type: str | None = None) -> tuple[str, dict[str, Any]]:
    """(encoding name, kwargs): ("mrope", ...) for multimodal RoPE models, else ("rope", ...)."""
    layer = read_layer(config, layer_type)
    return layer.encoding, dict(layer.kwargs)


def from_hf_config(config: Mapping[str, Any], *, seq_len=None, layer_type: str | None = None):
    """(inv_freq float32 [R], attention_factor float32 []) as transformers' rotary module
    computes them for this config.json dict; seq_len as in `rope_scaling.frequencies`."""
    kwargs = rope_kwargs_from_hf_config(config, layer_type=layer_type)
    return rope_scaling.frequencies(
        kwargs["scaling"], rotary_dim=kwargs["rotary_dim"], base=kwargs["base"],
        seq_len=seq_len, max_position_embeddings=kwargs["max_position_embeddings"])


def softmax_scale_factor(config: Mapping[str, Any], *, layer_type: str | None = None) -> float:
    """The extra softmax-scale multiplier of the MLA family (DeepSeek-V2/V3 and relatives in
    transformers 5.x): get_mscale(factor, mscale_all_dim)^2 when the RoPE dict is scaled and
    has a non-zero `mscale_all_dim`, else 1. It multiplies 1 / sqrt(qk_head_dim) and is NOT
    part of the RoPE attention_factor (transformers 4.57's DeepSeek-V2 omitted it).
    The dict is read and validated as `rope_kwargs_from_hf_config` reads it (a YaRN `factor`
    inferred from the two lengths included)."""
    scaling = rope_kwargs_from_hf_config(config, layer_type=layer_type)["scaling"]
    if not scaling or not scaling.get("mscale_all_dim"):
        return 1.0
    return get_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2
