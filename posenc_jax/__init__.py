"""posenc_jax: positional encodings for transformers as pure, jittable JAX functions.

Every encoding injects order in one (or more) of three places, and every encoding in this
package is one frozen dataclass with the same three pure hooks (see `posenc_jax.encoding`):

    embed(params, x, positions)            -> x          sinusoidal, learned
    rotate(params, q, k, q_pos, k_pos)     -> (q, k)     RoPE and its context extensions
    bias(params, q_pos, k_pos, *, q=None)  -> [..., H, Lq, Lk] or None
                                                         ALiBi, T5 buckets, Shaw et al.

Shape letters used in every docstring of this package:

    B   batch size
    L   sequence length; Lq query length, Lk key length
    H   attention (query) heads;  K  key/value heads under grouped-query attention
    D   head dimension;  R  rotary frequencies (rotary_dim // 2)
    E   embedding (model) dimension;  V  vocabulary size

Positions are always explicit integer arrays of shape [L] or [B, L], never an implied arange.
Angles are computed in float32 whatever the activation dtype; outputs keep the input dtype.
"""

import importlib
from typing import TYPE_CHECKING

from posenc_jax.encoding import Encoding, for_model, get, names, register

__all__ = [
    "Encoding",
    "alibi",
    "attention",
    "blockwise",
    "config",
    "encoding",
    "for_model",
    "generate",
    "get",
    "hf_config",
    "kv_cache",
    "learned",
    "linen",
    "names",
    "register",
    "relative",
    "rope",
    "rope_scaling",
    "schemes",
    "sinusoidal",
    "transformer",
]
__version__ = "0.1.0"

_SUBMODULES = frozenset(__all__[5:])

if TYPE_CHECKING:  # pragma: no cover
    from posenc_jax import (
        alibi,
        attention,
        learned,
        linen,
        relative,
        rope,
        rope_scaling,
        sinusoidal,
        transformer,
    )


def __getattr__(name: str):
    """Imports submodules on first use (`posenc_jax.rope` works after `import posenc_jax`)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"posenc_jax.{name}")
    raise AttributeError(f"module 'posenc_jax' has no attribute {name!r}")
