"""The core interface (init + three hooks) and the registry: every scheme, the same contract.

Properties proven for every registered encoding: each hook is jittable, gives the
same result under `jax.jit` as without, is vmappable over the batch and differentiable
w.r.t. its inputs and params; unused hooks are the identity / None; schemes are hashable
(static under jit); the registry's errors name the valid choices.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc_jax
from posenc_jax.encodings import base as encoding
from posenc_jax.encodings import capabilities as cap

B, L, H, D = 2, 5, 4, 8
E = H * D

EXPECTED = ["alibi", "cope", "fire", "kerple", "learned", "mrope", "nope", "rope", "sandwich",
            "shaw", "sinusoidal", "t5", "xpos"]
# Hyperparameters that switch an option on, so the registry-wide tests cover it too.
VARIANTS = {"shaw_value": ("shaw", {"value": True}), "kerple_power": ("kerple",
                                                                      {"variant": "power"}),
            "rope_p_resonance": ("rope", {"p_rope": 0.5, "resonance": True})}
ALL = EXPECTED + list(VARIANTS)


def build(name):
    name, kw = VARIANTS.get(name, (name, {}))
    return posenc_jax.for_model(name, kw, embed_dim=E, num_heads=H, head_dim=D)


def _random_params(enc, key):
    """The scheme's params, with all-zero initial tables (CoPE) made random so every hook's
    dependence on them is visible."""
    params = enc.init(key)
    return {k: (jax.random.normal(jax.random.fold_in(key, i), jnp.shape(v)) * 0.5
                if not np.any(np.asarray(v)) else v) for i, (k, v) in enumerate(params.items())}


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((B, L, E)), jnp.float32)
    q = jnp.asarray(rng.standard_normal((B, L, H, D)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, L, H, D)), jnp.float32)
    pos = jnp.asarray(np.stack([np.arange(L), np.arange(L) + 3]), jnp.int32)
    return x, q, k, pos


def all_hooks(enc, params, x, q, k, pos):
    """Every hook of the interface on the same inputs (the capabilities' where it has them)."""
    out = {"embed": enc.embed(params, x, pos)}
    out["q"], out["k"] = enc.rotate(params, q, k, pos, pos)
    if isinstance(enc, cap.RowBias):  # whole rows of (causally masked) logits
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * D**-0.5
        causal = pos[:, None, None, :] <= pos[:, None, :, None]
        bias = enc.row_bias(params, pos, pos, q=q * D**-0.5, logits=jnp.where(causal, s, -1e30))
    else:
        bias = enc.bias(params, pos, pos, q=q * D**-0.5)
    if bias is not None:
        out["bias"] = bias
    if isinstance(enc, cap.BlockTransform):
        out["q_block"], out["k_block"] = enc.block_transform(params, out["q"], out["k"], pos, pos)
    if isinstance(enc, cap.ValueTerm):
        weights = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), axis=-1)
        out["value"] = enc.value_term(params, weights, pos, pos)
    return out


def _wrong_types(enc):
    """(field, a string in place of its value, the TypeError's text) for each int, float and
    bool field of a built scheme."""
    for field in dataclasses.fields(enc):
        value = getattr(enc, field.name)
        if isinstance(value, bool):
            yield field.name, "True", rf"{field.name} must be a bool \(True or False\), got "
        elif isinstance(value, int):
            yield field.name, "4", rf"{field.name} must be an int, got {field.name}='4' \(str\)"
        elif isinstance(value, float):
            yield field.name, "1.0", rf"{field.name} must be a number, got {field.name}='1.0'"


@pytest.mark.parametrize("name", EXPECTED)
def test_a_value_of_the_wrong_type_is_a_type_error_naming_key_and_value(name):
    # The same mistake raises the same exception in every scheme (posenc_jax.checks):
    # get("t5", num_heads="4") is a TypeError, as num_buckets="4" is.
    enc = build(name)
    for key, value, match in _wrong_types(enc):
        with pytest.raises(TypeError, match=match):
            dataclasses.replace(enc, **{key: value})
    with pytest.raises(TypeError, match=r"num_heads must be an int, got num_heads='4'"):
        posenc_jax.get("t5", num_heads="4")
    with pytest.raises(TypeError, match=r"num_buckets must be an int, got num_buckets='4'"):
        posenc_jax.get("t5", num_heads=4, num_buckets="4")


