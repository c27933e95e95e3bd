"""`generate`: greedy or sampled continuation of a prompt with the KV cache, in one jit.

    tokens = generate(model, prompt, max_new_tokens=32)                         # greedy
    tokens = generate(model, prompt, max_new_tokens=32, rng=jax.random.key(0),
                      temperature=0.8, top_k=40)                                # sampling

The prompt (int [B, P], every row the same length) is prefilled at positions 0..P-1, then
each new token is decoded at the next position with a `lax.scan`, so the whole call compiles
once per (B, P, max_new_tokens, temperature, top_k).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

from posenc_jax.checks import finite_float, integer, positive_int, prng_key, token_ids
from posenc_jax.model.kv_cache import init_cache

__all__ = ["generate", "sample"]

Array = jax.Array


def sample(logits: Array, rng: Array | None, *, temperature: float, top_k: int | None) -> Array:
    """Next tokens int32 [B] from logits [B, V]: argmax at temperature 0, else sampling from
    softmax(logits / temperature) restricted to the `top_k` largest logits (if given)."""
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    # Shift the best logit to 0 before dividing: at a tiny temperature the others go to -inf
    # (sampling becomes argmax) instead of everything overflowing to inf (NaN -> token 0).
    logits = logits.astype(jnp.float32)
    logits = (logits - jnp.max(logits, axis=-1, keepdims=True)) / jnp.float32(temperature)
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]                      # [B, 1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


@partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "temperature", "top_k"))
def _generate(graphdef, state, prompt, rng, *, max_new_tokens, temperature, top_k):
    model = nnx.merge(graphdef, state)
    b, p = prompt.shape
    cache = init_cache(model, b, p + max_new_tokens)
    logits, cache = model(prompt, jnp.arange(p, dtype=jnp.int32)[None, :], cache=cache)
    rngs = jax.random.split(rng, max_new_tokens)
    first = sample(logits[:, -1], rngs[0], temperature=temperature, top_k=top_k)

    def decode(carry, xs):
        token, cache = carry
        position, key = xs
        logits, cache = model(token[:, None], jnp.full((b, 1), position, jnp.int32),
                              cache=cache)
        nxt = sample(logits[:, 0], key, temperature=temperature, top_k=top_k)
        return (nxt, cache), nxt

    positions = p + jnp.arange(max_new_tokens - 1, dtype=jnp.int32)
    _, rest = jax.lax.scan(decode, (first, cache), (positions, rngs[1:]))
    return jnp.concatenate([prompt.astype(jnp.int32), first[:, None], rest.T], axis=1)


def generate(model, prompt: Array, *, max_new_tokens: int, rng: Array | None = None,
             temperature: float = 0.0, top_k: int | None = None) -> Array:
    """Prompt int [B, P] -> prompt followed by `max_new_tokens` new tokens, int32 [B, P + N].

    Raises:
      ValueError: max_new_tokens < 1, temperature < 0 or not finite, top_k outside [1, V],
        sampling (temperature > 0) without an `rng`, a prompt that is not int [B, P] with
        P >= 1, a prompt token outside [0, V), or P + N positions past an encoding's table.
      TypeError: max_new_tokens, top_k or temperature of the wrong type; an rng that is
        neither a PRNG key nor an int seed (an int is the seed of jax.random.key).
    """
    prompt = jnp.asarray(prompt)
    if prompt.ndim != 2 or prompt.shape[1] < 1 or not jnp.issubdtype(prompt.dtype, jnp.integer):
        raise ValueError(f"prompt must be int [B, P] with P >= 1, got shape {prompt.shape} "
                         f"and dtype {prompt.dtype}")
    token_ids("prompt", prompt, vocab_size=model.config.vocab_size)
    max_new_tokens = positive_int("max_new_tokens", max_new_tokens)
    total, limit = prompt.shape[1] + max_new_tokens, model.config.max_positions
    if limit is not None and total > limit:
        raise ValueError(f"a prompt of {prompt.shape[1]} tokens + max_new_tokens="
                         f"{max_new_tokens} needs {total} positions, but the "
                         f"{model.config.encoding!r} encoding has max_len={limit}")
    temperature = finite_float("temperature", temperature, minimum=0)  # 0 = greedy
    if top_k is not None:  # at most the vocabulary size
        top_k = integer("top_k", top_k, minimum=1, maximum=model.config.vocab_size)
    if temperature > 0.0 and rng is None:
        raise ValueError(f"sampling with temperature={temperature} needs rng=jax.random.key(..)")
    rng = jax.random.key(0) if rng is None else prng_key("rng", rng)  # an int: a seed
    graphdef, state = nnx.split(model)
    return _generate(graphdef, state, prompt, rng, max_new_tokens=max_new_tokens,
                     temperature=float(temperature), top_k=top_k)
