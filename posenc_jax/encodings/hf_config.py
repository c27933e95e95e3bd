"""Read RoPE settings from a Hugging Face transformers `config.json` dict, as transformers does.

Both generations of the format are read:

* transformers 4.x: `rope_scaling` = {"type" | "rope_type": ..., ...} next to top-level
  `rope_theta` and `partial_rotary_factor`;
* transformers 5.x: `rope_parameters` = {"rope_type": ..., "rope_theta": ..., ...}.

What is read, in transformers' order of priority (checked against transformers 4.57.6 and
5.24.0 by tests/test_hf_config.py on numbers written by scripts/make_hf_golden.py):

* the scaling dict: `rope_scaling` if present and non-empty, else `rope_parameters`;
* base: the dict's `rope_theta`, else top-level `rope_theta`, else 10000;
* rotary_dim = int(head_dim * partial_rotary_factor), head_dim = `qk_rope_head_dim` (MLA models:
  DeepSeek-V2/V3, whose config class sets head_dim to it), else `head_dim`, else
  hidden_size // num_attention_heads; partial_rotary_factor from the dict, else top level, else
  GPT-NeoX's `rotary_pct`, else 1;
* original_max_position_embeddings for YaRN / LongRoPE / Llama-3: a TOP-LEVEL value wins over
  the dict's (transformers 5.x; Phi-3 keeps it there), else the dict's, else (YaRN, LongRoPE)
  max_position_embeddings. Llama-3 without it is an error here (4.x raises too; 5.x silently
  uses max_position_embeddings);
* dynamic NTK's original length is always `max_position_embeddings` (transformers ignores an
  `original_max_position_embeddings` in a dynamic dict; we warn if one is there and differs).

Model-class defaults that a config.json may omit (e.g. Phi-3's original length 4096) are not
known here: pass the dict with the fields the checkpoint ships.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from posenc_jax.checks import finite_float
from posenc_jax.encodings import rope_scaling
from posenc_jax.encodings.rope_scaling import get_mscale, method, resolve_type, validate

_DEFAULT_THETA = 10000.0


def _scaling_dict(config: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict (a parsed config.json), got "
                        f"{type(config).__name__}")
    raw = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(raw, Mapping):
        raise TypeError(f"rope_scaling / rope_parameters must be a dict, got {raw!r}")
    nested = sorted(k for k, v in raw.items() if isinstance(v, Mapping))
    if nested:
        raise ValueError(f"rope_parameters is nested per layer type {nested}; pass the config "
                         "with one of those dicts as its rope_parameters")
    return dict(raw)


def _head_dim(config: Mapping[str, Any]) -> int:
    for key in ("qk_rope_head_dim", "head_dim"):
        if config.get(key):
            return int(config[key])
    try:
        return int(config["hidden_size"]) // int(config["num_attention_heads"])
    except KeyError as err:
        raise ValueError(f"config needs head_dim (or hidden_size and num_attention_heads); "
                         f"missing {err}") from None


def rope_kwargs_from_hf_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `rope` encoding's hyperparameters for a transformers config.json dict.

    Returns {"head_dim", "rotary_dim", "base", "scaling" (a validated dict or None),
    "max_position_embeddings" (or None)}, so that
    `posenc_jax.get("rope", **rope_kwargs_from_hf_config(cfg))` matches transformers.
    """
    raw = _scaling_dict(config)
    base = raw.pop("rope_theta", None)
    if base is None:
        base = config.get("rope_theta")
    if base is None:
        base = _DEFAULT_THETA
    base = finite_float("rope_theta", base, above=0)
    prf = raw.pop("partial_rotary_factor", None)
    for key in ("partial_rotary_factor", "rotary_pct"):
        if prf is None:
            prf = config.get(key)
    prf = 1.0 if prf is None else finite_float("partial_rotary_factor", prf, above=0)
    head_dim = _head_dim(config)
    rotary_dim = int(head_dim * prf)
    if rotary_dim % 2 or not 2 <= rotary_dim <= head_dim:
        raise ValueError(f"rotary dim int(head_dim * partial_rotary_factor) = int({head_dim} * "
                         f"{prf:g}) = {rotary_dim} must be even and in [2, {head_dim}]")
    max_len = config.get("max_position_embeddings")
    record = method(resolve_type(raw) if raw else "default")
    key = "original_max_position_embeddings"
    if record.hf_original_is_max and max_len is not None:
        if raw.get(key) not in (None, max_len):
            warnings.warn(f"dynamic NTK: transformers ignores rope_scaling's {key}="
                          f"{raw[key]} and uses max_position_embeddings={max_len}; so do we",
                          UserWarning, stacklevel=2)
        raw[key] = max_len
    elif key in record.keys and not record.hf_original_is_max and config.get(key) is not None:
        if raw.get(key) not in (None, config[key]):
            warnings.warn(f"config has {key}={config[key]} at the top level and "
                          f"{raw[key]} in its rope dict; the top-level value wins, as in "
                          "transformers 5.x", UserWarning, stacklevel=2)
        raw[key] = config[key]
    # validated once, here (it warns on stray keys); a method with no keys is plain RoPE
    scaling = validate(raw or {"rope_type": "default"}, rotary_dim=rotary_dim,
                       max_position_embeddings=max_len)
    scaling = scaling if record.keys else None
    return {"head_dim": head_dim, "rotary_dim": rotary_dim, "base": base, "scaling": scaling,
            "max_position_embeddings": None if max_len is None else int(max_len)}


def from_hf_config(config: Mapping[str, Any], *, seq_len=None):
    """(inv_freq float32 [R], attention_factor float32 []) as transformers computes them for
    this config.json dict; seq_len as in `rope_scaling.frequencies` (dynamic, longrope)."""

    kwargs = rope_kwargs_from_hf_config(config)
    return rope_scaling.frequencies(
        kwargs["scaling"], rotary_dim=kwargs["rotary_dim"], base=kwargs["base"],
        seq_len=seq_len, max_position_embeddings=kwargs["max_position_embeddings"])


def softmax_scale_factor(config: Mapping[str, Any]) -> float:
    """The extra softmax-scale multiplier of the MLA family (DeepSeek-V2/V3 and relatives in
    transformers 5.x): get_mscale(factor, mscale_all_dim)^2 when the RoPE dict is scaled and
    has a non-zero `mscale_all_dim`, else 1. It multiplies 1 / sqrt(qk_head_dim) and is NOT
    part of the RoPE attention_factor (transformers 4.57's DeepSeek-V2 omitted it)."""

    raw = _scaling_dict(config)
    if "mscale_all_dim" not in method(resolve_type(raw)).keys or not raw.get("mscale_all_dim"):
        return 1.0
    return get_mscale(float(raw["factor"]), float(raw["mscale_all_dim"])) ** 2
