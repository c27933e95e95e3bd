"""Context-parallel training with the default attention, "auto", under every mesh shape.

tests/train/test_context_parallel_train.py trains with the configs' attention="dense"; a
mutation run (issue 34) showed bugs on the "auto" path (which may rotate inside a backend) that
no test saw. Here each mesh that splits the sequence, (data 2, context 4) as the other tests
use, context 8, (data 4, context 2) and (fsdp 2, context 4), and both context modes, trains
the tiny config with attention="auto" and gives the loss curve of the 8-way data-parallel run,
loss for loss; the layers traced the context attention with the mode the config names. The
mode is also set from the command line, as README.md documents it.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

from posenc_jax.model import context_parallel
from train import checkpoint, metrics, trainer

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_context_parallel_train import tiny_config  # noqa: E402  (the same tiny run)

pytestmark = pytest.mark.filterwarnings("ignore:the load_module")
ROOT = pathlib.Path(__file__).resolve().parents[2]
MESHES = {"data2-context4": ({"data": 2, "context": 4}, "ring"),
          "data2-context4-all-gather": ({"data": 2, "context": 4}, "all_gather"),
          "context8": ({"context": 8}, "ring"),
          "data4-context2": ({"data": 4, "context": 2}, "ring"),
          "fsdp2-context4": ({"fsdp": 2, "context": 4}, "all_gather")}


def auto_config(data_dir, mesh, mode="ring"):
    """test_context_parallel_train's tiny packed run, with attention="auto" and `mode`."""
    config = tiny_config(data_dir, **mesh)
    config.model.update(attention="auto", context_mode=mode)
    return config


def losses(workdir) -> list[float]:
    return [r["loss"] for r in metrics.read_metrics(str(workdir)) if "loss" in r]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("cp_auto")
    trainer.train_and_evaluate(auto_config(root / "data", {"data": 8}), str(root / "ref"),
                               progress=False)
    curve = losses(root / "ref")
    assert len(curve) == 3
    return root, curve


@pytest.mark.parametrize("name", sorted(MESHES))
def test_auto_attention_trains_like_data_parallel(name, reference, monkeypatch):
    root, want = reference
    mesh, mode = MESHES[name]
    calls = []
    real = context_parallel.context_attention

    def counted(*args, **kwargs):
        calls.append((kwargs["context_axis"], kwargs["mode"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(context_parallel, "context_attention", counted)
    trainer.train_and_evaluate(auto_config(root / "data", mesh, mode), str(root / name),
                               progress=False)
    assert calls and set(calls) == {("context", mode)}, calls
    np.testing.assert_allclose(losses(root / name), want, rtol=2e-5)


def test_context_mode_from_the_command_line(reference):
    root, want = reference
    workdir = root / "cli"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "HOME": str(root), "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    proc = subprocess.run(
        [sys.executable, "-m", "train", f"--config={ROOT / 'configs' / 'tiny.py'}",
         f"--workdir={workdir}", "--config.model.context_mode=all_gather",
         "--config.model.attention=auto", "--config.mesh.data=4", "--config.mesh.context=2",
         "--config.model.num_layers=1", "--config.dataset.packed=True",
         "--config.eval.lengths=()", "--config.checkpoint_every_steps=100",
         f"--config.dataset.data_dir={root / 'data'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = checkpoint.Checkpointer(str(workdir / checkpoint.CHECKPOINT_DIR), async_save=False)
    try:
        meta = saved.restore_meta(saved.all_steps()[-1])
    finally:
        saved.close()
    assert meta["config"]["model"]["context_mode"] == "all_gather"
    np.testing.assert_allclose(losses(workdir), want, rtol=2e-5)
