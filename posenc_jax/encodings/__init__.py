"""Floor 1: positional encodings as pure JAX, knowing nothing of models.

`base` holds the three-hook interface and the registry; each scheme lives in its own module
(pure functions of explicit positions, then the frozen dataclass that registers itself);
`rope_scaling` holds RoPE's context-extension methods and `hf_config` reads Hugging Face
configs. Importing this package registers every built-in scheme.
"""

from posenc_jax.encodings import (  # noqa: F401  (importing registers each scheme)
    alibi,
    cope,
    fire,
    kerple,
    learned,
    mrope,
    nope,
    rope,
    sandwich,
    shaw,
    sinusoidal,
    t5,
    xpos,
)
from posenc_jax.encodings.base import Encoding, for_model, get, names, register

__all__ = ["Encoding", "for_model", "get", "names", "register"]
