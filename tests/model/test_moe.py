"""The mixture-of-experts layer: every router kind against a float64 per-token NumPy loop
(values, and gradients against the dense mixture), ties, k = X, the load-balancing loss, the
config's refusals, the sharded layer, scan and the KV cache with MoE layers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax.model import lora, moe
from posenc_jax.model.kv_cache import init_cache
from posenc_jax.model.mlp import SWIGLU_ALPHA, SWIGLU_LIMIT
from posenc_jax.model.transformer import Transformer, TransformerConfig, complete_rules

X, E, F, N = 4, 6, 5, 7


def _np_act(act, g, u):
    if act == "swiglu":
        return g / (1 + np.exp(-g)) * u
    if act == "swiglu_clamped":
        g, u = np.minimum(g, SWIGLU_LIMIT), np.clip(u, -SWIGLU_LIMIT, SWIGLU_LIMIT)
        return (u + 1) * g / (1 + np.exp(-SWIGLU_ALPHA * g))
    raise AssertionError(act)


def _np_route(logit, k, router):
    """One token's (weights, ids), float64; ties to the lower id (a stable sort)."""
    ids = np.argsort(-logit, kind="stable")[:k]
    if router.startswith("softmax"):
        p = np.exp(logit - logit.max())
        p /= p.sum()
        w = p[ids] / (p[ids].sum() if router == "softmax_topk_norm" else 1.0)
    elif router == "topk_softmax":
        w = np.exp(logit[ids] - logit[ids].max())
        w /= w.sum()
    else:
        w = 1 / (1 + np.exp(-logit[ids]))
    return w, ids


def _np_moe(x, router_w, ws, *, k, router, act):
    """The per-token loop: sum over the chosen experts of w * expert(x) (Llama 4: expert(w x))."""
    x = np.asarray(x, np.float64)
    ws = {n: np.asarray(v, np.float64) for n, v in ws.items()}
    logits = x @ np.asarray(router_w, np.float64)
    out = np.zeros_like(x)
    for n in range(x.shape[0]):
        w, ids = _np_route(logits[n], k, router)
        for wj, e in zip(w, ids):
            xin = x[n] * wj if router == "sigmoid_topk" else x[n]
            g = xin @ ws["gate"][e] + ws.get("gate_bias", np.zeros((X, F)))[e]
            u = xin @ ws["up"][e] + ws.get("up_bias", np.zeros((X, F)))[e]
            y = _np_act(act, g, u) @ ws["down"][e] + ws.get("down_bias", np.zeros((X, E)))[e]
            out[n] += y if router == "sigmoid_topk" else wj * y
    return out, logits


def _weights(seed, bias=False):
    ks = jax.random.split(jax.random.key(seed), 7)
    ws = {"gate": jax.random.normal(ks[0], (X, E, F)), "up": jax.random.normal(ks[1], (X, E, F)),
          "down": jax.random.normal(ks[2], (X, F, E)) / 2}
    if bias:
        ws.update(gate_bias=jax.random.normal(ks[3], (X, F)),
                  up_bias=jax.random.normal(ks[4], (X, F)),
                  down_bias=jax.random.normal(ks[5], (X, E)))
    return jax.random.normal(ks[6], (N, E)), jax.random.normal(ks[6], (E, X)) * 2, ws


@functools.partial(jax.jit, static_argnames=("k", "router", "act"))
def _layer(x, router_w, ws, *, k, router, act):
    logits = x @ router_w
    w, idx = moe.route(logits, k=k, router=router)
    return moe.dispatch(x, w, idx, ws, activation=act, scale_input=router == "sigmoid_topk")


@pytest.mark.parametrize("router,act,bias", [
    ("softmax_topk_norm", "swiglu", False), ("softmax_topk", "swiglu", True),
    ("topk_softmax", "swiglu_clamped", True), ("sigmoid_topk", "swiglu", False)])
def test_layer_matches_per_token_loop(router, act, bias):
    x, router_w, ws = _weights(1, bias)
    if act == "swiglu_clamped":  # reach the clamps
        ws = {**ws, "gate": ws["gate"] * 4, "up": ws["up"] * 4}
    got = _layer(x, router_w, ws, k=2, router=router, act=act)
    want, _ = _np_moe(x, router_w, ws, k=2, router=router, act=act)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


