"""A searched candidate as a Hugging Face `rope_scaling` dict, and the model that runs it here.

    scaling = rope_scaling(best, step=0.01, original_max_position_embeddings=2048,
                           target_length=16384)
    lm = posenc_jax.pretrained.load(path, rope_scaling=scaling)     # or transformers, after
                                                                    # pretrained.save(lm, dir)

The dict is what transformers reads as `rope_type: "longrope"`: `long_factor` (the search's),
`short_factor` (ones, the original rotation within the original context, unless given),
`original_max_position_embeddings` and `factor` = target / original, from which transformers
and `posenc_jax.encodings.rope_scaling` derive the attention factor
sqrt(1 + ln(factor) / ln(original)). The start count n-hat has no transformers key:
`rope_scaling` refuses a candidate with start > 0 (search with `Space(starts=(0,))` to export);
`with_start(config, n)` runs one here (RoPE's `unscaled_start`); `with_frequency_table(config)`
reads the rotation of the scaled layers from params (the search's one compiled program).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from posenc_jax._frozen import thaw
from posenc_jax.checks import integer
from posenc_jax.encodings.rope import RoPE
from posenc_jax.model.config import TransformerConfig
from train.longrope.space import Candidate

__all__ = ["rope_scaling", "scaling_dict", "with_frequency_table", "with_scaling", "with_start"]


def scaling_dict(candidate: Candidate, *, step: float, original_max_position_embeddings: int,
                 target_length: int, short_factor: Sequence[float] | None = None
                 ) -> dict[str, Any]:
    """The longrope dict of `candidate`'s factors (its start count is not in it)."""
    original = integer("original_max_position_embeddings", original_max_position_embeddings,
                       minimum=1)
    target = integer("target_length", target_length, minimum=original + 1)
    long_factor = list(candidate.factors(step))
    short = [1.0] * len(long_factor) if short_factor is None else [float(f) for f in
                                                                    short_factor]
    if len(short) != len(long_factor):
        raise ValueError(f"short_factor has {len(short)} entries; long_factor has "
                         f"{len(long_factor)} (one per rotary pair)")
    return {"rope_type": "longrope", "long_factor": long_factor, "short_factor": short,
            "original_max_position_embeddings": original, "factor": target / original}


def rope_scaling(candidate: Candidate, *, step: float, original_max_position_embeddings: int,
                 target_length: int, short_factor: Sequence[float] | None = None
                 ) -> dict[str, Any]:
    """The Hugging Face rope_scaling dict of `candidate`; ValueError for a start count > 0."""
    if candidate.start:
        raise ValueError(
            f"cannot export start={candidate.start} as a Hugging Face rope_scaling: transformers"
            f"' longrope rotates every position with the same factors and has no key for the "
            f"first {candidate.start} positions kept at the original rotation (LongRoPE's "
            "n-hat); run it here (train.longrope.export.with_start) or search with starts=(0,)")
    return scaling_dict(candidate, step=step, target_length=target_length, short_factor=short_factor,
                        original_max_position_embeddings=original_max_position_embeddings)


def _map_encodings(config: TransformerConfig, fn) -> TransformerConfig:
    """`config` with the kwargs of every encoding it names replaced by `fn(kwargs dict,
    built encoding)`: the model's own, each of `layer_encodings`, and each of a `layer_pattern`
    that names encodings (the pattern then sets the layers: `layer_encodings` is dropped, as
    the config resolves it from the pattern again)."""
    default = fn(dict(thaw(config.encoding_kwargs) or {}), config.input_encoding)
    layers, pattern = config.layer_encodings, config.layer_pattern
    if layers is None:
        return dataclasses.replace(config, encoding_kwargs=default)
    new = [(name, fn(dict(thaw(kw) or {}), config.layer_encoding(i)))
           for i, (name, kw) in enumerate(layers)]
    if pattern and any("encoding" in dict(e) for e in pattern):
        entries = [{**thaw(e), **({"encoding": new[j]} if "encoding" in dict(e) else {})}
                   for j, e in enumerate(pattern)]
        return dataclasses.replace(config, encoding_kwargs=default, layer_encodings=None,
                                   layer_pattern=entries)
    return dataclasses.replace(config, encoding_kwargs=default, layer_encodings=new)


def with_start(config: TransformerConfig, start: int) -> TransformerConfig:
    """`config` whose scaled RoPE encodings keep positions < `start` at the original rotation
    (`unscaled_start`); encodings without a scaling dict are left as they are."""
    start = integer("start", start, minimum=0)
    return _map_encodings(config, lambda kw, _: {**kw, "unscaled_start": start}
                          if kw.get("scaling") is not None else kw)


def with_frequency_table(config: TransformerConfig) -> TransformerConfig:
    """`config` whose scaled RoPE encodings read their rotation from params (RoPE's
    `frequency_table`: new factors, attention factor or start count are new params, not a new
    program); encodings without a scaling dict are left as they are."""
    return _map_encodings(config, lambda kw, _: {**kw, "frequency_table": True}
                          if kw.get("scaling") is not None else kw)


def with_scaling(config: TransformerConfig, scaling: dict[str, Any]) -> TransformerConfig:
    """`config` whose RoPE encodings (every layer's, for a model of ours) take `scaling`."""
    return _map_encodings(config, lambda kw, enc: {**kw, "scaling": dict(scaling)}
                          if isinstance(enc, RoPE) else kw)
