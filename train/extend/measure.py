"""The two measurements of the extension study on a loaded model (`posenc_jax.pretrained`).

    position_nll(model, ids)                  float64 [n]: the loss at every position of one
                                              long forward (targets ids[1:], inputs ids[:-1])
    bucket_perplexity(nll, context=C)         [(start, end, ppl)] over [0, C/4), [C/4, C/2),
                                              [C/2, C), [C, 2C), [2C, 4C), ... cut at n
    passkey_answers(model, prompts, decode)   greedy continuations with the KV cache
                                              (`posenc_jax.model.generate`)

`position_nll` never holds the [n, V] logits: it takes the model's final hidden states
(`Transformer.hidden_states`) and applies the model's own head (`Transformer.head`: tied or
not, soft-cap included) `chunk` positions at a time (`posenc_jax.model.loss.token_nll`), so
memory is O(n E + chunk V).
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc_jax.model.attention import attend
from posenc_jax.model.generate import generate
from posenc_jax.model.loss import token_nll

CHUNK = 1024  # positions per output-projection chunk: [CHUNK, V] float32 live at a time


@functools.partial(jax.jit, static_argnames=("graphdef", "chunk"))
def _nll(graphdef, state, inputs, targets, *, chunk):
    model = nnx.merge(graphdef, state)
    hidden = model.hidden_states(inputs, jnp.arange(inputs.shape[1], dtype=jnp.int32))
    return token_nll(model.head, hidden, targets, chunk=chunk)[0]


def position_nll(model, ids: Sequence[int], *, chunk: int = CHUNK) -> np.ndarray:
    """float64 [n] for n + 1 token ids: element p is -log p(ids[p + 1] | ids[:p + 1])."""
    ids = np.asarray(ids, np.int32)
    if ids.ndim != 1 or ids.size < 2:
        raise ValueError(f"ids must be 1-D with at least 2 tokens, got shape {ids.shape}")
    graphdef, state = nnx.split(model)
    out = _nll(graphdef, state, jnp.asarray(ids[None, :-1]), jnp.asarray(ids[None, 1:]),
               chunk=min(chunk, ids.size - 1))
    return np.asarray(jax.device_get(out), np.float64)


def attention_seconds(model, n: int) -> float:
    """Seconds of one layer's causal attention over n tokens as the model runs it (its
    first layer's encoding, its attention implementation and block size; random q, k, v
    [1, n, H, D] / [1, n, K, D] in the model's dtype), timed after its compile: the rate of
    the attention term of `estimate`, apart from the matmuls'."""
    cfg, layer = model.config, model.layers[0].attn
    keys = jax.random.split(jax.random.key(0), 3)
    dt = jnp.dtype(cfg.dtype)
    q = jax.random.normal(keys[0], (1, n, cfg.num_heads, cfg.head_dim), dt)
    k, v = (jax.random.normal(kk, (1, n, cfg.num_kv_heads, cfg.head_dim), dt)
            for kk in keys[1:])
    pos = jnp.arange(n, dtype=jnp.int32)
    pe = {name: p[...] for name, p in layer.pe.items()}
    fn = jax.jit(lambda q, k, v: attend(q, k, v, encoding=layer.encoding, params=pe,
                                        q_positions=pos, k_positions=pos, causal=True,
                                        implementation=cfg.attention, block_q=cfg.block_size,
                                        block_k=cfg.block_size, window=layer.window))
    fn(q, k, v).block_until_ready()
    start = time.perf_counter()
    fn(q, k, v).block_until_ready()
    return time.perf_counter() - start


def bucket_edges(context: int, length: int) -> list[tuple[int, int]]:
    """[(start, end)]: [0, C/4), [C/4, C/2), [C/2, C), [C, 2C), [2C, 4C), ... up to
    `length`, the last bucket cut at `length`."""
    edges = [0, context // 4, context // 2, context]
    while edges[-1] < length:
        edges.append(edges[-1] * 2)
    return [(a, min(b, length)) for a, b in itertools.pairwise(edges) if a < length and b > a]


def bucket_perplexity(nll: Sequence[float], *, context: int) -> list[tuple[int, int, float]]:
    """[(start, end, exp(mean nll over positions start..end-1))] over `bucket_edges`."""
    nll = np.asarray(nll, np.float64)
    return [(a, b, math.exp(float(nll[a:b].mean()))) for a, b in bucket_edges(context, nll.size)]


def perplexity(nll: Sequence[float]) -> float:
    """exp(mean nll) over all positions."""
    return math.exp(float(np.mean(np.asarray(nll, np.float64))))


def passkey_answers(model, prompts: Sequence[Sequence[int]], *, decode: Callable,
                    max_new_tokens: int) -> list[str]:
    """The greedy continuation (`max_new_tokens` tokens, KV cache) of each prompt, decoded
    with `decode(ids) -> str`; prompts of one length run one at a time (batch 1: the prefill's
    activations, not the batch, bound the memory at long lengths)."""
    out = []
    for ids in prompts:
        prompt = jnp.asarray(np.asarray(ids, np.int32)[None])
        tokens = generate(model, prompt, max_new_tokens=max_new_tokens)
        new = np.asarray(jax.device_get(tokens))[0, len(ids):]
        out.append(decode([int(t) for t in new]))
    return out
