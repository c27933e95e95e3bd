"""posenc_jax: positional encodings for transformers as pure, jittable JAX functions.

Every encoding injects order in one (or more) of three places, and every encoding in this
package is one frozen dataclass with the same core, `init` and three pure hooks (see
`posenc_jax.encodings.base`; optional capabilities in `posenc_jax.encodings.capabilities`):

    embed(params, x, positions)            -> x          sinusoidal, learned
    rotate(params, q, k, q_pos, k_pos, *, seq_len=None)
                                           -> (q, k)     RoPE and its context extensions
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

from posenc_jax.encodings import Encoding, for_model, get, names, register

# Short public names -> the module that holds them (loaded on first use, so that
# `import posenc_jax` stays light and `posenc_jax.rope` works after a bare import).
_MODULES = {
    "checks": "posenc_jax.checks",
    "encodings": "posenc_jax.encodings",
    "model": "posenc_jax.model",
    # floor 1: encodings
    "alibi": "posenc_jax.encodings.alibi",
    "base": "posenc_jax.encodings.base",
    "capabilities": "posenc_jax.encodings.capabilities",
    "cope": "posenc_jax.encodings.cope",
    "fire": "posenc_jax.encodings.fire",
    "frequencies": "posenc_jax.encodings.frequencies",
    "hf_config": "posenc_jax.encodings.hf_config",
    "kerple": "posenc_jax.encodings.kerple",
    "learned": "posenc_jax.encodings.learned",
    "mrope": "posenc_jax.encodings.mrope",
    "nope": "posenc_jax.encodings.nope",
    "relative": "posenc_jax.encodings.relative",
    "rope": "posenc_jax.encodings.rope",
    "rope_scaling": "posenc_jax.encodings.rope_scaling",
    "sandwich": "posenc_jax.encodings.sandwich",
    "shaw": "posenc_jax.encodings.shaw",
    "sinusoidal": "posenc_jax.encodings.sinusoidal",
    "t5": "posenc_jax.encodings.t5",
    "xpos": "posenc_jax.encodings.xpos",
    # floor 2: the model
    "attention": "posenc_jax.model.attention",
    "backends": "posenc_jax.model.backends",
    "blockwise": "posenc_jax.model.blockwise",
    "config": "posenc_jax.model.config",
    "generate": "posenc_jax.model.generate",
    "kv_cache": "posenc_jax.model.kv_cache",
    "linen": "posenc_jax.model.linen",
    "rotation": "posenc_jax.model.rotation",
    "transformer": "posenc_jax.model.transformer",
}
# Classes users reach for most, by the module that defines them.
_OBJECTS = {
    "Transformer": "posenc_jax.model.transformer",
    "TransformerConfig": "posenc_jax.model.config",
}

__all__ = [  # noqa: PLE0604  (strings, from the two tables above)
    "Encoding", "for_model", "get", "names", "register", *sorted(_MODULES), *sorted(_OBJECTS),
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """Loads a short public name on first use (`posenc_jax.rope`, `posenc_jax.Transformer`)."""
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if name in _OBJECTS:
        return getattr(importlib.import_module(_OBJECTS[name]), name)
    raise AttributeError(f"module 'posenc_jax' has no attribute {name!r}")


def __dir__():
    return __all__
