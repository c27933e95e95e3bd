"""The model's wiring of chunked attention, learned sinks and sink tokens (issue 31), which
`attend` gains on the `attn` branch: these tests need both branches (run them after the
merge). Each feature against the float64 NumPy forward of tests/model/_layer_reference.py
(Llama 4's chunks + QK L2-norm + NoPE temperature; gpt-oss's sinks beside a window), in the
full forward, the KV cache and under context parallelism (ring and all-gather), looped,
scanned in groups and rematerialised; the sinks get a gradient and the logical axis "heads";
a backend without sinks is refused at config time."""

import _layer_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax.model.transformer import Transformer, TransformerConfig, complete_rules

V, E, H, K, D, F = 48, 32, 4, 2, 8, 40
LLAMA4 = {"attn_temperature": {"floor_scale": 3.0, "attn_scale": 0.5},
          "layer_pattern": [{"chunk": 4, "qk_l2_norm": True}] * 2 + [
              {"encoding": "nope", "temperature": True}]}
GPT_OSS = {"attention_sinks": True, "sliding_window": [3, None, 3]}
STREAMING = {"attention_sinks": True, "sink_tokens": 2, "sliding_window": [3, None, 3]}
CHUNKS_AND_SINKS = {"attention_sinks": True, "sink_tokens": 1,
                    "attention_chunk": [5, None, 5]}
CASES = {"Llama 4: chunks, L2-norm, NoPE + temperature": LLAMA4,
         "gpt-oss: sinks beside windows": GPT_OSS,
         "StreamingLLM: sinks and sink tokens beside windows": STREAMING,
         "chunks with sinks and a sink token": CHUNKS_AND_SINKS}


def config(**kw):
    base = {"vocab_size": V, "num_layers": 3, "embed_dim": E, "num_heads": H, "num_kv_heads": K,
            "head_dim": D, "mlp_dim": F, "encoding": "rope", "embed_scale": None}
    return TransformerConfig(**{**base, **kw})


def test_a_chunk_list_resolves_per_layer():
    cfg = config(num_layers=4, attention_chunk=[None] * 3 + [5])
    assert [s.chunk for s in cfg.layer_specs] == [None, None, None, 5]
    assert cfg.attention_chunk == (None, None, None, 5)


@pytest.mark.parametrize("attention", ["dense", "blockwise"])
@pytest.mark.parametrize("name", list(CASES))
def test_model_matches_the_float64_reference(name, attention):
    ref.assert_matches_forward(config(attention=attention, block_size=4, **CASES[name]), 13)


@pytest.mark.parametrize("name", list(CASES))
def test_cache_decoding_matches_the_full_forward(name):
    """A chunk boundary in the cache resets what a query sees; the sinks join each step."""
    model = ref.randomized(config(**CASES[name]))
    tokens = jax.random.randint(jax.random.key(2), (2, 11), 0, V)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)
    np.testing.assert_allclose(ref.decoded(model, tokens, 3)[0], full, rtol=1e-4, atol=1e-4)


def loss(model, tokens):
    return jnp.mean(jax.nn.log_softmax(model(tokens))[..., 0])


@pytest.mark.parametrize("remat", ["none", "block"])
@pytest.mark.parametrize("name", list(CASES))
def test_scan_in_groups_and_remat_match_the_loop(name, remat):
    kw = {**CASES[name], "num_layers": 6}
    kw.update({k: v * 2 for k, v in kw.items() if isinstance(v, list) and k != "layer_pattern"})
    loop = Transformer(config(**kw), rngs=nnx.Rngs(0))
    scanned = Transformer(config(scan_layers=True, remat=remat, **kw), rngs=nnx.Rngs(0))
    ref.assert_same_loss_and_grads(loop, scanned,
                                   jax.random.randint(jax.random.key(1), (2, 9), 0, V))


def test_sinks_are_a_per_head_param_with_a_gradient():
    model = ref.randomized(config(**GPT_OSS))
    specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
    assert specs["layers"][0]["attn"]["sinks"].get_value() == jax.P("heads")
    assert model.layers[2].attn.sinks[...].shape == (H,)
    grads = nnx.jit(nnx.grad(loss))(model, jax.random.randint(jax.random.key(3), (2, 7), 0, V))
    for i in range(3):
        assert float(jnp.abs(grads["layers"][i]["attn"]["sinks"][...]).min()) > 0.0


def test_a_sink_with_no_other_visible_key_takes_its_share():
    """Position 0 sees only itself: with a sink s the output is v_0 * 1 / (1 + exp(s - l)),
    not v_0 (the reference's denominator); a huge negative sink restores plain attention."""
    model = ref.randomized(config(**GPT_OSS))
    tokens = np.random.default_rng(4).integers(0, V, (1, 5))
    forward = nnx.jit(lambda m, t: m(t))  # one compile: the sinks are an input
    np.testing.assert_allclose(np.asarray(forward(model, jnp.asarray(tokens)), np.float64),
                               ref.forward(model, tokens), rtol=2e-4, atol=2e-4)
    for layer in model.layers:
        layer.attn.sinks[...] = jnp.full((H,), -1e4)
    np.testing.assert_allclose(np.asarray(forward(model, jnp.asarray(tokens)), np.float64),
                               ref.forward(model, tokens, use_sinks=False), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("kw, text", [
    ({"attention_sinks": True, "attention": "cudnn"}, "attention='cudnn' does not support sinks"),
    ({"attention_chunk": 8, "attention": "cudnn"},
     "attention='cudnn' does not support chunk_size=8"),
])
def test_a_backend_without_the_feature_is_refused_at_config_time(kw, text):
    with pytest.raises(ValueError) as info:
        config(**kw)
    assert text in str(info.value)


@pytest.mark.parametrize("mode", ["ring", "all_gather"])
@pytest.mark.parametrize("name", ["Llama 4: chunks, L2-norm, NoPE + temperature",
                                  "StreamingLLM: sinks and sink tokens beside windows"])
def test_context_parallel_model_equals_one_device(name, mode):
    """The layer settings reach `context_attention` too: a mesh splitting "length" over 2
    devices gives the logits of no mesh."""
    mesh = jax.make_mesh((2,), ("context",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices()[:2])
    rules = complete_rules((("length", "context"),))
    model = ref.randomized(config(context_mode=mode, **CASES[name]))
    tokens = jax.random.randint(jax.random.key(5), (2, 12), 0, V)
    forward = nnx.jit(lambda m, t: m(t))
    want = forward(model, tokens)
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        got = nnx.jit(lambda m, t: m(t))(model, tokens)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
