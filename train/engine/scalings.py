"""RoPE scaling in the studies: "no scaling", the methods, which encodings take one, the dicts.

Everything comes from posenc_jax's registry of methods (`posenc_jax.encodings.rope_scaling`):
the method list (every method with a `stretch` rule, i.e. all but "default") and each
method's rule for stretching a model made for L tokens to factor * L. A study adds only the
`config.scaling_overrides` a user gives. `NO_SCALING` ("none") is the encoding as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from posenc_jax.encodings import rope_scaling
from train import state

NO_SCALING = "none"  # the `scaling` of a model evaluated as trained (or as loaded)


def methods() -> tuple[str, ...]:
    """The scaling methods a study can evaluate, in the registry's order."""
    return rope_scaling.methods(stretchable=True)


def all_methods() -> tuple[str, ...]:
    """`NO_SCALING` and every method, in the registry's order."""
    return (NO_SCALING, *methods())


def takes_scaling(encoding) -> bool:
    """True for an encoding that rotates and takes a `scaling` dict (with a `rotary_dim`)."""
    fields = {f.name for f in dataclasses.fields(encoding)}
    return "rotate" in encoding.hooks and {"scaling", "rotary_dim"} <= fields


def refusal(model: Any, kwargs: Mapping[str, Any], *, rotary_dim: int) -> str:
    """'' when the encoding of `model` (a config.model block) accepts `kwargs` (its
    encoding_kwargs with a `scaling` dict); else its own reason (an encoding may support only
    some methods, as mrope refuses the length-dependent ones). A scaling dict that no RoPE
    accepts is the config's mistake, not a refusal: ValueError (or TypeError) here."""
    rope_scaling.validate(kwargs["scaling"], rotary_dim=rotary_dim)
    try:
        state.transformer_config(model, encoding_kwargs=dict(kwargs))
    except ValueError as error:
        return str(error)
    return ""


def scaling_config(method: str, *, factor: float, train_len: int, rotary_dim: int,
                   overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Hugging Face style dict for `method` stretching RoPE from L to factor * L: the
    registry's `stretch` rule (see `posenc_jax.encodings.rope_scaling.registry`: L is the
    original length; YaRN's betas at their defaults; llama3's band edges at L and L/4
    wavelengths as Llama 3.1; LongRoPE with NTK-aware factor lists, no search), then
    `overrides` (config.scaling_overrides.<method>) replacing or adding keys."""
    cfg = rope_scaling.stretch(method, factor=factor, original_max_position_embeddings=train_len,
                               rotary_dim=rotary_dim)
    cfg.update(dict(overrides or {}))
    return cfg
