"""KV-cache decoding equals the full forward pass: every encoding, chunked prefill, the
dynamic-NTK and LongRoPE regime switch; overflow; `generate`."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax.model.transformer import Transformer, TransformerConfig, generate, init_cache

V, N, S = 40, 11, 16          # vocab, tokens decoded, cache slots
ENCODINGS = {
    "nope": {}, "rope": {"layout": "interleaved", "partial_rotary_factor": 0.5}, "alibi": {},
    "t5": {"num_buckets": 8, "max_distance": 16}, "shaw": {"max_relative_position": 3},
    "sinusoidal": {}, "learned": {"max_len": 32},
    "kerple": {"variant": "power"}, "sandwich": {}, "fire": {"init_length": 4.0},
    "xpos": {"scale_base": 4.0}, "cope": {"npos_max": 6},
    "shaw_value": {"max_relative_position": 3, "value": True},
}
SCALINGS = {
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 6},
    "longrope": {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 6,
                 "short_factor": [1.0, 1.5, 2.0, 2.5], "long_factor": [3.0, 4.0, 6.0, 9.0]},
}


def make(encoding="rope", encoding_kwargs=None, **kw):
    name = "shaw" if encoding == "shaw_value" else encoding
    cfg = TransformerConfig(vocab_size=V, num_layers=2, embed_dim=32, num_heads=4,
                            num_kv_heads=2, mlp_dim=48, encoding=name,
                            encoding_kwargs=ENCODINGS.get(encoding, {}) if encoding_kwargs is None
                            else encoding_kwargs, **kw)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    for i, (path, param) in enumerate(nnx.iter_graph(model)):  # CoPE's table starts at 0
        if isinstance(param, nnx.Param) and "pe" in path and not bool(jnp.any(param[...])):
            param[...] = jax.random.normal(jax.random.key(i), param[...].shape)
    return model


@nnx.jit
def full(model, tokens):
    return model(tokens)


@nnx.jit
def cached(model, tokens, positions, cache):
    return model(tokens, positions, cache=cache)


def decode_all(model, tokens, prefill=1):
    """Prefill `prefill` tokens, then decode one at a time: logits [B, N, V], final cache."""
    b, n = tokens.shape
    cache = init_cache(model, b, S)
    logits, cache = cached(model, tokens[:, :prefill], jnp.arange(prefill)[None], cache)
    outs = [logits]
    for i in range(prefill, n):
        logits, cache = cached(model, tokens[:, i:i + 1], jnp.full((b, 1), i), cache)
        outs.append(logits)
    return jnp.concatenate(outs, axis=1), cache


TOKENS = jax.random.randint(jax.random.key(1), (2, N), 0, V)


@pytest.mark.parametrize("encoding,attention", [(e, "dense") for e in ENCODINGS]
                         + [("t5", "blockwise"), ("xpos", "blockwise"),
                            ("shaw_value", "blockwise")])
def test_token_by_token_decode_equals_full_forward(encoding, attention):
    """A causal model's full-forward logits at position i are those of the prefix of length
    i + 1, so one full pass checks every length."""
    model = make(encoding, attention=attention, block_size=4)
    logits, cache = decode_all(model, TOKENS)
    chex.assert_trees_all_close(logits, full(model, TOKENS), atol=3e-5, rtol=3e-5)
    assert int(cache.index) == N and bool(jnp.all(cache.valid[:, :N]))
    assert not bool(jnp.any(cache.valid[:, N:]))


def test_chunked_prefill_equals_full_forward():
    model = make("alibi")
    cache = init_cache(model, 2, S)
    outs = []
    for start, stop in ((0, 4), (4, 5), (5, 11)):
        logits, cache = cached(model, TOKENS[:, start:stop], jnp.arange(start, stop)[None],
                               cache)
        outs.append(logits)
    chex.assert_trees_all_close(jnp.concatenate(outs, 1), full(model, TOKENS),
                                atol=3e-5, rtol=3e-5)


@nnx.jit
def prefix_forward(model, tokens, n):
    """Full forward pass of the first n tokens, in one compiled shape: the rest of the row is a
    separate segment at position 0, so max(positions) + 1 = n sets the frequencies exactly as
    for an n-token input, and the segment mask hides the filler."""
    length = tokens.shape[1]
    idx = jnp.arange(length)
    positions = jnp.where(idx < n, idx, 0)[None]
    segments = (idx >= n).astype(jnp.int32)[None]
    return model(tokens, positions, segment_ids=segments)[:, n - 1]


@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_length_dependent_scaling_decode_equals_full_forward_across_the_switch(scaling):
    """Frequencies change past original_max_position_embeddings=6; at every length n the
    decoded logits equal a full forward pass over the n-token prefix (its own frequencies)."""
    model = make("rope", {"scaling": SCALINGS[scaling]})
    assert model.config.is_length_dependent
    logits, cache = decode_all(model, TOKENS)
    for n in range(1, N + 1):
        chex.assert_trees_all_close(logits[:, n - 1], prefix_forward(model, TOKENS, n),
                                    atol=3e-5, rtol=3e-5)
    chex.assert_trees_all_close(logits[:, -1], full(model, TOKENS)[:, -1], atol=3e-5,
                                rtol=3e-5)                     # and a plain full pass
    expected_regime = N if scaling == "dynamic" else 1
    np.testing.assert_array_equal(cache.regime, [expected_regime] * 2)
    # The switch matters: past the original length the model differs from plain RoPE.
    plain = make("rope", {})
    assert float(jnp.max(jnp.abs(full(plain, TOKENS) - full(model, TOKENS)))) > 1e-3


def test_prefill_straight_into_the_long_regime():
    """A prompt longer than the original length on an empty cache: no rebuild needed."""
    model = make("rope", {"scaling": SCALINGS["longrope"]})
    logits, _ = decode_all(model, TOKENS, prefill=8)
    chex.assert_trees_all_close(logits[:, -1], full(model, TOKENS)[:, -1], atol=3e-5,
                                rtol=3e-5)


def test_cache_overflow_is_an_error_or_nan():
    model = make("alibi")
    cache = init_cache(model, 2, 4)
    _, cache = cached(model, TOKENS[:, :3], jnp.arange(3)[None], cache)
    logits, _ = cached(model, TOKENS[:, 3:5], jnp.arange(3, 5)[None], cache)   # traced index
    assert np.all(np.isnan(np.asarray(logits)))
    with pytest.raises(ValueError, match=r"cache overflow: 3 slots used \+ 2 new tokens > "
                                         "max_len=4"):
        model(TOKENS[:, 3:5], jnp.arange(3, 5)[None], cache=cache)
    with pytest.raises(ValueError, match="max_len must be >= 1, got max_len=0"):
        init_cache(model, 2, 0)


def test_generate_greedy_matches_argmax_of_the_full_forward():
    model = make("t5")
    prompt = TOKENS[:, :4]
    out = generate(model, prompt, max_new_tokens=6)
    assert out.shape == (2, 10) and out.dtype == jnp.int32
    np.testing.assert_array_equal(out[:, :4], prompt)
    np.testing.assert_array_equal(jnp.argmax(full(model, out)[:, 3:-1], -1), out[:, 4:])
    same = generate(model, prompt, max_new_tokens=6, rng=jax.random.key(5), temperature=0.7,
                    top_k=1)
    np.testing.assert_array_equal(same, out)                # top_k=1 sampling is greedy
    with pytest.raises(ValueError, match="temperature=0.5 needs rng"):
        generate(model, prompt, max_new_tokens=2, temperature=0.5)
    with pytest.raises(ValueError, match=r"top_k must be >= 1, got top_k=0"):
        generate(model, prompt, max_new_tokens=2, rng=jax.random.key(0), temperature=1.0,
                 top_k=0)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got max_new_tokens=0"):
        generate(model, prompt, max_new_tokens=0)
