"""`Static`: everything static about one kernel call, and the feature layout the kernel sees.

The kernel loads q and k as feature PIECES -- the two rotated halves [0, R), [R, 2R) and the
pass-through rest [2R, D) -- and v (and dO) as pieces of its D features. Triton requires
every array a kernel computes with to have a power-of-two size (and its dots at least 16
wide), so with `chunked=True` (the GPU structure) each piece is cut into power-of-two chunks
of >= 16 features, the piece's width first rounded up to a multiple of 16 with zero lanes:

    width n -> roundup(n, 16) -> its binary decomposition, largest chunk first
    D = 80, full rotary:   halves 40 -> 48 = 32 + 16 each;   v 80 = 64 + 16
    D = 96, full rotary:   halves 48 = 32 + 16 (no padding); v 96 = 64 + 32
    D = 80, rotary 0.25:   halves 10 -> 16;  rest 60 -> 64;  v 80 = 64 + 16

The zero lanes add nothing to q.k, p.v or the gradients (their columns are dropped), so the
result is exact; they cost FLOPs only where a width is not a multiple of 16 (q.k at D = 80
full: 96 / 80 = 1.2x, p.v 1.0x; at D = 96: 1.0x, 1.0x). The padded layout exists in memory
only when some width needs padding (`physical_index`); otherwise the chunks are views of the
unpadded array. The TPU structure (Mosaic: any width, whole-D blocks) is unchunked.

Shapes: D head dim, R rotary frequencies (pieces), G = H // K.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["Static", "chunks"]


def chunks(width: int) -> tuple[int, ...]:
    """Power-of-two chunk widths (>= 16) covering `width` rounded up to a multiple of 16."""
    n = -(-width // 16) * 16
    return tuple(1 << b for b in range(n.bit_length() - 1, -1, -1) if n >> b & 1)


@dataclasses.dataclass(frozen=True)
class Static:
    """Everything static about one attention call (hashable: a custom_vjp nondiff arg)."""

    causal: bool
    segments: bool
    scale: float
    num_heads: int
    groups: int                    # G = H // K
    head_dim: int
    rotary: int                    # R, 0 without in-kernel rotation
    encoding: Any                  # a scheme with an elementwise bias, or None
    param_tree: Any                # treedef of the encoding's params
    block_q: int                   # CPU-interpret blocks (GPU and TPU: `blocks`)
    block_k: int
    cpu_kernel: str = "gpu"        # which kernel structure interpret mode runs: gpu | tpu
    blocks: Any = None             # a `blocks.KernelBlocks` (None: the defaults)
    interpret: Any = None          # CPU: `interpret=` of pallas_call (None: True), e.g. a
                                   # `pltpu.InterpretParams(out_of_bounds_reads="raise")`
    window: int | None = None      # keys with q_pos - k_pos < window (None: unlimited)
    chunks: bool = False           # chunk ids qchunk / kchunk given: visible iff equal
    sink_tokens: int = 0           # keys with k_pos < sink_tokens escape window and chunk
    sinks: bool = False            # a learned sink logit per row (aux "sink") starts m, l
    q_len: int = 0                 # the real query length (0: unknown): query blocks wholly
                                   # past it (padding) read no key block
    chunked: bool = False          # power-of-two feature chunks (the GPU structure)

    def _split(self, width: int) -> tuple[int, ...]:
        return chunks(width) if self.chunked else ((width,) if width else ())

    def _logical(self) -> list[tuple[int, int]]:
        """(start, width) of the logical pieces: rotated halves, then pass-through."""
        r, d = self.rotary, self.head_dim
        if not r:
            return [(0, d)]
        return [(0, r), (r, r)] + ([(2 * r, d - 2 * r)] if 2 * r < d else [])

    def _layout(self, pieces) -> tuple[tuple[int, int], ...]:
        """(physical start, width) of every chunk of the given logical pieces, in order."""
        out, at = [], 0
        for _, n in pieces:
            for w in self._split(n):
                out.append((at, w))
                at += w
        return tuple(out)

    @property
    def pieces(self) -> tuple[tuple[int, int], ...]:
        """(start, width) of q's and k's chunks in the kernel's layout: the first half's
        `len(rot_chunks)` chunks, the second half's as many, then the pass-through's."""
        return self._layout(self._logical())

    @property
    def rot_chunks(self) -> tuple[tuple[int, int], ...]:
        """(column start, width) in the [2, R'] rotation table of each rotated chunk pair."""
        return self._layout([(0, self.rotary)]) if self.rotary else ()

    @property
    def v_pieces(self) -> tuple[tuple[int, int], ...]:
        """(start, width) of v's (and dO's, out's, dv's) chunks."""
        return self._layout([(0, self.head_dim)])

    def physical_index(self, kind: str) -> np.ndarray | None:
        """For "qk", "v" or "rot": the logical feature at each column of the kernel's layout
        (-1: a zero lane), or None when the layout is the logical one."""
        if kind == "rot":
            logical, phys = [(0, self.rotary)], self.rot_chunks
        elif kind == "qk":
            logical, phys = self._logical(), self.pieces
        else:
            logical, phys = [(0, self.head_dim)], self.v_pieces
        idx, it = [], iter(phys)
        for start, n in logical:
            span = sum(w for _, w in [next(it) for _ in self._split(n)])
            idx.extend(list(range(start, start + n)) + [-1] * (span - n))
        idx = np.asarray(idx, np.int64)
        if len(idx) == sum(n for _, n in logical) and np.all(idx >= 0):
            return None
        return idx
