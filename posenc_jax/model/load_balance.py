"""Causal load balancing for context parallelism: the zig-zag order of a sequence's tokens.

Split a sequence of length L into 2N chunks of C = L / (2N) tokens, for N devices along the
context axis. Causal attention makes the work of a chunk grow with its index (chunk c sees
c + 1 chunks), so contiguous sharding leaves device 0 almost idle and device N - 1 with most
of the work. In the zig-zag order (Llama 3's context parallelism; MaxText's
`reorder_sequence`; Brandon et al. 2023 "striped" is the other common choice) device i holds
chunks i and 2N - 1 - i:

    device      0            1              ...   N - 1
    chunks      0, 2N-1      1, 2N-2        ...   N-1, N

so every device holds one early and one late chunk and does (2N + 1) / 2 chunk-pairs of
causal work. The reorder is a fixed permutation of the sequence axis applied to EVERY per-token
array alike (tokens, targets, positions, segment ids, weights): attention builds its masks
from the positions it is given, never from indices, so it needs no change; the loss is a sum
over tokens, so it is unchanged too. Only the layout differs, which is what makes the work even.

All functions are pure NumPy / JAX index arithmetic on static shapes.

Shapes: L sequence length, N context shards, C = L / (2N) chunk length.
"""

from __future__ import annotations

import numpy as np

from posenc_jax.checks import positive_int

__all__ = ["chunk_indices", "inverse_order", "reorder", "restore", "zigzag_order"]


def _check(length: int, shards: int) -> tuple[int, int]:
    length, shards = positive_int("length", length), positive_int("shards", shards)
    if length % (2 * shards):
        raise ValueError(f"zig-zag load balancing needs the length divisible by 2 * shards; got "
                         f"length={length}, shards={shards} (2 * shards = {2 * shards})")
    return length, shards


def chunk_indices(length: int, shards: int, shard: int) -> np.ndarray:
    """int64 [L / N]: the global token indices that `shard` holds, in its local order (its
    early chunk, then its late chunk). A data loader for that device reads exactly these."""
    length, shards = _check(length, shards)
    if not 0 <= int(shard) < shards:
        raise ValueError(f"shard must be in [0, {shards}), got shard={shard}")
    c = length // (2 * shards)
    early, late = int(shard), 2 * shards - 1 - int(shard)
    return np.concatenate([np.arange(early * c, (early + 1) * c),
                           np.arange(late * c, (late + 1) * c)])


def zigzag_order(length: int, shards: int) -> np.ndarray:
    """int64 [L]: `order[j]` is the global index of the token at layout slot j; slots
    [i L/N, (i+1) L/N) are device i's (`chunk_indices(length, shards, i)`). With shards = 1
    it is the identity."""
    length, shards = _check(length, shards)
    return np.concatenate([chunk_indices(length, shards, i) for i in range(shards)])


def inverse_order(length: int, shards: int) -> np.ndarray:
    """int64 [L]: the inverse permutation of `zigzag_order` (layout slot of each token)."""
    order = zigzag_order(length, shards)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    return inverse


def reorder(x, shards: int, *, axis: int = 1):
    """`x` with its sequence `axis` put in zig-zag order (NumPy or JAX arrays: a gather by a
    static index array). [B, L, ...] -> [B, L, ...]."""
    return x.take(zigzag_order(x.shape[axis], shards), axis=axis) if shards > 1 else x


def restore(x, shards: int, *, axis: int = 1):
    """The inverse of `reorder`: the sequence `axis` back in token order."""
    return x.take(inverse_order(x.shape[axis], shards), axis=axis) if shards > 1 else x
