"""The "blockwise" backend: `posenc_jax.model.blockwise`, an online-softmax loop over blocks
computing each block's bias from its positions (memory linear in the length). Every bias but
whole rows of logits; value terms and block transforms; windows, chunks, sinks and sink
tokens; every platform; a context-parallel step (`call_lse`)."""

from __future__ import annotations

from posenc_jax.model import blockwise
from posenc_jax.model.backends.registry import PLATFORMS, Backend, Inputs, register

__all__ = ["BACKEND", "NAME"]

NAME = "blockwise"


def _kwargs(x: Inputs) -> dict:
    return {"encoding": x.encoding, "params": x.params, "q_positions": x.q_positions,
            "k_positions": x.k_positions, "q_segment_ids": x.q_segment_ids,
            "k_segment_ids": x.k_segment_ids, "k_mask": x.k_mask, "causal": x.causal,
            "block_q": x.block_q, "block_k": x.block_k, "window": x.window,
            "chunk_size": x.chunk_size, "sink_tokens": x.sink_tokens, "sinks": x.sinks}


def _call(x: Inputs):
    return blockwise.attend_blockwise(x.q, x.k, x.v, **_kwargs(x))


def _call_lse(x: Inputs):
    return blockwise.attend_blockwise_lse(x.q, x.k, x.v, **_kwargs(x))


BACKEND = register(Backend(
    name=NAME, call=_call, call_lse=_call_lse,
    bias=frozenset({"elementwise", "positions", "query"}), platforms=frozenset(PLATFORMS),
    value_term=True, block_transform=True, sliding_window=True, chunked=True, sinks=True,
    sink_tokens=True, auto_priority=2, auto_platforms=frozenset(PLATFORMS)))
