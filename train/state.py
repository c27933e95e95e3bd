"""The train state and where it lives: model construction, shardings, initialisation.

The train state is a plain dict of pytrees, the same thing that is checkpointed:

    {"params": pure dict of the parameter arrays that train (nnx.Param values; with LoRA
               {"adapters", "base"}: see `train.trainable`),
     "frozen": the parameters that do not train (only with LoRA),
     "opt_state": the optax state over "params" alone,
     "step": int32 [] updates done}

`TrainSetup.full_params(state)` gives the params the model runs with. A run whose config
names `init.checkpoint` builds its model from the checkpoint's architecture and starts from its
weights (`train.from_checkpoint`); otherwise from `config.model` and random weights.

Parameter shardings come from the logical axis names the model puts on each `nnx.Param`
(`out_sharding` metadata) mapped through the config's `logical_axis_rules`; the optimizer's
moment trees inherit their parameter's sharding and its scalars are replicated. `abstract`
is the whole state as `jax.ShapeDtypeStruct(..., sharding=...)` on the current mesh: what
orbax restores onto, whatever mesh the checkpoint was written from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from posenc_jax.model.config import TransformerConfig, freeze
from posenc_jax.model.transformer import Transformer
from train import from_checkpoint, optim, sharding, trainable


def transformer_config(model: Mapping[str, Any], **overrides: Any) -> TransformerConfig:
    """`TransformerConfig` from the config's `model` ConfigDict (plus overrides)."""
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    model = dict(model.to_dict() if hasattr(model, "to_dict") else model)
    model.update(overrides)
    unknown = sorted(set(model) - fields)
    if unknown:
        raise ValueError(f"config.model has unknown key(s) {unknown}; TransformerConfig takes "
                         f"{sorted(fields)}")
    return TransformerConfig(**model)


def build_model(model_config: TransformerConfig, *, seed: Any) -> nnx.Module:
    """The Flax NNX transformer with parameters from `seed` (an int or a PRNG key; call under
    `mesh_context` to create the parameters sharded)."""
    return Transformer(model_config, rngs=nnx.Rngs(params=seed))