def test_names_lists_every_builtin_scheme():
    assert posenc_jax.names() == EXPECTED


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"Unknown encoding 'ropee'; valid names are: alibi, "
                                         r"cope, fire, kerple, learned, mrope, nope, rope, "
                                         r"sandwich, shaw, sinusoidal, t5, xpos"):
        posenc_jax.get("ropee")


def test_unknown_hyperparameter_lists_the_accepted_ones():
    with pytest.raises(ValueError, match=r"encoding 'alibi' got unknown hyperparameter\(s\) "
                                         r"\['slope'\]; it takes: \['num_heads'\]"):
        posenc_jax.get("alibi", num_heads=8, slope=0.5)


def test_for_model_checks_dims_against_given_hyperparameters():
    with pytest.raises(ValueError, match="num_heads=4 does not match the model's num_heads=8"):
        posenc_jax.for_model("alibi", {"num_heads": 4}, embed_dim=32, num_heads=8, head_dim=4)
    with pytest.raises(ValueError, match="encoding 'alibi' does not take head_dim"):
        posenc_jax.for_model("alibi", {"head_dim": 4}, embed_dim=32, num_heads=8, head_dim=4)
    with pytest.raises(ValueError, match="hyperparameter 'base' given twice"):
        posenc_jax.for_model("rope", {"base": 10.0}, embed_dim=32, num_heads=8, head_dim=4,
                             base=20.0)
    enc = posenc_jax.for_model("rope", {"base": 500.0}, embed_dim=32, num_heads=8, head_dim=4)
    assert (enc.head_dim, enc.base) == (4, 500.0)


def test_register_rejects_a_duplicate_name():
    with pytest.raises(ValueError, match="'rope' is already registered"):
        encoding.register("rope")(type("X", (encoding.Encoding,), {}))


def test_for_model_names_a_dimension_mismatch():
    with pytest.raises(ValueError, match=r"'alibi': num_heads=8 does not match the model's "
                                         r"num_heads=4"):
        posenc_jax.for_model("alibi", {"num_heads": 8}, embed_dim=32, num_heads=4, head_dim=8)
    with pytest.raises(ValueError, match=r"'rope': head_dim=8 does not match the model's "
                                         r"head_dim=16"):
        posenc_jax.for_model("rope", {"head_dim": 8}, embed_dim=32, num_heads=2, head_dim=16)


def test_non_integer_positions_are_a_type_error():
    x, q, k, pos = inputs()
    fpos = pos.astype(jnp.float32)
    for name in ["sinusoidal", "learned"]:
        enc = build(name)
        with pytest.raises(TypeError, match="integer"):
            enc.embed(enc.init(jax.random.key(0)), x, fpos)
    with pytest.raises(TypeError, match="integer"):
        build("rope").rotate({}, q, k, fpos, fpos)
    for name in ["t5", "shaw", "shaw_value", "kerple", "kerple_power", "sandwich"]:
        enc = build(name)
        with pytest.raises(TypeError, match="integer"):
            enc.bias(enc.init(jax.random.key(0)), fpos, fpos, q=q)


def test_shaw_bias_without_query_is_an_error():
    enc = build("shaw")
    _, _, _, pos = inputs()
    with pytest.raises(ValueError, match=r"shaw: the bias depends on the query"):
        enc.bias(enc.init(jax.random.key(0)), pos, pos)