def _dense_mixture(x, router_w, ws, *, k, router, act):
    """Every expert on every token, combined with the routing weights scattered to [N, X]."""
    w, idx = moe.route(x @ router_w, k=k, router=router)
    full = jnp.sum(jax.nn.one_hot(idx, X) * w[..., None], axis=1)              # [N, X]
    g = jnp.einsum("ne,xef->nxf", x, ws["gate"])
    u = jnp.einsum("ne,xef->nxf", x, ws["up"])
    h = jax.nn.silu(g) * u if act == "swiglu" else None
    return jnp.einsum("nxf,xfe,nx->ne", h, ws["down"], full)


def test_gradients_equal_the_dense_mixture_and_skip_unchosen_experts():
    x, router_w, ws = _weights(2)
    x, router_w = jnp.abs(x), router_w.at[:, 3].set(-50.0)   # expert 3 is never chosen
    kw = {"k": 2, "router": "softmax_topk_norm", "act": "swiglu"}

    def loss(fn, x, router_w, ws):
        return jnp.sum(jnp.sin(fn(x, router_w, ws, **kw)))

    got = jax.jit(jax.grad(functools.partial(loss, _layer), argnums=(0, 1, 2)))(x, router_w, ws)
    want = jax.jit(jax.grad(functools.partial(loss, _dense_mixture), argnums=(0, 1, 2)))(
        x, router_w, ws)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    for name in ("gate", "up", "down"):
        assert not np.any(np.asarray(got[2][name][3]))


def test_all_experts_chosen_is_the_dense_mixture():
    x, router_w, ws = _weights(3)
    got = _layer(x, router_w, ws, k=X, router="softmax_topk_norm", act="swiglu")
    p = jax.nn.softmax(x @ router_w, axis=-1)
    ys = jnp.stack([(jax.nn.silu(x @ ws["gate"][e]) * (x @ ws["up"][e])) @ ws["down"][e]
                    for e in range(X)], axis=1)                                # [N, X, E]
    np.testing.assert_allclose(got, jnp.einsum("nx,nxe->ne", p, ys), rtol=1e-5, atol=1e-5)


def test_ties_go_to_the_lower_expert():
    logits = jnp.array([[1.0, 3.0, 3.0, 3.0], [2.0, 2.0, 2.0, 2.0]])
    for router in moe.ROUTERS:
        _, idx = moe.route(logits, k=2, router=router)
        np.testing.assert_array_equal(idx, [[1, 2], [0, 1]])


def test_load_balancing_loss_matches_numpy():
    logits = np.random.default_rng(0).normal(size=(N, X))
    _, idx = moe.route(jnp.asarray(logits), k=2, router="softmax_topk_norm")
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    share = np.zeros(X)
    for row in np.asarray(idx):
        share[row] += 1.0 / N
    want = X * np.sum(share * p.mean(0))
    np.testing.assert_allclose(moe.load_balancing_loss(jnp.asarray(logits), idx), want,
                               rtol=1e-6)
    even = moe.load_balancing_loss(jnp.zeros((X, X)), jnp.stack(
        [jnp.arange(X), (jnp.arange(X) + 1) % X], axis=1))
    np.testing.assert_allclose(even, 2.0, rtol=1e-6)   # k at a perfectly even routing


BASE = {"vocab_size": 32, "num_layers": 4, "embed_dim": 16, "num_heads": 2, "mlp_dim": 24}
MOE = {"num_experts": 4, "experts_per_token": 2, "moe_mlp_dim": 8, "moe_layers": (1, 3),
       "shared_expert_mlp_dim": 8}


