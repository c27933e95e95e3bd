"""The config.json keys that mixture-of-experts families share, read once for their records.

    num_local_experts (or num_experts)  -> num_experts
    num_experts_per_tok                 -> experts_per_token
    router_aux_loss_coef                -> moe_aux_loss_coef, only with output_router_logits
                                           (transformers adds the auxiliary loss only then)

A quantized checkpoint (`quantization_config`, e.g. gpt-oss's MXFP4 `*_blocks` / `*_scales`
tensors) is refused, naming the method: load a dequantized (bfloat16) export. `single` is the
exporters' check that a per-layer setting has the one value a config.json key can hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc_jax.checks import finite_float, json_count
from posenc_jax.pretrained.families.record import refuse

__all__ = ["moe_kwargs", "refuse_quantized", "single"]


def single(key: str, values: Any) -> Any:
    """The one value among `values` (None when there is none); several: the exporter's
    ValueError naming the config key."""
    found = sorted({v for v in values if v is not None})
    if len(found) > 1:
        raise ValueError(f"cannot export this model as a transformers checkpoint: {key} would "
                         f"need several values {found}; a transformers config has one")
    return found[0] if found else None


def refuse_quantized(flat: Mapping[str, Any], where: Any) -> None:
    """ValueError for a config with a `quantization_config` (tensors we cannot read)."""
    quant = flat.get("quantization_config")
    if quant:
        method = quant.get("quant_method") if isinstance(quant, Mapping) else quant
        raise ValueError(f"{where}: config quantization_config (quant_method={method!r}) is "
                         "not supported: its experts are stored quantized (e.g. MXFP4 "
                         "*_blocks / *_scales); load a dequantized bfloat16 export")


def moe_kwargs(flat: Mapping[str, Any], where: Any) -> dict[str, Any]:
    """num_experts, experts_per_token and moe_aux_loss_coef from the shared keys."""
    key = "num_local_experts" if "num_local_experts" in flat else "num_experts"
    if flat.get(key) is None:
        raise refuse(where, key, flat.get(key), "a mixture-of-experts family needs its "
                     "number of experts")
    out = {"num_experts": json_count(key, flat[key]),
           "experts_per_token": json_count("num_experts_per_tok", flat["num_experts_per_tok"])}
    if out["experts_per_token"] > out["num_experts"]:
        raise refuse(where, "num_experts_per_tok", out["experts_per_token"],
                     f"at most {key}={out['num_experts']}")
    if flat.get("output_router_logits"):
        out["moe_aux_loss_coef"] = finite_float(
            "router_aux_loss_coef", flat.get("router_aux_loss_coef", 0.001), minimum=0.0)
    return out
