"""Two processes on localhost (4 CPU devices each, gloo collectives) train like one process.

`python -m train` is started twice with --coordinator_address/--num_processes/--process_id,
as the launch recipe in `train/sharding.py` says; each process loads only its half of every
batch. The loss curve, the evaluation and the saved parameters must match a single process
with 8 devices on the same (data=2, fsdp=4) mesh.
"""

import importlib.util
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from train import checkpoint, metrics, sharding, state, trainer

pytestmark = [pytest.mark.multiprocess, pytest.mark.filterwarnings("ignore:the load_module")]
ROOT = pathlib.Path(__file__).resolve().parents[2]


def tiny_config(data_dir):
    spec = importlib.util.spec_from_file_location("cfg_tiny", ROOT / "configs" / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.dataset.data_dir = str(data_dir)
    return config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def subprocess_env(num_devices: int) -> dict:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if "xla_force_host_platform_device_count" not in f]
    env.update(XLA_FLAGS=" ".join(flags), JAX_NUM_CPU_DEVICES=str(num_devices),
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    return env


def test_two_processes_match_one(tmp_path):
    data_dir, workdir = tmp_path / "data", tmp_path / "two"
    config = tiny_config(data_dir)
    config.mesh.update(data=2, fsdp=4, tensor=1)
    # Prepare the corpus once, so the two processes do not race to build it.
    reference = trainer.train_and_evaluate(config, str(tmp_path / "one"))

    port = free_port()
    common = [sys.executable, "-m", "train", f"--config={ROOT / 'configs' / 'tiny.py'}",
              f"--workdir={workdir}", f"--config.dataset.data_dir={data_dir}",
              "--config.mesh.data=2", "--config.mesh.fsdp=4",
              f"--coordinator_address=localhost:{port}", "--num_processes=2"]
    procs = [subprocess.Popen(common + [f"--process_id={i}"], cwd=ROOT, env=subprocess_env(4),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=300))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for i, (proc, (out, err)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"process {i} failed:\n{out}\n{err[-4000:]}"
    assert "done: step=3" in outputs[0][0]

    two = metrics.read_metrics(str(workdir))
    one = metrics.read_metrics(str(tmp_path / "one"))
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2, 3]
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=2e-6)
    np.testing.assert_allclose(two[-1]["eval/32/loss"], reference["eval/32/loss"], rtol=2e-6)

    # The checkpoint the two processes wrote together restores in this one process.
    setup = state.make_setup(config, sharding.make_mesh(config.mesh))
    got = {}
    for name in ("one", "two"):
        ckpt = checkpoint.Checkpointer(str(tmp_path / name / "checkpoints"), async_save=False)
        try:
            assert ckpt.all_steps() == [2, 3]
            got[name] = checkpoint.to_numpy(ckpt.restore(3, setup.abstract)[0])
        finally:
            ckpt.close()
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4),
                 got["two"], got["one"])