@pytest.mark.parametrize("overrides,error,text", [
    ({"num_experts": -1}, ValueError, "num_experts"),
    ({"num_experts": 4, "experts_per_token": 5}, ValueError, "experts_per_token=5"),
    ({"num_experts": 4, "experts_per_token": 0}, ValueError, "experts_per_token=0"),
    ({"num_experts": 4, "router": "softmax"}, ValueError, "router"),
    ({"num_experts": 4, "router_bias": 1}, TypeError, "router_bias=1"),
    ({"num_experts": 4, "moe_layers": (0, 4)}, ValueError, "moe_layers[1]=4"),
    ({"num_experts": 4, "moe_layers": (1, 1)}, ValueError, "repeats"),
    ({"num_experts": 4, "moe_layers": 2}, TypeError, "moe_layers=2"),
    ({"moe_layers": (1,)}, ValueError, "moe_layers=(1,) needs num_experts > 0"),
    ({"shared_expert_mlp_dim": 8}, ValueError, "shared_expert_mlp_dim=8"),
    ({"num_experts": 4, "moe_aux_loss_coef": -0.1}, ValueError, "moe_aux_loss_coef"),
    ({"mlp_activation": "swish"}, ValueError, "swiglu_clamped"),
])
def test_bad_moe_keys_are_refused(overrides, error, text):
    with pytest.raises(error) as info:
        TransformerConfig(**BASE, **overrides)
    assert text in str(info.value)


@pytest.fixture(scope="module")
def model():
    return Transformer(TransformerConfig(**BASE, **MOE), rngs=nnx.Rngs(0))


TOKENS = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) * 5 % 32


@nnx.jit
def _hidden_and_aux(model, tokens):
    return model.hidden_states_and_aux(tokens)


@nnx.jit
def _cached(model, tokens, cache):
    return model(tokens, cache=cache)


def test_model_has_moe_only_where_asked(model):
    kinds = [type(b.mlp).__name__ for b in model.layers]
    assert kinds == ["MLP", "MoE", "MLP", "MoE"]
    assert model.layers[1].mlp.up[...].shape == (4, 16, 8)
    assert model.layers[1].mlp.up.out_sharding == ("expert", "embed", "mlp")
    _, aux = _hidden_and_aux(model, TOKENS)
    assert 1.0 < float(aux) < 4.0    # mean over the two MoE layers; k = 2 when even


def test_scan_equals_loop(model):
    scanned = Transformer(TransformerConfig(**BASE, **MOE, scan_layers=True), rngs=nnx.Rngs(0))
    (h1, a1), (h2, a2) = (_hidden_and_aux(m, TOKENS) for m in (model, scanned))
    np.testing.assert_allclose(h1, h2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a1, a2, rtol=1e-6)


def test_kv_cache_decoding_equals_the_full_forward(model):
    full = model.head(_hidden_and_aux(model, TOKENS)[0])
    cache = init_cache(model, batch_size=2, max_len=8)
    logits, cache = _cached(model, TOKENS[:, :5], cache)
    steps = [logits]
    for t in range(5, 8):
        logits, cache = _cached(model, TOKENS[:, t:t + 1], cache)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, rtol=1e-4, atol=1e-4)


def test_experts_sharded_over_a_mesh_axis_equal_one_device(model):
    graphdef, state = nnx.split(model)

    def loss(state, tokens):
        hidden, aux = nnx.merge(graphdef, state).hidden_states_and_aux(tokens)
        return jnp.mean(hidden ** 2) + aux

    want = jax.jit(jax.value_and_grad(loss))(state, TOKENS)
    mesh = jax.make_mesh((2, 4), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rules = complete_rules((("batch", "data"), ("expert", "fsdp")))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        shardings = nnx.get_named_sharding(state, mesh)
        sharded = jax.device_put(state, shardings)
        assert sharded["layers"][1]["mlp"]["up"][...].sharding.spec[0] == "fsdp"
        got = jax.jit(jax.value_and_grad(loss))(sharded, TOKENS)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_lora_adapts_each_expert_on_its_own(model):
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    adapters = lora.init(params, rank=2, targets=("up",), key=jax.random.key(0))
    ab = adapters["layers"][1]["mlp"]["up"]
    assert ab["a"].shape == (4, 16, 2) and ab["b"].shape == (4, 2, 8)
    assert adapters["layers"][0]["mlp"]["up"]["a"].shape == (16, 2)   # the dense layer
    ab["b"] = jax.random.normal(jax.random.key(1), ab["b"].shape)
    merged = lora.merge(params, adapters, rank=2, alpha=4.0)["layers"][1]["mlp"]["up"]
    w = params["layers"][1]["mlp"]["up"]
    for x in range(4):
        np.testing.assert_allclose(merged[x], w[x] + 2.0 * ab["a"][x] @ ab["b"][x], rtol=1e-5,
                                   atol=1e-6)
