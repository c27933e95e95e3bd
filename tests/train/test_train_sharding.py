"""Sharded training on 8 fake CPU devices: every mesh computes the same run.

- meshes (data, fsdp, tensor) = (8,1,1), (2,4,1), (2,2,2) and a single device give the same
  loss curve for 3 steps of configs/tiny.py and the same final parameters (float32
  tolerance: only the order of reductions differs);
- gradient accumulation (2 interleaved microbatches) gives the same curve as one batch;
- a checkpoint written on 8 devices restores bit-exactly onto 1 device and vice versa, and
  training resumed across the two meshes continues the same run.
"""

import importlib.util
import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

from train import checkpoint, data, metrics, sharding, state, trainer

pytestmark = pytest.mark.filterwarnings("ignore:the load_module")
CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
MESHES = {"8x1x1": (8, 1, 1), "2x4x1": (2, 4, 1), "2x2x2": (2, 2, 2), "single": (1, 1, 1)}


def tiny_config(data_dir, **overrides):
    spec = importlib.util.spec_from_file_location("cfg_tiny", CONFIGS / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.dataset.data_dir = str(data_dir)
    config.eval.lengths = ()
    config.update(overrides)
    return config


def run(config, workdir, mesh_name):
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = MESHES[mesh_name]
    devices = jax.devices()[:1] if mesh_name == "single" else None
    result = trainer.train_and_evaluate(config, str(workdir), devices=devices)
    return result, [r["loss"] for r in metrics.read_metrics(str(workdir)) if "loss" in r]


def final_params(config, workdir, *, devices=None, step=None):
    mesh = sharding.make_mesh({"data": -1}, devices=devices)
    setup = state.make_setup(config, mesh)
    ckpt = checkpoint.Checkpointer(str(pathlib.Path(workdir) / "checkpoints"), async_save=False)
    try:
        restored, _ = ckpt.restore(step or ckpt.latest_step(), setup.abstract)
    finally:
        ckpt.close()
    return restored


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("data")
    root = tmp_path_factory.mktemp("meshes")
    out = {}
    for name in MESHES:
        config = tiny_config(data_dir)
        out[name] = (*run(config, root / name, name), root / name, config)
    return data_dir, root, out


def test_every_mesh_gives_the_same_loss_curve(runs):
    _, _, out = runs
    reference = out["single"][1]
    assert len(reference) == 3 and all(np.isfinite(reference))
    assert reference[2] < reference[0]  # it learns
    for name, (result, losses, _, _) in out.items():
        assert result["step"] == 3 and not result["preempted"]
        np.testing.assert_allclose(losses, reference, rtol=2e-6, err_msg=name)


def test_every_mesh_gives_the_same_parameters(runs):
    _, _, out = runs
    one = jax.devices()[:1]
    reference = checkpoint.to_numpy(final_params(out["single"][3], out["single"][2],
                                                 devices=one))
    # Adam divides by sqrt(v): for a parameter with a near-zero gradient (a rare byte's
    # embedding row) rounding-level gradient differences move the update by up to ~1e-3 of
    # the learning rate (1e-2), hence atol=1e-4; a wrong sharding would be off by ~1e-2.
    for name, (_, _, workdir, config) in out.items():
        got = checkpoint.to_numpy(final_params(config, workdir, devices=one))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(reference)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4, err_msg=name)


def test_gradient_accumulation_matches_one_batch(runs):
    data_dir, root, out = runs
    config = tiny_config(data_dir, grad_accum_steps=2)
    _, losses = run(config, root / "accum", "2x2x2")
    np.testing.assert_allclose(losses, out["2x2x2"][1], rtol=2e-6)


def test_checkpoint_moves_between_8_devices_and_1(runs):
    _, _, out = runs
    _, _, workdir8, config8 = out["2x2x2"]
    on8 = final_params(config8, workdir8)  # onto an 8-device data mesh
    on1 = final_params(config8, workdir8, devices=jax.devices()[:1])
    assert all(leaf.sharding.num_devices == 1 for leaf in jax.tree.leaves(on1))
    assert all(leaf.sharding.num_devices == 8 for leaf in jax.tree.leaves(on8))
    jax.tree.map(np.testing.assert_array_equal, checkpoint.to_numpy(on1),
                 checkpoint.to_numpy(on8))


def test_training_resumes_across_meshes(runs):
    """Resume a run saved at step 2 on one mesh on the other mesh: step 3 matches."""
    _, root, out = runs
    for source, target in (("2x2x2", "single"), ("single", "2x2x2")):
        workdir = root / f"resume-{source}-to-{target}"
        shutil.copytree(out[source][2], workdir)
        shutil.rmtree(workdir / "checkpoints" / "3")
        path = workdir / "metrics.jsonl"  # tag the copied lines: a rerun from 0 drops the tags
        lines = path.read_text().splitlines()
        tagged = [json.dumps({**json.loads(line), "copied": True}) for line in lines[:2]]
        path.write_text("\n".join(tagged + lines[2:3]) + "\n")
        result, losses = run(out[target][3], workdir, target)  # same config: no recompiling
        assert result["step"] == 3
        records = metrics.read_metrics(str(workdir))
        assert [r["step"] for r in records] == [1, 2, 3]
        assert [r.get("copied", False) for r in records] == [True, True, False]  # resumed at 2
        np.testing.assert_allclose(losses[2], out[target][1][2], rtol=2e-6)


def test_load_model_and_evaluate(runs):
    """`load_model` reads the config from the checkpoint; `evaluate` scores the same tokens
    on one device and on the 8-device mesh the config asks for."""
    _, _, out = runs
    _, _, workdir, config = out["2x2x2"]
    stream = data.config_stream(config.dataset, config.dataset.eval_split)
    results = []
    for devices in (jax.devices()[:1], None):
        mesh = sharding.make_mesh({"data": 1}, devices=devices) if devices else None
        model, loaded = trainer.load_model(str(workdir), mesh=mesh)
        assert loaded.model.to_dict() == config.model.to_dict()
        results.append(trainer.evaluate(model, stream, seq_len=32, num_tokens=512,
                                        batch_size=8))
    assert results[0]["tokens"] == results[1]["tokens"] == 512
    np.testing.assert_allclose(results[0]["loss"], results[1]["loss"], rtol=1e-5)
    assert results[0]["ppl"] == pytest.approx(np.exp(results[0]["loss"]))
    assert results[0]["loss"] < np.log(256)  # better than uniform over bytes already