@pytest.mark.parametrize("name", ALL)
def test_scheme_is_hashable_and_declares_its_hooks(name):
    enc = build(name)
    assert hash(enc) == hash(build(name)) and enc == build(name)
    assert dataclasses.is_dataclass(enc)
    with pytest.raises(dataclasses.FrozenInstanceError):
        enc.name = "other"  # type: ignore[misc]
    expected = {
        "nope": (False, False, False), "sinusoidal": (True, False, False),
        "learned": (True, False, False), "rope": (False, True, False),
        "mrope": (False, True, False),
        "alibi": (False, False, True), "t5": (False, False, True), "shaw": (False, False, True),
        "kerple": (False, False, True), "sandwich": (False, False, True),
        "fire": (False, False, True), "xpos": (False, True, False),
        "cope": (False, False, True), "shaw_value": (False, False, True),
        "kerple_power": (False, False, True), "rope_p_resonance": (False, True, False),
    }[name]
    assert tuple(hook in enc.hooks for hook in ("embed", "rotate", "bias")) == expected
    assert isinstance(enc, cap.QueryBias) == (name in ("shaw", "shaw_value"))
    assert isinstance(enc, cap.ValueTerm) == (name == "shaw_value")
    assert isinstance(enc, cap.BlockTransform) == (name == "xpos")
    assert isinstance(enc, cap.RowBias) == (name == "cope")
    assert isinstance(enc, cap.CausalOnly) == (name == "xpos")
    assert isinstance(enc, cap.ElementwiseBias) == (name in ("alibi", "t5", "kerple",
                                                             "kerple_power", "sandwich", "fire"))
    assert isinstance(enc, cap.KernelRotary) == (name in ("rope", "rope_p_resonance"))
    assert isinstance(enc, cap.LengthDependent) == (name in ("rope", "rope_p_resonance"))
    assert isinstance(enc, cap.MultiAxisPositions) == (name == "mrope")
    assert isinstance(enc, cap.MaxPositions) == isinstance(enc, cap.ModelDefaults) == (
        name == "learned")
    assert isinstance(enc, cap.ParamAxes) == bool(jax.tree.leaves(enc.init(jax.random.key(0))))


@pytest.mark.parametrize("name", ALL)
def test_unused_hooks_are_identity(name):
    enc = build(name)
    params = _random_params(enc, jax.random.key(1))
    x, q, k, pos = inputs()
    out = all_hooks(enc, params, x, q, k, pos)
    if "embed" not in enc.hooks:
        assert out["embed"] is x
    if "rotate" not in enc.hooks:
        assert out["q"] is q and out["k"] is k
    if "bias" not in enc.hooks:
        assert "bias" not in out
    else:
        chex.assert_shape(out["bias"], (B, H, L, L))
        chex.assert_type(out["bias"], jnp.float32)


