"""KV cache for `posenc_jax.model.transformer.Transformer`: prefill and decode through one call.

    cache = init_cache(model, batch_size=B, max_len=S)
    logits, cache = model(prompt, jnp.arange(P)[None], cache=cache)        # prefill P tokens
    logits, cache = model(next_tok, jnp.full((B, 1), P), cache=cache)      # decode one token

The cache holds, per layer, keys that are ALREADY ROTATED (and values) in S slots -- or RAW
keys when the rotation rule defers the rotation to attention (`rotation.rotates_inside`: a
`KernelRotary` encoding with a backend that rotates inside; the kernel then rotates every
cached key at its slot's position on each call, the same computation as the full
forward) -- plus for
every slot its token, position, segment id and whether it is filled; a write index (the
next free slot, shared by the batch rows) and the rotation regime of each layer. New tokens
are written at [index, index + T); attention masks use the slots' explicit positions
(causal: key position <= query position), segment ids and the filled mask, so a cached
decode is the same computation as the full forward pass. Writing past S gives NaN logits
(never a silent overwrite); concrete overflows raise ValueError.

Length-dependent RoPE scaling (dynamic NTK, LongRoPE) -- the regime policy. The frequencies
depend on the sequence length, read as max(all positions) + 1 over the cached and the new
tokens. `LengthDependent.regime` maps that length to an id that changes exactly when the
frequencies change. Each call computes every layer's regime for the new length:

* same regimes as the cache (or an empty cache): the new q and k are rotated with that
  regime's frequencies (the hook is called with the full set of positions, so the length
  is the true one) and appended -- the cached keys are still exact;
* any regime differs: the cache is REBUILT by re-running the stored tokens plus the new ones
  through the model under the new regime (a forward pass over all S slots, filled slots
  unmasked), which refreshes every layer's keys AND values. Re-rotating cached keys alone
  would be exact only for one layer: deeper layers' keys and values depend on earlier
  layers' attention outputs, which change with the frequencies.

The choice is made inside the jitted step with `lax.cond` (static: skipped entirely when no
layer is length-dependent). LongRoPE switches once (short -> long factors). Dynamic NTK past
its original length changes frequencies at every new length, so each such decode step is a
full rebuild: exact (equal to Hugging Face's full forward at that length), at the cost of an
O(S^2) pass per step.

Shapes: B batch, S cache slots (max_len), T new tokens, K kv heads, D head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from posenc_jax.checks import float_dtype, positive_int
from posenc_jax.encodings.base import Encoding
from posenc_jax.encodings.capabilities import LengthDependent
from posenc_jax.model import rotation
from posenc_jax.model.scores import split_positions

__all__ = ["KVCache", "Memory", "init_cache", "rotate", "step"]

Array = jax.Array
_INT_MIN = jnp.iinfo(jnp.int32).min


@struct.dataclass
class KVCache:
    """A pytree: per-layer rotated keys and values [B, S, K, D], slot metadata [B, S]."""

    k: tuple            # num_layers x [B, S, K, D] (rotated keys; raw if rotated in-kernel)
    v: tuple            # num_layers x [B, S, K, D]
    tokens: Array       # int32 [B, S]
    positions: Array    # int32 [B, S]
    segment_ids: Array  # int32 [B, S]
    valid: Array        # bool [B, S]: slot filled
    index: Array        # int32 []: next free slot
    regime: Array       # int32 [num_layers]: rotation regime of the cached keys

    @property
    def max_len(self) -> int:
        return self.tokens.shape[1]


@struct.dataclass
class Memory:
    """What a layer needs to attend over a cache: buffers, write index, slot metadata (after
    the write) and the positions that define the sequence length for the rotation."""

    k: tuple
    v: tuple
    index: Array
    positions: Array
    segment_ids: Array
    valid: Array
    seq_positions: Array

    def write(self, layer: int, k: Array, v: Array) -> tuple[Array, Array]:
        """Writes [B, T, K, D] at slot `index` of layer's buffers; returns the buffers."""
        at = (0, self.index, 0, 0)
        return (jax.lax.dynamic_update_slice(self.k[layer], k.astype(self.k[layer].dtype), at),
                jax.lax.dynamic_update_slice(self.v[layer], v.astype(self.v[layer].dtype), at))