def cpu_fast_compile(mesh: Mesh) -> dict[str, Any] | None:
    """XLA options for one-off programs (init, checksums) on CPU, where compiling the many
    threefry calls of an init at full optimisation takes seconds: None elsewhere."""
    if mesh.devices.flat[0].platform != "cpu":
        return None
    return {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@contextlib.contextmanager
def mesh_context(mesh: Mesh, rules: tuple):
    """The mesh and logical rules the model reads while it is built or traced."""
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        yield


@dataclasses.dataclass(frozen=True, eq=False)
class TrainSetup:
    """Everything about a run that does not change from step to step (hashable by identity,
    so a `train.runtime.Runtime` can key the functions it compiles for it)."""

    model_config: TransformerConfig
    mesh: Mesh
    rules: tuple
    graphdef: Any
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    abstract: dict[str, Any]    # the state as ShapeDtypeStructs with shardings
    shardings: dict[str, Any]   # the state's NamedShardings
    params_shardings: Any = None  # the full params' NamedShardings (what the model runs with)
    trainable: trainable.Trainable = trainable.Trainable()
    config: Any = None          # the experiment config it was made from (init.checkpoint)

    def context(self):
        return mesh_context(self.mesh, self.rules)

    def full_params(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The params the model runs with, from a train state (adapters merged)."""
        return trainable.compose(self.trainable, state["params"], state.get("frozen"))


def param_shardings(abstract_params: nnx.State, mesh: Mesh, rules: tuple) -> dict[str, Any]:
    """NamedSharding per parameter (a pure dict), from its logical axis names and `rules`."""

    def spec_of(path, var):
        what = "param " + "/".join(str(getattr(k, "key", k)) for k in path)
        logical = var.get_metadata().get("out_sharding") if isinstance(var, nnx.Variable) \
            else None
        spec = sharding.logical_to_mesh_spec(logical, rules, what=what)
        shape = var.get_value().shape if isinstance(var, nnx.Variable) else var.shape
        sharding.check_divisible(shape, spec, mesh, what=what)
        return var.replace(NamedSharding(mesh, spec)) if isinstance(var, nnx.Variable) \
            else NamedSharding(mesh, spec)

    tree = jax.tree_util.tree_map_with_path(
        spec_of, abstract_params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.to_pure_dict(tree)


def _opt_shardings(tx, abstract_params, param_sh, mesh):
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    replicated = NamedSharding(mesh, P())
    return abstract_opt, optax.tree_map_params(
        tx, lambda _, s: s, abstract_opt, param_sh,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, NamedSharding))


def model_config_of(config: Any, model_overrides: Mapping[str, Any] | None = None
                    ) -> TransformerConfig:
    """The run's `TransformerConfig`: the checkpoint's architecture when `config.init`
    names one (`train.from_checkpoint.model_config`), else `config.model`; then overrides."""
    if from_checkpoint.checkpoint_path(config):
        model_config, _ = from_checkpoint.model_config(config)
        return dataclasses.replace(model_config, **dict(model_overrides or {}))
    return transformer_config(config.model, **dict(model_overrides or {}))


def make_setup(config: Any, mesh: Mesh, *, model_overrides: Mapping[str, Any] | None = None,
               ) -> TrainSetup:
    """Model, optimizer and state shardings for `config` on `mesh` (nothing allocated).

    Builds a new setup on every call; `train.runtime.Runtime.setup` keeps them for reuse.
    """
    rules = sharding.normalize_rules(config.logical_axis_rules)
    model_config = model_config_of(config, model_overrides)
    spec = trainable.from_config(config)
    tx, schedule = optim.make_optimizer(config)
    with mesh_context(mesh, rules):
        abstract_model = nnx.eval_shape(lambda: build_model(model_config, seed=0))
        graphdef, abstract_params = nnx.split(abstract_model, nnx.Param)
    param_sh = param_shardings(abstract_params, mesh, rules)
    pure = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype),
                        nnx.to_pure_dict(abstract_params))
    trained, frozen = jax.eval_shape(
        lambda p: trainable.split(p, spec, key=jax.random.key(0)), pure)
    replicated = NamedSharding(mesh, P())
    trained_sh = trainable.shardings_like(trained, param_sh, replicated)
    abstract_opt, opt_sh = _opt_shardings(tx, trained, trained_sh, mesh)
    shardings = {"params": trained_sh, "opt_state": opt_sh, "step": replicated}
    shapes = {"params": trained, "opt_state": abstract_opt,
              "step": jax.ShapeDtypeStruct((), jnp.int32)}
    if spec.lora:
        shardings["frozen"] = trainable.shardings_like(frozen, param_sh, replicated)
        shapes["frozen"] = frozen
    abstract = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
    return TrainSetup(model_config=model_config, mesh=mesh, rules=rules, graphdef=graphdef,
                      tx=tx, schedule=schedule, abstract=abstract, shardings=shardings,
                      params_shardings=param_sh, trainable=spec, config=config)


def setup_key(config: Any, mesh: Mesh, model_overrides: Mapping[str, Any] | None = None
              ) -> tuple:
    """What `make_setup` depends on (the model, optimizer keys, rules, mesh, overrides), as a
    hashable key: two configs with the same key get the same setup."""
    return (freeze({k: config.get(k) for k in optim.OPTIMIZER_KEYS}), freeze(config.model),
            freeze(config.logical_axis_rules), mesh, freeze(model_overrides or {}),
            freeze(config.get("init") or {}), freeze(config.get("lora") or {}))


def _state_from(setup: TrainSetup, params, key) -> dict[str, Any]:
    trained, frozen = trainable.split(params, setup.trainable, key=jax.random.fold_in(key, 1))
    out = {"params": trained, "opt_state": setup.tx.init(trained),
           "step": jnp.zeros((), jnp.int32)}
    if setup.trainable.lora:
        out["frozen"] = frozen
    return out


def make_init(setup: TrainSetup) -> Callable[[jax.Array], dict[str, Any]]:
    """`init(key) -> state`, jitted to create the state directly in its shardings: random
    weights from `key`, or, when the setup's config names `init.checkpoint`, the checkpoint's
    weights (read one tensor at a time into their shardings; `key` draws LoRA's A)."""
    fast = cpu_fast_compile(setup.mesh)
    if setup.config is not None and from_checkpoint.checkpoint_path(setup.config):
        from_params = jax.jit(functools.partial(_state_from, setup),
                              out_shardings=setup.shardings, compiler_options=fast)

        def init_from_checkpoint(key):
            return from_params(from_checkpoint.load_params(setup.config, setup), key)

        return init_from_checkpoint

    def init(key):
        model = build_model(setup.model_config, seed=key)
        return _state_from(setup, nnx.to_pure_dict(nnx.state(model, nnx.Param)), key)

    return jax.jit(init, out_shardings=setup.shardings, compiler_options=fast)


def init_state(setup: TrainSetup, *, seed: int, init: Callable | None = None
               ) -> dict[str, Any]:
    """A fresh train state, created directly in its shardings (never whole on one device).

    `init` is `make_init(setup)` (built here when not given)."""
    init = init or make_init(setup)
    with setup.context():
        return init(jax.random.key(seed))


def merge_model(setup_or_graphdef: Any, params: Any) -> nnx.Module:
    """The NNX model with `params` (a pure dict) in it."""
    graphdef = getattr(setup_or_graphdef, "graphdef", setup_or_graphdef)
    return nnx.merge(graphdef, params)
