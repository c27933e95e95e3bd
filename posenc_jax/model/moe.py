"""The mixture-of-experts MLP: a router, top-k experts, an optional shared expert.

    logits = x W_router (+ b)                        [N, X]   N = B * T tokens, X experts
    w, idx = route(logits)                           [N, k]   the router kind below
    y_n    = sum_j w_nj * expert_{idx_nj}(x_n)       (+ shared(x_n))

Routers (`router`):

    softmax_topk_norm  softmax over all X, top k, renormalised to sum 1   Qwen3-MoE, Mixtral
    softmax_topk       softmax over all X, top k, as they are             Qwen3-MoE without
                                                                          norm_topk_prob
    topk_softmax       top k logits, softmax over those k                 gpt-oss
    sigmoid_topk       top k logits, sigmoid of each; the weight scales   Llama 4
                       the expert's INPUT (x_n * w_nj), not its output

Ties among logits go to the lower expert index (`jax.lax.top_k`). Each expert is the block's
MLP (`mlp_activation`, hidden width `moe_mlp_dim`), with biases when `expert_bias`.

Dispatch (exact: every selected expert computed, no token dropped, no capacity): the N * k
(token, expert) pairs are sorted by expert, the tokens gathered into [N k, E] rows, and each
projection is one `jax.lax.ragged_dot` over the expert-stacked weights [X, E, F] (a grouped
matmul: no Python loop over experts); a gather by the inverse order and a k-sum combine.
Live memory O(N k (E + F)); work 3 N k E F where the backend has a grouped matmul (TPU, GPU).
XLA:CPU lowers `ragged_dot` densely (each row against every expert, masked): X times that.
An expert no token chose gets a zero gradient.

Params (logical axes): `router` [E, X] ("embed", None), `router_bias` [X]; `gate`, `up`
[X, E, F] ("expert", "embed", "mlp"); `down` [X, F, E] ("expert", "mlp", "embed"); biases
`gate_bias`, `up_bias` [X, F], `down_bias` [X, E]; `shared` an MLP of width
`shared_expert_mlp_dim`. The rule for "expert" picks the mesh axis the experts are split over;
it must be one that the rules for "embed" and "mlp" do not use (a mesh axis shards one
dimension of an array). train's default maps it to None: the stacked weights are then split
like any MLP weight, over embed -> fsdp (FSDP, gathered per layer) and mlp -> tensor; mapping
it to e.g. "data" splits the experts over the data-parallel devices (expert parallelism,
through XLA's sharding propagation: no hand-written all-to-all).

The load-balancing loss (Switch / Mixtral; transformers' `load_balancing_loss_func` applied to
one layer): X * sum_e f_e P_e, f_e = the share of the N tokens whose top k holds e (summed
over the k slots), P_e = the mean softmax probability of e over all X. It is k at a perfectly
even routing. The model averages it over its MoE layers (transformers pools all layers'
tokens first) and over all tokens, padding included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from posenc_jax.checks import boolean, finite_float, integer, one_of, positive_int
from posenc_jax.model.mlp import GATED_ACTIVATIONS, MLP, activate
from posenc_jax.model.params import normal, param

__all__ = ["ROUTERS", "MoE", "check_moe", "dispatch", "load_balancing_loss", "route"]

Array = jax.Array
ROUTERS = ("softmax_topk_norm", "softmax_topk", "topk_softmax", "sigmoid_topk")


def check_moe(config: Any, set_: Callable[[str, Any], None]) -> None:
    """Validates the MoE fields of a `TransformerConfig` under construction: num_experts,
    experts_per_token, moe_mlp_dim, router, router_bias, expert_bias, shared_expert_mlp_dim,
    moe_layers (normalised to a sorted tuple, or None), moe_aux_loss_coef."""
    n = integer("num_experts", config.num_experts, minimum=0)
    set_("num_experts", n)
    for name in ("router_bias", "expert_bias"):
        boolean(name, getattr(config, name))
    shared = integer("shared_expert_mlp_dim", config.shared_expert_mlp_dim, minimum=0)
    set_("moe_aux_loss_coef",
         finite_float("moe_aux_loss_coef", config.moe_aux_loss_coef, minimum=0.0))
    if n == 0:
        for name, value in (("moe_layers", config.moe_layers),
                            ("shared_expert_mlp_dim", shared or None)):
            if value is not None:
                raise ValueError(f"{name}={value!r} needs num_experts > 0 (a dense model has no "
                                 "MoE layers)")
        return
    integer("experts_per_token", config.experts_per_token, minimum=1, maximum=n)
    set_("moe_mlp_dim", positive_int("moe_mlp_dim", config.moe_mlp_dim or config.mlp_dim))
    one_of("router", config.router, ROUTERS)
    layers = config.moe_layers
    if layers is not None:
        if isinstance(layers, (str, bytes, int)) or not hasattr(layers, "__iter__"):
            raise TypeError(f"moe_layers must be None (every layer) or a sequence of layer "
                            f"indices, got moe_layers={layers!r}")
        layers = tuple(integer(f"moe_layers[{i}]", j, minimum=0, maximum=config.num_layers - 1)
                       for i, j in enumerate(layers))
        if len(set(layers)) != len(layers):
            raise ValueError(f"moe_layers={layers!r} repeats a layer")
        every = len(layers) == config.num_layers
        set_("moe_layers", None if every else tuple(sorted(layers)))  # all layers: None


def is_moe_layer(config: Any, i: int) -> bool:
    """Whether layer i runs the MoE MLP (else the dense MLP of width mlp_dim)."""
    return config.num_experts > 0 and (config.moe_layers is None or i in config.moe_layers)


def route(logits: Array, *, k: int, router: str) -> tuple[Array, Array]:
    """(weights float32 [N, k], expert ids int32 [N, k]) from router logits [N, X] (see the
    module docstring for the router kinds); ties go to the lower id."""
    logits = logits.astype(jnp.float32)
    if router in ("softmax_topk_norm", "softmax_topk"):
        w, idx = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)
        if router == "softmax_topk_norm":
            w = w / jnp.sum(w, axis=-1, keepdims=True)
        return w, idx
    top, idx = jax.lax.top_k(logits, k)
    if router == "topk_softmax":
        return jax.nn.softmax(top, axis=-1), idx
    if router == "sigmoid_topk":
        return jax.nn.sigmoid(top), idx
    raise ValueError(f"router={router!r} is not one of {ROUTERS}")


def load_balancing_loss(logits: Array, idx: Array) -> Array:
    """float32 scalar X * sum_e f_e P_e for router logits [N, X] and the chosen ids [N, k]
    (module docstring)."""
    x = logits.shape[-1]
    probs = jnp.mean(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), axis=0)     # [X]
    share = jnp.mean(jnp.sum(jax.nn.one_hot(idx, x, dtype=jnp.float32), axis=1), axis=0)
    return x * jnp.sum(share * probs)


def dispatch(x: Array, w: Array, idx: Array, weights: dict[str, Array], *, activation: str,
             scale_input: bool = False) -> Array:
    """sum_j w_nj * expert_{idx_nj}(x_n) for tokens x [N, E], weights w [N, k], ids [N, k];
    `weights`: "up" (and "gate" for gated activations) [X, E, F], "down" [X, F, E], optional
    "gate_bias" / "up_bias" [X, F], "down_bias" [X, E]. `scale_input`: w scales each expert's
    input instead of its output (Llama 4). Returns [N, E] in x's dtype."""
    n, k = idx.shape
    num = weights["down"].shape[0]
    flat = idx.reshape(-1)
    order = jnp.argsort(flat, stable=True)                    # pairs sorted by expert
    ids = flat[order]
    sizes = jnp.bincount(flat, length=num).astype(jnp.int32)  # rows per expert
    scale = w.reshape(-1)[order].astype(x.dtype)[:, None]     # [N k, 1]
    rows = jnp.take(x, order // k, axis=0)                    # [N k, E]
    rows = rows * scale if scale_input else rows

    def project(h, name):
        out = jax.lax.ragged_dot(h, weights[name].astype(x.dtype), sizes)
        bias = weights.get(f"{name}_bias")
        return out if bias is None else out + jnp.take(bias.astype(x.dtype), ids, axis=0)

    gate = project(rows, "gate") if activation in GATED_ACTIVATIONS else None
    y = project(activate(activation, gate, project(rows, "up")), "down")  # [N k, E]
    y = y if scale_input else y * scale
    y = jnp.take(y, jnp.argsort(order), axis=0)               # back to (token, slot) order
    return jnp.sum(y.reshape(n, k, -1), axis=1)


class MoE(nnx.Module):
    """The mixture-of-experts MLP over [B, T, E]: `(y [B, T, E], aux float32 scalar)`, aux
    being this layer's load-balancing loss. See the module docstring."""

    def __init__(self, config, *, rngs: nnx.Rngs):
        e, x, f, pd = config.embed_dim, config.num_experts, config.moe_mlp_dim, config.param_dtype
        self.config = config
        self.router = param(normal(rngs.params(), (e, x), e), ("embed", None), pd)
        if config.router_bias:
            self.router_bias = param(jnp.zeros((x,)), (None,), pd)
        names = (("gate", "up") if config.mlp_activation in GATED_ACTIVATIONS else ("up",))
        for name in names:
            setattr(self, name, param(normal(rngs.params(), (x, e, f), e),
                                      ("expert", "embed", "mlp"), pd))
            if config.expert_bias:
                setattr(self, f"{name}_bias", param(jnp.zeros((x, f)), ("expert", "mlp"), pd))
        self.down = param(normal(rngs.params(), (x, f, e), f), ("expert", "mlp", "embed"), pd)
        if config.expert_bias:
            self.down_bias = param(jnp.zeros((x, e)), ("expert", "embed"), pd)
        if config.shared_expert_mlp_dim:
            self.shared = MLP(config, rngs=rngs, mlp_dim=config.shared_expert_mlp_dim)

    def expert_weights(self) -> dict[str, Array]:
        """The stacked expert params by name (what `dispatch` takes)."""
        names = ("gate", "up", "down", "gate_bias", "up_bias", "down_bias")
        return {n: getattr(self, n)[...] for n in names if hasattr(self, n)}

    def __call__(self, x: Array) -> tuple[Array, Array]:
        cfg, dt = self.config, self.config.dtype
        b, t, e = x.shape
        flat = x.reshape(b * t, e)
        logits = jnp.einsum("ne,ex->nx", flat, self.router[...].astype(dt))
        if cfg.router_bias:
            logits = logits + self.router_bias[...].astype(dt)[None]
        w, idx = route(logits, k=cfg.experts_per_token, router=cfg.router)
        y = dispatch(flat, w, idx, self.expert_weights(), activation=cfg.mlp_activation,
                     scale_input=cfg.router == "sigmoid_topk").reshape(b, t, e)
        if cfg.shared_expert_mlp_dim:
            y = y + self.shared(x)
        return y, load_balancing_loss(logits, idx)
