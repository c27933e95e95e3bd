"""NoPE: no positional encoding (Kazemnejad et al. 2023).

All three hooks are the identity; a causal decoder still learns order from the mask.
"""

from __future__ import annotations

import dataclasses

from posenc_jax.encodings.base import Encoding, register


@register("nope")
@dataclasses.dataclass(frozen=True)
class NoPE(Encoding):
    """No positional encoding: all three hooks do nothing (Kazemnejad et al. 2023)."""
