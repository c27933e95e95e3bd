"""Per-layer settings (`posenc_jax.model.layer_pattern`): every spelling resolves into one
`LayerSpec` per layer; NoPE layers, windows, Llama 4's QK L2-norm and query temperature against
a float64 NumPy forward (tests/model/_layer_reference.py), in the full forward and the KV
cache; bad settings refused at construction, naming the key. Chunks and sinks need the
attention side: tests/model/test_layer_attention_combined.py."""

import dataclasses

import _layer_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax._frozen import freeze
from posenc_jax.model.layer_pattern import LayerSpec, group_size, query_temperature
from posenc_jax.model.transformer import TransformerConfig

V, E, H, K, D, F = 48, 32, 4, 2, 8, 40
ROPE, NOPE = ("rope", freeze({})), ("nope", freeze({}))
TEMP = {"floor_scale": 3.0, "attn_scale": 0.5}
LLAMA4ISH = [{"qk_l2_norm": True, "window": 3}, {"qk_l2_norm": True},
             {"encoding": "nope", "temperature": True}]


def config(**kw):
    base = {"vocab_size": V, "num_layers": 3, "embed_dim": E, "num_heads": H, "num_kv_heads": K,
            "head_dim": D, "mlp_dim": F, "encoding": "rope", "embed_scale": None}
    return TransformerConfig(**{**base, **kw})


def test_a_pattern_resolves_to_one_spec_per_layer_repeated():
    cfg = config(num_layers=6, attn_temperature=TEMP, layer_pattern=LLAMA4ISH)
    group = (LayerSpec(ROPE, window=3, qk_l2_norm=True), LayerSpec(ROPE, qk_l2_norm=True),
             LayerSpec(NOPE, temperature=(3.0, 0.5)))
    assert cfg.layer_specs == group * 2
    assert cfg.layer(5).temperature == (3.0, 0.5) and cfg.layer_encoding(5).name == "nope"
    assert group_size(cfg.layer_specs) == 3
    # what the pattern sets is in the per-layer fields too, for every reader (export, study)
    assert cfg.sliding_window == (3, None, None) * 2
    assert cfg.layer_encodings == (ROPE, ROPE, NOPE) * 2
    assert cfg.attention_chunk is None
    again = dataclasses.replace(cfg)  # a resolved config rebuilds as itself
    assert again == cfg and again.layer_specs == cfg.layer_specs


def test_the_older_spellings_resolve_into_the_same_specs():
    """Gemma 3's per-layer windows and encodings: one mechanism (Llama 4's chunk list:
    tests/model/test_layer_attention_combined.py)."""
    cfg = config(num_layers=4, sliding_window=[2, None] * 2,
                 layer_encodings=["rope", "nope", "rope", ("rope", {"base": 100.0})])
    assert [s.window for s in cfg.layer_specs] == [2, None, 2, None]
    assert [s.encoding for s in cfg.layer_specs] == [ROPE, NOPE, ROPE,
                                                     ("rope", freeze({"base": 100.0}))]
    assert group_size(cfg.layer_specs) == 4
    assert group_size(config(num_layers=5, sliding_window=[2, 2, None] * 1 + [2, 2]
                             ).layer_specs) == 3  # a remainder of two