def init_cache(model_or_config, batch_size: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache of `max_len` slots for a `Transformer` (or its `TransformerConfig`).

    dtype: of the k/v buffers (default: the model's activation dtype).
    """
    cfg = getattr(model_or_config, "config", model_or_config)
    positive_int("batch_size", batch_size)
    positive_int("max_len", max_len)
    dtype = float_dtype("dtype", cfg.dtype if dtype is None else dtype)  # never int8/bool
    shape = (batch_size, max_len, cfg.num_kv_heads, cfg.head_dim)
    buffers = tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
    slots = jnp.zeros((batch_size, max_len), jnp.int32)
    return KVCache(k=buffers, v=tuple(jnp.zeros(shape, dtype) for _ in buffers), tokens=slots,
                   positions=slots, segment_ids=slots, valid=jnp.zeros(slots.shape, bool),
                   index=jnp.zeros((), jnp.int32),
                   regime=jnp.zeros((cfg.num_layers,), jnp.int32))


#: The layer's rotation of new tokens before the cache (the rule's, `rotation.rotate_new`).
rotate = rotation.rotate_new


def _regime(encoding: Encoding, seq_positions: Array) -> Array:
    """The rotation regime of keys at `seq_positions` (0 unless `LengthDependent`)."""
    if isinstance(encoding, LengthDependent):
        return encoding.regime(seq_positions)
    return jnp.zeros((), jnp.int32)


def _update(buf: Array, new: Array, index: Array) -> Array:
    return jax.lax.dynamic_update_slice(buf, new.astype(buf.dtype), (0, index))


def step(model, tokens: Array, positions: Array | None, segment_ids: Array | None,
         cache: KVCache) -> tuple[Array, KVCache]:
    """`model(tokens, positions, segment_ids=..., cache=cache)`: logits [B, T, V], new cache."""
    cfg = model.config
    b, t = tokens.shape
    if cache.tokens.shape[0] != b or len(cache.k) != cfg.num_layers:
        raise ValueError(f"cache is for batch {cache.tokens.shape[0]} and {len(cache.k)} layers"
                         f"; got tokens of batch {b} for a {cfg.num_layers}-layer model")
    check_fits(cache, cfg, t)
    s, index = cache.max_len, cache.index
    if not isinstance(index, jax.core.Tracer) and int(index) + t > s:
        raise ValueError(f"cache overflow: {int(index)} slots used + {t} new tokens > "
                         f"max_len={s}")
    if positions is None:
        positions = index + jnp.arange(t, dtype=jnp.int32)[None, :]
    positions, rotary = split_positions(positions, cfg.position_axes, t, b, offset=index)
    rotary = None if rotary is positions else jnp.asarray(rotary, jnp.int32)  # [A, B|1, T]
    positions = jnp.broadcast_to(jnp.asarray(positions, jnp.int32).reshape(-1, t), (b, t))
    segment_ids = (jnp.zeros((b, t), jnp.int32) if segment_ids is None else
                   jnp.broadcast_to(jnp.asarray(segment_ids, jnp.int32).reshape(-1, t), (b, t)))
    new_tokens = _update(cache.tokens, tokens, index)
    new_pos = _update(cache.positions, positions, index)
    new_seg = _update(cache.segment_ids, segment_ids, index)
    new_valid = _update(cache.valid, jnp.ones((b, t), bool), index)
    seq_pos = jnp.where(new_valid, new_pos, _INT_MIN)
    regimes = jnp.stack([_regime(cfg.layer_encoding(i), seq_pos) for i in range(cfg.num_layers)])

    def finish(logits, kv):
        new_cache = KVCache(k=tuple(k for k, _ in kv), v=tuple(v for _, v in kv),
                            tokens=new_tokens, positions=new_pos, segment_ids=new_seg,
                            valid=new_valid, index=index + t, regime=regimes.astype(jnp.int32))
        overflow = index + t > s
        return jnp.where(overflow, jnp.float32(jnp.nan), logits), new_cache

    def incremental(_):
        memory = Memory(k=cache.k, v=cache.v, index=index, positions=new_pos,
                        segment_ids=new_seg, valid=new_valid, seq_positions=seq_pos)
        return finish(*model.forward(tokens, positions, segment_ids, memory=memory,
                                     rotary_positions=rotary))

    if not cfg.is_length_dependent:
        return incremental(None)

    def rebuild(_):
        memory = Memory(k=cache.k, v=cache.v, index=jnp.zeros((), jnp.int32), positions=new_pos,
                        segment_ids=new_seg, valid=new_valid, seq_positions=seq_pos)
        logits, kv = model.forward(new_tokens, new_pos, new_seg, memory=memory)
        logits = jax.lax.dynamic_slice_in_dim(logits, index, t, axis=1)
        return finish(logits, kv)

    switch = jnp.logical_and(jnp.any(cache.valid), jnp.any(regimes != cache.regime))
    return jax.lax.cond(switch, rebuild, incremental, None)


def check_fits(cache: KVCache, cfg, new_tokens: int) -> None:
    """ValueError, also under jit (shapes are static), for a cache built for another config
    (k/v of other kv heads or head dim) or `new_tokens` more than all its slots."""
    held = tuple(cache.k[0].shape[2:]) if cache.k else ()
    if cache.k and held != (cfg.num_kv_heads, cfg.head_dim):
        raise ValueError(f"cache holds k/v of {held[0]} kv heads x head dim {held[1]}, but the "
                         f"model has num_kv_heads={cfg.num_kv_heads} x head_dim={cfg.head_dim}: "
                         "a cache from another config; make it with init_cache(model, ...)")
    if new_tokens > cache.max_len:
        raise ValueError(f"{new_tokens} new tokens do not fit a cache of max_len="
                         f"{cache.max_len} slots (cache overflow)")
