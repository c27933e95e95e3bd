"""The MoE load-balancing loss in the train step: coef * aux joins the loss (and so the update)
when moe_aux_loss_coef > 0 and nothing changes at 0, on 8 devices with the experts split over
the data axis (tests/model/test_moe.py: the sharded model equals one device)."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from configs import tiny
from train import config_check, sharding, state, step, trainer

MOE = {"num_experts": 4, "experts_per_token": 2, "moe_mlp_dim": 16, "moe_layers": (1,),
       "vocab_size": 64}
ROWS = np.random.default_rng(0).integers(0, 64, size=(8, 17))
BATCH = {"inputs": jnp.asarray(ROWS[:, :-1], jnp.int32),
         "targets": jnp.asarray(ROWS[:, 1:], jnp.int32),
         "positions": jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (8, 16)),
         "segment_ids": jnp.ones((8, 16), jnp.int32), "weights": jnp.ones((8, 16), jnp.float32)}


def _step(coef: float, devices=None, accum_steps: int = 1):
    config = tiny.get_config()
    config.logical_axis_rules = tuple((a, "data" if a == "expert" else b)
                                      for a, b in config.logical_axis_rules)
    mesh = sharding.make_mesh({"data": 2, "fsdp": -1} if devices is None else {"data": -1},
                              devices=devices)
    setup = state.make_setup(config, mesh, model_overrides={**MOE, "moe_aux_loss_coef": coef})
    start = state.init_state(setup, seed=0)
    with setup.context():
        ce, _ = jax.jit(functools.partial(step.loss_sums, setup.graphdef, packed=False))(
            start["params"], BATCH)
    new, metrics = step.make_train_step(setup, accum_steps=accum_steps)(start, BATCH)
    return setup, float(ce) / float(BATCH["weights"].sum()), metrics, new["params"]


@pytest.fixture(scope="module")
def runs():
    return {"off": _step(0.0), "on": _step(0.5), "accum": _step(0.0, accum_steps=2)}


def test_aux_loss_reaches_the_train_loss(runs):
    setup, ce, metrics, _ = runs["on"]
    assert setup.params_shardings["layers"][1]["mlp"]["up"].spec == P("data", "fsdp", "tensor")
    aux = float(metrics["moe_aux_loss"])
    assert 1.5 < aux < 4.0   # k = 2 at an even routing
    np.testing.assert_allclose(float(metrics["loss"]), ce + 0.5 * aux, rtol=1e-5)


def test_zero_coef_changes_nothing_but_the_log(runs):
    _, ce, metrics, params = runs["off"]
    np.testing.assert_allclose(float(metrics["loss"]), ce, rtol=1e-6)
    on = runs["on"]
    np.testing.assert_allclose(float(metrics["moe_aux_loss"]), float(on[2]["moe_aux_loss"]),
                               rtol=1e-6)
    router_off = params["layers"][1]["mlp"]["router"]
    assert not np.allclose(router_off, on[3]["layers"][1]["mlp"]["router"], atol=1e-7)


def test_accumulated_microbatches_give_the_same_update_at_zero_coef(runs):
    """Two microbatches: the same CE loss and update (the logged aux is their weighted mean,
    which differs from the whole batch's: f_e P_e is not linear in the batch)."""
    (_, _, m1, p1), (_, _, m2, p2) = runs["off"], runs["accum"]
    np.testing.assert_allclose(float(m2["loss"]), float(m1["loss"]), rtol=1e-5)
    assert abs(float(m2["moe_aux_loss"]) - float(m1["moe_aux_loss"])) < 0.5
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=5e-5)  # Adam, lr 1e-2


def test_a_checkpoint_saved_before_the_moe_keys_still_resumes():
    """Runs saved before num_experts & co. existed: a missing key counts as its default."""
    config = tiny.get_config()
    check = trainer._model_check(config, "w")
    old = {k: v for k, v in json.loads(config.to_json_best_effort())["model"].items()
           if "expert" not in k and not k.startswith(("moe_", "router"))}
    check(3, {"config": {"model": old}})
    with pytest.raises(trainer.ConfigMismatchError, match=r"config.model.num_experts=4 there, "
                                                          r"0 here"):
        check(3, {"config": {"model": {**old, "num_experts": 4}}})


def test_an_expert_rule_sharing_embeds_mesh_axis_is_refused_by_name():
    config = tiny.get_config()
    config.model.num_experts, config.model.moe_mlp_dim = 4, 16
    config_check.check_config(config)   # the default: expert -> None
    config.logical_axis_rules = (("expert", "fsdp"), *config.logical_axis_rules)
    with pytest.raises(ValueError, match=r"maps 'expert' and 'embed' both to the mesh axis "
                                         r"'fsdp'"):
        config_check.check_config(config)
