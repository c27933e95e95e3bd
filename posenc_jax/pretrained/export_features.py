"""The features only some families' config.json can hold, and which family holds which.

    FEATURES["sinks"](cfg)  -> "attention_sinks=True" when the model uses it, else None

gpt-oss's learned sinks and o_proj bias, Llama 4's chunks, QK L2-norm and query temperature
(StreamingLLM's sink tokens: no family) -- an export as a family whose config.json has no key
for one would drop it without a word. A family lists what it holds in `Family.expresses` (and
"nope" for NoPE layers, checked with the encodings); `unheld` says what a model uses that its
family does not hold, naming the families that do.
"""

from __future__ import annotations

from typing import Any

from posenc_jax.pretrained.families import FAMILIES

__all__ = ["FEATURES", "unheld"]

FEATURES = {
    "sinks": lambda cfg: "attention_sinks=True" if cfg.attention_sinks else None,
    "sink_tokens": lambda cfg: f"sink_tokens={cfg.sink_tokens}" if cfg.sink_tokens else None,
    "o_bias": lambda cfg: "o_bias=True" if cfg.o_bias else None,
    "chunk": lambda cfg: "attention_chunk" if any(
        s.chunk is not None for s in cfg.layer_specs) else None,
    "qk_l2_norm": lambda cfg: "qk_l2_norm" if any(s.qk_l2_norm for s in cfg.layer_specs)
    else None,
    "temperature": lambda cfg: "attn_temperature" if any(
        s.temperature is not None for s in cfg.layer_specs) else None,
}


def unheld(cfg: Any, family: Any) -> tuple[str, str] | None:
    """(the features `cfg` uses that `family` (or, None, any family) cannot hold, why), or None
    when it holds them all: the two halves of the exporter's refusal."""
    can = frozenset() if family is None else family.expresses
    found = {name: FEATURES[name](cfg) for name in FEATURES
             if FEATURES[name](cfg) is not None and name not in can}
    if not found:
        return None
    target = f"model_type={family.model_type!r}" if family is not None else "the family"
    where = "; ".join(
        f"{label}: {', '.join(f.model_type for f in FAMILIES if n in f.expresses) or 'none'}"
        for n, label in found.items())
    why = (f"(gpt-oss / Llama 4 features): {target} has no config key for it (the families "
           f"that have one: {where})")
    return ", ".join(found.values()), why
