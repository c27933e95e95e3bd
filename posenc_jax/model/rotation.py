"""The rotation rule: who rotates q and k, when, and what a KV cache stores.

One rule, asked by the transformer (before it caches keys), `kv_cache` (which length a
length-dependent rotation reads) and `attention.attend` (what it hands the backend):

* An encoding whose rotation a kernel can apply (`capabilities.KernelRotary`), run by a
  backend that `rotates_inside` (or by "auto", when some platform's choice does), is DEFERRED:
  the layer does not call the rotate hook, the KV cache stores RAW keys, and `attend`
  receives raw q and k (`rotated=False`). `attend` then gives the backend it runs the
  `KernelRotation` (the kernel rotates every key, cached ones included, at its position), or,
  for a backend that does not rotate inside (auto's other platforms), calls the rotate hook.
* Otherwise the layer rotates the new q and k with the rotate hook BEFORE the cache, the
  cache stores rotated keys, and `attend` receives them rotated.

The length a `LengthDependent` rotation reads is the whole sequence's: max(valid key
positions) + 1, also while only the new tokens are rotated (`rotate_new`).

Shapes: B batch, T new tokens, S cache slots, Lq / Lk lengths, H heads, K kv heads, D head dim.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from posenc_jax.encodings.base import Encoding
from posenc_jax.encodings.capabilities import KernelRotary, KernelRotation, is_length_dependent
from posenc_jax.model import backends

__all__ = ["for_backend", "rotate_new", "rotates_inside", "seq_len"]

Array = jax.Array


def rotates_inside(encoding: Encoding, attention: str) -> bool:
    """True when the rotation is deferred to attention (see the module doc): q, k and the KV
    cache stay raw, and `attend` must be called with `rotated=False`."""
    if not isinstance(encoding, KernelRotary):
        return False
    name = backends.resolve(attention)
    if name != backends.AUTO:
        return backends.get(name).rotates_inside
    return any(b.rotates_inside and b.supports(encoding) is None for b in map(
        backends.get, backends.names()) if b.auto_priority is not None)


def seq_len(encoding: Encoding, k_positions: Array, k_mask: Array | None = None):
    """The length a length-dependent rotation reads: max(valid key positions) + 1 (None for an
    encoding that reads none). k_positions [B|1, Lk], k_mask bool [B|1, Lk] or None."""
    if not is_length_dependent(encoding):
        return None
    kp = k_positions if k_mask is None else jnp.where(k_mask.astype(bool), k_positions,
                                                      jnp.iinfo(jnp.int32).min)
    return jnp.max(kp) + 1


def rotate_new(encoding: Encoding, params: Any, q: Array, k: Array, positions: Array,
               seq_positions: Array) -> tuple[Array, Array]:
    """The layer's rotation of new q [B, T, H, D] and k [B, T, K, D] at `positions` [B|1, T],
    before the cache. A length-dependent encoding reads the whole sequence's length,
    `max(seq_positions) + 1`, where `seq_positions` [B|1, S] holds the filled slots' positions
    (int32 min elsewhere)."""
    if seq_positions is positions or not is_length_dependent(encoding):
        return encoding.rotate(params, q, k, positions, positions)
    return encoding.rotate(params, q, k, positions, positions,
                           seq_len=jnp.max(seq_positions) + 1)


def for_backend(backend: backends.Backend, encoding: Encoding, params: Any, q: Array,
                k: Array, q_positions: Array, k_positions: Array, k_mask: Array | None, *,
                rotated: bool) -> tuple[Array, Array, KernelRotation | None]:
    """(q, k, rotation) to hand `backend`: as given when already rotated; raw with the
    `KernelRotation` for a backend that rotates inside; else rotated here by the hook."""
    if rotated:
        return q, k, None
    length = seq_len(encoding, k_positions, k_mask)
    if backend.rotates_inside and isinstance(encoding, KernelRotary):
        return q, k, encoding.kernel_rotation(params, seq_len=length)
    q, k = encoding.rotate(params, q, k, q_positions, k_positions, seq_len=length)
    return q, k, None
