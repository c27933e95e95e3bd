"""The layout changes between a Hugging Face tensor and our param, and GGUF's stored forms.

A `Layout` knows both directions' shapes: `hf_shape(ours)` is the Hugging Face shape of a param
of shape `ours`, `to_ours(w, ours)` moves the entries of an HF tensor into our layout. Every
layout is a selection of entries (a transpose, a reshape), so export inverts it exactly by
moving an index array (`posenc_jax.pretrained.save`).

    SAME        [N]            -> [N]             norms, embeddings
    TRANSPOSE   [out, in]      -> [in, out]       MLP, lm_head
    HEADS_IN    [N*D, E]       -> [E, N, D]       q / k / v projections
    HEADS_OUT   [E, H*D]       -> [H, D, E]       o projection
    BIAS_HEADS  [N*D]          -> [N, D]          q / k / v biases
    EXPERTS_TRANSPOSE  [X, out, in] -> [X, in, out]   a MoE's stacked experts (the per-expert
                                                  tensors stacked: `pretrained.experts`)

GGUF fixes (fn(w [HF layout] float32, config dict) -> w as transformers holds it):
`unpermute_q` / `unpermute_k` undo llama.cpp's interleaved-RoPE row order of the llama
architecture's q / k projections; `minus_one` turns Gemma's stored `1 + w` norms into `w`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = [
    "BIAS_HEADS",
    "EXPERTS_TRANSPOSE",
    "HEADS_IN",
    "HEADS_OUT",
    "SAME",
    "TRANSPOSE",
    "Layout",
    "minus_one",
    "unpermute_k",
    "unpermute_q",
    "unpermute_rows",
]

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a param of our shape sits in a Hugging Face tensor (see the module docstring)."""

    name: str
    hf_shape: Callable[[Shape], Shape]
    to_ours: Callable[[np.ndarray, Shape], np.ndarray]


SAME = Layout("same", lambda s: tuple(s), lambda w, s: w)
TRANSPOSE = Layout("transpose", lambda s: tuple(s[::-1]),
                   lambda w, s: np.ascontiguousarray(w.T))
EXPERTS_TRANSPOSE = Layout("experts_transpose", lambda s: (s[0], s[2], s[1]),
                           lambda w, s: np.ascontiguousarray(w.transpose(0, 2, 1)))
HEADS_IN = Layout("heads_in", lambda s: (s[1] * s[2], s[0]),
                  lambda w, s: np.ascontiguousarray(w.T).reshape(s))
HEADS_OUT = Layout("heads_out", lambda s: (s[2], s[0] * s[1]),
                   lambda w, s: np.ascontiguousarray(w.T).reshape(s))
BIAS_HEADS = Layout("bias_heads", lambda s: (s[0] * s[1],), lambda w, s: w.reshape(s))


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: per head its rows are stored as [pair, 2] pairs
    (interleaved RoPE), Hugging Face's order is [2, pair] (rotate-half). w: [heads * d, ...]."""
    rows = w.shape[0]
    if rows % (2 * heads):
        raise ValueError(f"q/k projection with {rows} rows does not split into {heads} heads "
                         "of an even size")
    half = rows // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_q(w: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    return unpermute_rows(w, config["num_attention_heads"])


def unpermute_k(w: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    return unpermute_rows(w, config["num_key_value_heads"])


def minus_one(w: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    return w - np.float32(1.0)
