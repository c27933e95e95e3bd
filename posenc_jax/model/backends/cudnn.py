"""The "cudnn" backend: `jax.nn.dot_product_attention(implementation="cudnn")`, cuDNN's fused
kernel on NVIDIA GPUs, with its own (index) causal mask for self-attention and no bias unless
the scheme has one. Never chosen by "auto".

Whole rows of logits (CoPE), value terms (Shaw's a^V), block transforms (xPos), windows,
chunks and sinks are refused: use "dense".
"""

from __future__ import annotations

from posenc_jax.model.backends.dense import attend_dense
from posenc_jax.model.backends.registry import Backend, register

__all__ = ["BACKEND", "NAME"]

NAME = "cudnn"

BACKEND = register(Backend(
    name=NAME, call=lambda x: attend_dense(x, fused="cudnn"),
    bias=frozenset({"elementwise", "positions", "query"}), platforms=frozenset({"cuda"}),
    materialises_scores=True))
