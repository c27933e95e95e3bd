"""Training with the sequence split over devices: `mesh.context=4` (ring attention, zig-zag
batches, packed documents) gives the loss curve of `mesh.data=8`, loss for loss.

The batches of the context run reach each device as its two chunks only (checked on the placed
arrays); the order of a row's tokens differs, the loss (a sum over tokens) does not.
"""

import importlib.util
import pathlib

import jax
import numpy as np
import pytest

from posenc_jax.model import context_parallel, load_balance
from train import data, metrics, sharding, trainer

pytestmark = pytest.mark.filterwarnings("ignore:the load_module")
CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def tiny_config(data_dir, **mesh):
    spec = importlib.util.spec_from_file_location("cfg_tiny", CONFIGS / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.dataset.data_dir = str(data_dir)
    config.dataset.packed = True
    config.eval.lengths = ()
    config.checkpoint_every_steps = 100
    config.mesh.update({"data": 1, "fsdp": 1, "context": 1, "tensor": 1, **mesh})
    config.model.num_layers = 1
    return config


def test_context_mesh_matches_data_mesh_loss_for_loss(tmp_path, monkeypatch):
    calls = []
    ring = context_parallel.context_attention

    def counted(*args, **kwargs):
        calls.append((kwargs["context_axis"], kwargs["batch_axes"], kwargs["mode"]))
        return ring(*args, **kwargs)

    monkeypatch.setattr(context_parallel, "context_attention", counted)
    curves = {}
    for name, mesh in (("context", {"data": 2, "context": 4}), ("data", {"data": 8})):
        config = tiny_config(tmp_path / "data", **mesh)
        trainer.train_and_evaluate(config, str(tmp_path / name), progress=False)
        # the context run's layer traced the ring; the data run's did not
        assert calls == [("context", ("data", "fsdp"), "ring")], (name, calls)
        curves[name] = [r["loss"] for r in metrics.read_metrics(str(tmp_path / name))
                        if "loss" in r]
    assert len(curves["context"]) == 3
    np.testing.assert_allclose(curves["context"], curves["data"], rtol=2e-5)


def test_each_device_receives_its_two_chunks(tmp_path):
    config = tiny_config(tmp_path / "data", data=2, context=4)
    mesh = sharding.make_mesh(config.mesh)
    stream = data.config_stream(config.dataset, config.dataset.train_split)
    local = data.train_batch(stream, step=0, batch_size=8, seq_len=32, seed=0,
                             process_index=0, process_count=1, packed=True)
    batch = sharding.global_batch(mesh, local, global_batch_size=8)
    positions = batch["positions"]
    assert positions.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), "context")
    for shard in positions.addressable_shards:
        assert shard.data.shape == (4, 8)  # 4 rows, two chunks of 4 tokens
        rows, cols = shard.index[0], shard.index[1]
        device = (cols.start or 0) // 8
        want = local["positions"][rows][:, load_balance.chunk_indices(32, 4, device)]
        np.testing.assert_array_equal(np.asarray(shard.data), want)
    config = tiny_config(tmp_path / "data", data=2, context=4)
    config.seq_len = 36
    with pytest.raises(ValueError, match=r"seq_len=36 must be divisible by 2 \* mesh.context "
                                         r"= 8"):
        trainer.train_and_evaluate(config, str(tmp_path / "bad"))
