"""`scan_layers=True` over repeating groups of per-layer settings equals the Python loop:
values, gradients and KV-cache decoding, for Gemma 3's five-sliding-one-global shape (with a
remainder that runs unrolled), Llama 4's L2-norm / NoPE-with-temperature group, and layers
whose parameter structures differ inside the group (a T5 table on some layers only)."""

import _layer_reference as ref
import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from posenc_jax.model.scan import scan_plan
from posenc_jax.model.transformer import Transformer, TransformerConfig

V = 40
GEMMA = {"num_layers": 8, "sliding_window": [3, 3, None] * 2 + [3, 3],
         "layer_encodings": ["rope", "rope", ("rope", {"base": 1e6})] * 2 + ["rope"] * 2}
LLAMA4 = {"num_layers": 6, "attn_temperature": {"floor_scale": 3.0, "attn_scale": 0.5},
          "layer_pattern": [{"qk_l2_norm": True, "window": 4}, {"qk_l2_norm": True},
                            {"encoding": "nope", "temperature": True}]}
TABLES = {"num_layers": 4, "encoding": "nope", "layer_encodings": ["t5", "nope"] * 2}
CASES = {"Gemma 3 shape, remainder 2": GEMMA, "Llama 4 shape": LLAMA4,
         "T5 table on every other layer": TABLES}


def config(**kw):
    base = {"vocab_size": V, "num_layers": 3, "embed_dim": 32, "num_heads": 4,
            "num_kv_heads": 2, "mlp_dim": 48, "embed_scale": None}
    return TransformerConfig(**{**base, **kw})


def pair(**kw):
    """(loop model, scan model) with identical parameters."""
    return (Transformer(config(**kw), rngs=nnx.Rngs(0)),
            Transformer(config(scan_layers=True, **kw), rngs=nnx.Rngs(0)))


def test_the_plan_is_the_smallest_repeating_group():
    assert scan_plan(config(**GEMMA).layer_specs) == (3, 2)     # layers 6, 7 unrolled
    assert scan_plan(config(**LLAMA4).layer_specs) == (3, 2)
    assert scan_plan(config(**TABLES).layer_specs) == (2, 2)
    assert scan_plan(config(num_layers=5).layer_specs) == (1, 5)
    assert scan_plan(config(sliding_window=[1, 2, 3]).layer_specs) == (3, 1)  # the loop


@pytest.mark.parametrize("name", list(CASES))
def test_scan_in_groups_matches_loop_values_and_gradients(name):
    loop, scanned = pair(**CASES[name])
    chex.assert_trees_all_equal(nnx.state(loop, nnx.Param), nnx.state(scanned, nnx.Param))
    ref.assert_same_loss_and_grads(loop, scanned,
                                   jax.random.randint(jax.random.key(1), (2, 9), 0, V))


def test_scan_traces_one_group_plus_the_remainder():
    """8 Gemma-like layers: the scan's jaxpr holds 3 + 2 blocks' matmuls, the loop's 8."""
    def count_dots(model):
        jaxpr = jax.make_jaxpr(lambda t: nnx.merge(*nnx.split(model))(t))(
            jnp.zeros((1, 4), jnp.int32))
        return str(jaxpr).count("dot_general")

    loop, scanned = pair(**GEMMA)
    per_block = (count_dots(loop) - 1) / 8  # the head's one matmul aside
    assert count_dots(scanned) == 1 + 5 * per_block


@pytest.mark.parametrize("name", ["Gemma 3 shape, remainder 2", "Llama 4 shape"])
def test_scan_in_groups_kv_cache_decoding_matches_the_loop(name):
    loop, scanned = pair(**CASES[name])
    tokens = jax.random.randint(jax.random.key(2), (2, 8), 0, V)
    full = nnx.jit(lambda m, t: m(t))(loop, tokens)
    caches = []
    for model in (loop, scanned):
        logits, cache = ref.decoded(model, tokens, 3)
        chex.assert_trees_all_close(logits, full, rtol=1e-4, atol=1e-4)
        caches.append(cache)
    chex.assert_trees_all_close(caches[0], caches[1], rtol=1e-5, atol=1e-5)
