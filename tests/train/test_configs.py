"""The experiment configs, command-line overrides, and the config-side errors of `train/`.

Cheap: nothing here compiles a train step (shapes only, via `jax.eval_shape`).
"""

import importlib.util
import pathlib

import jax
import pytest
from absl import flags
from jax.sharding import PartitionSpec as P
from ml_collections import config_flags

from posenc_jax.model.transformer import LOGICAL_AXES
from train import optim, sharding, state, trainer
from train.runtime import Runtime

pytestmark = pytest.mark.filterwarnings("ignore:the load_module")
CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
FAMILIES = {"sinusoidal": "sinusoidal", "learned": "learned", "rope": "rope", "alibi": "alibi",
            "t5": "t5", "shaw": "shaw", "nope": "nope"}
LM1B_KEYS = ("num_train_steps", "checkpoint_every_steps", "log_every_steps", "eval_every_steps",
             "seed", "batch_size", "seq_len", "learning_rate", "warmup_steps", "weight_decay",
             "grad_clip_norm", "grad_accum_steps", "dataset", "model", "mesh",
             "logical_axis_rules", "eval")


def load(name):
    spec = importlib.util.spec_from_file_location(f"cfg_{name}", CONFIGS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


@pytest.mark.parametrize("name", ["default", "tiny", *FAMILIES])
def test_config_builds_model_and_sharded_state(name):
    config = load(name)
    for key in LM1B_KEYS:
        assert key in config, f"{name}.py lacks {key}"
    rules = sharding.normalize_rules(config.logical_axis_rules)
    assert set(LOGICAL_AXES) <= {logical for logical, _ in rules}
    mesh = sharding.make_mesh(config.mesh)
    setup = state.make_setup(config, mesh)  # abstract only: shapes and shardings
    leaves = jax.tree.leaves(setup.abstract)
    assert all(leaf.sharding.mesh == mesh for leaf in leaves)
    assert setup.model_config.encoding == FAMILIES.get(name, "rope")
    assert config.batch_size % config.get("grad_accum_steps", 1) == 0


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_configs_change_only_the_encoding(name):
    base, config = load("default").to_dict(), load(name).to_dict()
    model, base_model = config.pop("model"), base.pop("model")
    assert config == base
    diff = {k for k in model if model[k] != base_model.get(k)}
    assert diff <= {"encoding", "encoding_kwargs"}
    assert model["encoding"] == FAMILIES[name]


def test_learned_config_table_covers_training_length():
    config = load("learned")
    assert config.model.encoding_kwargs.max_len == config.seq_len
    config.seq_len = 64  # as --config.seq_len=64 would
    assert state.transformer_config(config.model).input_encoding.max_positions == 64


def test_command_line_overrides():
    argv = ["prog", f"--config={CONFIGS / 'tiny.py'}", "--config.model.encoding=alibi",
            "--config.mesh.fsdp=-1", "--config.mesh.data=2", "--config.learning_rate=0.5",
            "--config.model.head_dim=8", "--config.dataset.data_dir=/tmp/x"]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
    values(argv)
    config = values.config
    assert config.model.encoding == "alibi" and config.learning_rate == 0.5
    assert config.model.head_dim == 8 and config.dataset.data_dir == "/tmp/x"
    mesh = sharding.make_mesh(config.mesh)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "context": 1, "tensor": 1}


def test_mesh_sizes_and_errors():
    assert dict(sharding.make_mesh({"data": -1}).shape) == {"data": 8, "fsdp": 1, "context": 1,
                                                                "tensor": 1}
    assert dict(sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}).shape)["tensor"] == 2
    one = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
    assert one.devices.size == 1
    with pytest.raises(ValueError, match="needs 6 devices but 8 are available"):
        sharding.make_mesh({"data": 3, "fsdp": 2})
    with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
        sharding.make_mesh({"data": -1, "fsdp": -1})
    with pytest.raises(ValueError, match="unknown axes \\['model'\\]"):
        sharding.make_mesh({"model": 2})
    with pytest.raises(ValueError, match="not divisible by 3"):
        sharding.make_mesh({"data": 3, "fsdp": -1})