@pytest.mark.parametrize("kw, error, text", [
    ({"attention_chunk": -4}, ValueError, "attention_chunk[0] must be >= 1, got"),
    ({"attention_chunk": [4, 4]}, ValueError, "attention_chunk has 2 entries but num_layers=3"),
    ({"attention_chunk": "8"}, TypeError, "attention_chunk must be None, an int or a sequence"),
    ({"layer_pattern": [{}, {}]}, ValueError,
     "layer_pattern has 2 entries, which neither divides nor matches num_layers=3"),
    ({"layer_pattern": {"window": 3}}, TypeError, "layer_pattern must be a non-empty sequence"),
    ({"layer_pattern": [{"windw": 3}]}, ValueError,
     "layer_pattern[0] has unknown keys ['windw']; valid: 'encoding', 'window', 'chunk'"),
    ({"layer_pattern": [{"chunk": 0}]}, ValueError, "layer_pattern[0]['chunk'] must be >= 1"),
    ({"layer_pattern": [{"qk_l2_norm": 1}]}, TypeError,
     "layer_pattern[0]['qk_l2_norm'] must be a bool"),
    ({"layer_pattern": [{"window": 3}], "sliding_window": 2}, ValueError,
     "sliding_window=(2, 2, 2) differs from what layer_pattern sets for 'window' ((3, 3, 3))"),
    ({"layer_pattern": [{"encoding": "nope"}], "layer_encodings": ["rope"] * 3}, ValueError,
     ("layer_encodings=(('rope', {}), ('rope', {}), ('rope', {})) differs from what "
      "layer_pattern sets for 'encoding'")),
    ({"layer_pattern": [{"encoding": 3}]}, ValueError,
     "layer_pattern[0]['encoding'] must be a name or (name, kwargs)"),
    ({"layer_pattern": [{"encoding": "sinusoidal"}]}, ValueError,
     "layer_pattern[0]['encoding']='sinusoidal' is additive"),
    ({"layer_pattern": [{"temperature": True}]}, ValueError,
     "layer_pattern[0]['temperature']=True needs attn_temperature="),
    ({"layer_pattern": [{"temperature": True}], "attn_temperature": {"attn_scale": 0.1}},
     ValueError, "attn_temperature needs 'floor_scale'"),
    ({"layer_pattern": [{"temperature": True}],
      "attn_temperature": {"floor_scale": 0, "attn_scale": 0.1}},
     ValueError, "attn_temperature['floor_scale'] must be > 0.0"),
    ({"attn_temperature": TEMP}, ValueError, "no layer asks for it"),
    ({"attn_temperature": 8192.0, "layer_pattern": [{"temperature": True}]}, TypeError,
     "attn_temperature must be a dict"),
    ({"sink_tokens": 2}, ValueError,
     ("sink_tokens=2 keeps the first keys visible beside a sliding window or a chunk, but no "
      "layer has one")),
    ({"sink_tokens": -1, "sliding_window": 3}, ValueError, "sink_tokens must be >= 0"),
    ({"attention_sinks": "yes"}, TypeError, "attention_sinks must be a bool"),
    ({"layer_pattern": [{"window": 3}], "causal": False}, ValueError,
     "sliding_window=[3, 3, 3] needs causal=True"),
])
def test_bad_per_layer_settings_are_refused_naming_the_key(kw, error, text):
    with pytest.raises(error) as info:
        config(**kw)
    assert text in str(info.value)


@pytest.mark.parametrize("pos", [[0, 1, 2, 3, 8190, 8191, 8192, 16383, 16384, 10 ** 6]])
def test_query_temperature_is_llama4s_formula(pos):
    """log1p(floor((p + 1) / floor_scale)) * attn_scale + 1, p the 0-based position: 1 until
    p + 1 reaches floor_scale (Llama 4: 8192, 0.1)."""
    got = query_temperature(jnp.asarray([pos], jnp.int32), floor_scale=8192.0, attn_scale=0.1)
    want = ref.temperature(np.asarray(pos, np.float64), 8192.0, 0.1)
    np.testing.assert_allclose(np.asarray(got)[0, :, 0, 0], want, rtol=1e-6)
    assert got.shape == (1, len(pos), 1, 1)
    assert np.asarray(got)[0, 4, 0, 0] == 1.0 and np.asarray(got)[0, 5, 0, 0] > 1.0


CASES = {
    "Llama 4-like: L2-norm RoPE layers, a NoPE layer with temperature": {
        "attn_temperature": TEMP, "layer_pattern": LLAMA4ISH},
    "Gemma-like: windows and per-layer encodings": {
        "sliding_window": [3, 5, None], "layer_encodings": ["rope", "rope", "nope"]},
}


@pytest.mark.parametrize("attention", ["dense", "blockwise"])
@pytest.mark.parametrize("name", list(CASES))
def test_per_layer_model_matches_the_float64_reference(name, attention):
    ref.assert_matches_forward(config(attention=attention, block_size=4, **CASES[name]), 11)


def test_temperature_and_l2_norm_follow_the_cache():
    """Prefill then token-by-token decode equals the full forward (the temperature reads the
    new queries' positions; the cached keys are already L2-normed)."""
    model = ref.randomized(config(attn_temperature=TEMP, layer_pattern=LLAMA4ISH))
    tokens = jax.random.randint(jax.random.key(2), (2, 9), 0, V)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)
    np.testing.assert_allclose(ref.decoded(model, tokens, 4)[0], full, rtol=1e-4, atol=1e-4)


def test_l2_norm_makes_each_layer_blind_to_the_scale_of_q_and_k():
    """With qk_l2_norm every layer, scaling all q/k projections changes nothing (a property the
    model without it lacks)."""
    forward = nnx.jit(lambda m, t: m(t))  # one compile a config: the factor is in the params

    def logits(cfg, factor):
        model = ref.randomized(cfg)
        for layer in model.layers:
            for p in (layer.attn.q_proj, layer.attn.k_proj):
                p[...] = p[...] * factor
        return np.asarray(forward(model, jnp.arange(8)[None] % V))

    with_norm = config(layer_pattern=[{"qk_l2_norm": True}])
    np.testing.assert_allclose(logits(with_norm, 1.0), logits(with_norm, 7.0), atol=2e-4)
    assert not np.allclose(logits(config(), 1.0), logits(config(), 7.0), atol=2e-4)
