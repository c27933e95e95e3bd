"""FLOP formulas of a `TransformerConfig` (`mc`), for time estimates and throughput.

    matmul_flops(mc, n)          the weight matmuls of one forward of n tokens (q, k, v, o,
                                 MLP, output projection): 2 x the weights touched per token
    attention_flops(mc, n, causal=True, layers=None)
                                 attention over n tokens: QK^T and PV, 4 H D per query and
                                 key; causal counts half the keys (a kernel that skips the
                                 blocks above the diagonal), dense all of them
    forward_flops(mc, n)         matmul + causal attention
    decode_flops(mc, n)          one new token over n cached ones
    train_flops(mc, n, tokens)   forward + backward (3 x a dense forward) of `tokens` tokens
                                 in sequences of n

Used by both studies' estimates and `benchmarks/train_throughput.py`.
"""

from __future__ import annotations

from typing import Any


def matmul_flops(mc: Any, n: int) -> float:
    """FLOPs of the weight matmuls of one forward of n tokens."""
    e, h, k, d, f = mc.embed_dim, mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.mlp_dim
    mlp = (3 if mc.mlp_activation == "swiglu" else 2) * e * f
    return n * 2.0 * (mc.num_layers * (2 * e * h * d + 2 * e * k * d + mlp) + e * mc.vocab_size)


def attention_flops(mc: Any, n: int, *, causal: bool = True, layers: int | None = None
                    ) -> float:
    """FLOPs of attention over n tokens in `layers` layers (default all): 4 H D per (query,
    key) pair, over n x n pairs, half of them when `causal`."""
    layers = mc.num_layers if layers is None else layers
    pairs = float(n) * n / (2.0 if causal else 1.0)
    return 4.0 * layers * mc.num_heads * mc.head_dim * pairs


def forward_flops(mc: Any, n: int) -> float:
    """FLOPs of one causal forward of n tokens."""
    return matmul_flops(mc, n) + attention_flops(mc, n)


def decode_flops(mc: Any, n: int) -> float:
    """FLOPs of one decode step over n cached tokens."""
    return forward_flops(mc, 1) + 4.0 * mc.num_layers * mc.num_heads * mc.head_dim * n


def dense_forward_flops_per_token(mc: Any, n: int) -> float:
    """Forward FLOPs per token at sequence length n with dense attention (the full n x n
    score matrix)."""
    return (matmul_flops(mc, n) + attention_flops(mc, n, causal=False)) / n


def train_flops(mc: Any, n: int, tokens: int) -> float:
    """FLOPs of training on `tokens` tokens in sequences of n: forward and backward, 3 x
    a dense forward."""
    return 3.0 * dense_forward_flops_per_token(mc, n) * tokens