def test_logical_rules_priority_and_errors():
    rules = sharding.normalize_rules([("batch", ("data", "fsdp")), ("embed", "fsdp"),
                                      ("embed", "tensor"), ("mlp", "tensor"), ("length", None)])
    assert sharding.logical_to_mesh_spec(("embed", "mlp"), rules) == P("fsdp", "tensor")
    # batch takes fsdp first, so embed falls back to its second rule (tensor)
    assert sharding.logical_to_mesh_spec(("batch", "length", "embed"), rules) == \
        P(("data", "fsdp"), None, "tensor")
    assert sharding.logical_to_mesh_spec(None, rules) == P()
    with pytest.raises(ValueError, match="logical axis 'heads' has no entry"):
        sharding.logical_to_mesh_spec(("embed", "heads"), rules, what="param q")
    with pytest.raises(ValueError, match="unknown mesh axis"):
        sharding.normalize_rules([("embed", "model")])


def test_indivisible_parameter_is_named():
    config = load("tiny")
    config.mesh.update(data=1, fsdp=1, tensor=8)  # heads=2 cannot be split 8 ways
    with pytest.raises(ValueError, match="is sharded over mesh axes \\('tensor',\\)"):
        state.make_setup(config, sharding.make_mesh(config.mesh))


def test_batch_rows_and_errors():
    mesh = sharding.make_mesh({"data": 2, "fsdp": 4})
    assert sharding.local_rows(mesh, 16) == (0, 1)  # one process holds every row
    with pytest.raises(ValueError, match="batch_size=12 must be divisible by .* = 8"):
        sharding.local_rows(mesh, 12)


def test_bad_config_values(tmp_path):
    config = load("tiny")
    config.grad_accum_steps = 3
    with pytest.raises(ValueError, match="config.grad_accum_steps=3 must divide config.batch_size=8"):
        trainer.train_and_evaluate(config, str(tmp_path))
    config = load("tiny")
    config.num_train_steps = 0
    with pytest.raises(ValueError, match="config.num_train_steps must be >= 1, got config.num_train_steps=0"):
        trainer.train_and_evaluate(config, str(tmp_path))
    config = load("tiny")
    config.grad_accum_steps = 2  # 8 rows / 2 = 4 rows per microbatch over 8 batch shards
    with pytest.raises(ValueError, match="= 4 rows per microbatch must be divisible by the "
                                         "mesh's data x fsdp = 8"):
        trainer.train_and_evaluate(config, str(tmp_path))
    config = load("tiny")
    config.model.num_layer = 2  # a typo
    with pytest.raises(ValueError, match="unknown key\\(s\\) \\['num_layer'\\]"):
        state.transformer_config(config.model)


def test_schedule_warmup_then_cosine():
    sched = optim.make_schedule(learning_rate=1.0, warmup_steps=4, num_train_steps=14,
                                min_lr_ratio=0.1)
    got = [float(sched(i)) for i in (0, 3, 4, 9, 14, 20)]
    assert got == pytest.approx([0.25, 1.0, 1.0, 0.55, 0.1, 0.1], abs=1e-6)
    with pytest.raises(ValueError, match="learning_rate must be finite"):
        optim.make_schedule(learning_rate=float("nan"), warmup_steps=0, num_train_steps=1)


def test_setups_are_shared_exactly_when_the_compiled_step_would_be_the_same():
    mesh = sharding.make_mesh({"data": -1})
    runtime = Runtime()  # the one object that keeps setups (nothing is kept at module level)
    a, b = load("tiny"), load("tiny")
    b.log_every_steps, b.eval.lengths = 7, (64,)  # irrelevant to the compiled step
    assert runtime.setup(a, mesh) is runtime.setup(b, mesh)
    for key, value in (("learning_rate", 0.5), ("num_train_steps", 4), ("weight_decay", 0.0)):
        c = load("tiny")
        c[key] = value
        assert runtime.setup(c, mesh) is not runtime.setup(a, mesh), key
    c = load("tiny")
    c.model.encoding = "alibi"
    assert runtime.setup(c, mesh) is not runtime.setup(a, mesh)
    assert runtime.setup(a, sharding.make_mesh({"fsdp": -1})) is not runtime.setup(a, mesh)