@pytest.mark.parametrize("name", ALL)
def test_hooks_jit_equals_eager_and_static_scheme_works(name):
    enc = build(name)
    params = _random_params(enc, jax.random.key(2))
    args = inputs(2)
    eager = all_hooks(enc, params, *args)
    jitted = jax.jit(all_hooks, static_argnums=0)(enc, params, *args)
    chex.assert_trees_all_close(eager, jitted, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_hooks_vmap_over_the_batch(name):
    enc = build(name)
    params = _random_params(enc, jax.random.key(3))
    x, q, k, pos = inputs(3)
    batched = all_hooks(enc, params, x, q, k, pos)

    def one(x1, q1, k1, p1):  # a single row: [L, E], [L, H, D], [L]
        out = all_hooks(enc, params, x1[None], q1[None], k1[None], p1[None])
        return jax.tree.map(lambda a: a[0], out)

    mapped = jax.jit(jax.vmap(one))(x, q, k, pos)
    chex.assert_trees_all_close(batched, mapped, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_hooks_are_differentiable(name):
    enc = build(name)
    params = _random_params(enc, jax.random.key(4))
    x, q, k, pos = inputs(4)

    def loss(params, x, q, k):
        out = all_hooks(enc, params, x, q, k, pos)
        return sum(jnp.sum(jnp.sin(v)) for v in jax.tree.leaves(out))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(params, x, q, k)
    chex.assert_tree_all_finite(grads)
    gp, gx, gq, _gk = grads
    assert float(jnp.abs(gx).sum()) > 0 and float(jnp.abs(gq).sum()) > 0
    for leaf in jax.tree.leaves(gp):  # every learned table gets a gradient
        assert float(jnp.abs(leaf).sum()) > 0


def test_rope_scaling_dict_is_validated_and_frozen():
    enc = posenc_jax.get("rope", head_dim=8, scaling={"rope_type": "linear", "factor": 4.0})
    assert enc.scaling_dict == {"rope_type": "linear", "factor": 4.0}
    hash(enc)
    with pytest.raises(ValueError, match="factor"):
        posenc_jax.get("rope", head_dim=8, scaling={"rope_type": "linear", "factor": 0.5})
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        posenc_jax.get("rope", head_dim=8, rotary_dim=5)
    with pytest.raises(ValueError, match=r"unknown layout 'pairs'"):
        posenc_jax.get("rope", head_dim=8, layout="pairs")


def test_rope_hook_with_scaling_equals_positions_over_factor():
    """PI through the registry: `scaling=linear(s)` rotates like plain RoPE at pos / s."""
    _, q, k, pos = inputs(5)
    scaled = posenc_jax.get("rope", head_dim=D, scaling={"rope_type": "linear", "factor": 4.0})
    got_q, _ = jax.jit(scaled.rotate)({}, q, k, pos, pos)
    inv = posenc_jax.encodings.rope.inv_freq(D)
    want_q = posenc_jax.encodings.rope.apply(q, pos.astype(jnp.float32) / 4.0, inv)
    chex.assert_trees_all_close(got_q, want_q, rtol=1e-5, atol=1e-5)


def _angle_tolerance(max_pos: float, freqs: np.ndarray) -> np.ndarray:
    """What float32 angles cost at position p: the rounding of the frequency and of p * f,
    about 2 * p * f * 2^-24 radians (bfloat16 angles would cost p * f * 2^-8)."""
    return 2.0 * max_pos * freqs * 2.0**-24 + 1e-6


def test_every_hook_in_bfloat16_at_positions_near_1e6_matches_float64():
    """Every hook in bfloat16 stays within tolerance of a float64 reference at
    positions up to 10^6 (angles are float32 whatever the activation dtype)."""
    length, offset = 8, 10**6 - 8
    pos = jnp.asarray(np.stack([np.arange(length) + offset, np.arange(length) + offset // 3]),
                      jnp.int32)
    p64 = np.asarray(pos, np.float64)
    bf16_ulp = 2.0**-8  # relative spacing of bfloat16 near 1

    # sinusoidal: PE[2i] = sin(p w_i), PE[2i+1] = cos(p w_i)
    enc = posenc_jax.get("sinusoidal", embed_dim=E)
    got = np.asarray(jax.jit(enc.embed)({}, jnp.zeros((2, length, E), jnp.bfloat16), pos),
                     np.float64)
    w = 1.0 / 10000.0 ** (np.arange(0, E, 2) / E)
    want = np.zeros((2, length, E))
    want[..., 0::2], want[..., 1::2] = np.sin(p64[..., None] * w), np.cos(p64[..., None] * w)
    tol = np.repeat(_angle_tolerance(1e6, w), 2) + bf16_ulp
    assert np.all(np.abs(got - want) <= tol), np.max(np.abs(got - want) - tol)

    # rope: rotate bf16 q, compare with the float64 rotation of the same bf16 values
    rng = np.random.default_rng(7)
    q = jnp.asarray(rng.standard_normal((2, length, H, D)), jnp.bfloat16)
    enc = posenc_jax.get("rope", head_dim=D)
    got_q, _ = jax.jit(enc.rotate)({}, q, q, pos, pos)
    q64 = np.asarray(q, np.float64)
    r = D // 2
    w = 1.0 / 10000.0 ** (np.arange(0, D, 2) / D)
    ang = p64[..., None, None] * w                                   # [B, L, 1, R]
    x1, x2 = q64[..., :r], q64[..., r:]
    want = np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang),
                           x2 * np.cos(ang) + x1 * np.sin(ang)], -1)
    mag = np.abs(x1) + np.abs(x2)
    tol = np.concatenate([mag * _angle_tolerance(1e6, w)] * 2, -1) + bf16_ulp * np.abs(want)
    err = np.abs(np.asarray(got_q, np.float64) - want)
    assert np.all(err <= tol + 1e-6), np.max(err - tol)

    # alibi: -slope * |i - j| from integer differences, exact in float32
    enc = posenc_jax.get("alibi", num_heads=H)
    got = np.asarray(jax.jit(enc.bias)({}, pos, pos))
    slopes = np.asarray(posenc_jax.encodings.alibi.slopes(H), np.float64)
    want = -slopes[None, :, None, None] * np.abs(p64[:, None, :, None] - p64[:, None, None, :])
    np.testing.assert_allclose(got, want, rtol=1e-7)

    # t5 and shaw read only j - i: at 10^6 they equal the same bias at positions from 0
    base = pos - jnp.min(pos, axis=1, keepdims=True)
    for name in ["t5", "shaw", "shaw_value", "kerple", "kerple_power", "sandwich"]:
        enc = build(name)
        params = enc.init(jax.random.key(8))
        qs = q * D**-0.5
        bias = jax.jit(lambda prm, p, qq, e=enc: e.bias(prm, p, p, q=qq))
        far, near = bias(params, pos, qs), bias(params, base, qs)
        np.testing.assert_array_equal(np.asarray(far), np.asarray(near))
