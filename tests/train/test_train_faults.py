"""Faults: SIGKILL, SIGTERM, corrupt checkpoints, a non-finite loss.

- `python -m train` killed with SIGKILL twice (at moments chosen by the clock, not by the
  program, around a checkpoint save) and rerun ends with parameters and optimizer state
  bit-identical to an uninterrupted run, and its metrics.jsonl has every step exactly once
  with the same losses (and so have its TensorBoard event files);
- SIGTERM: the run saves a checkpoint of the step it reached and exits with status 0;
- a corrupt newest checkpoint (and a leftover temporary directory of a half-written one) is
  reported with a warning, moved aside, and training resumes from the previous checkpoint
  and still ends bit-identical; only unreadable checkpoints -> CheckpointError;
- a non-finite loss stops training with an error naming the step, without saving that state.

Subprocesses use one CPU device and share a persistent compilation cache, so a rerun does not
compile again; the uninterrupted reference runs in this process on one device.
"""

import gc
import importlib.util
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from train import checkpoint, metrics, sharding, state, tensorboard_log, trainer

# No filter of PytestUnraisableExceptionWarning: an error in an asynchronous save must fail
# the test that caused it (the noise of failed restores is dropped by the trainer itself,
# inside the run only: `checkpoint.quiet_failed_restores`).
# XLA's optimised compiles for the whole module: its runs are compared bit for bit with the
# `reference` run of this process, which every test must compile alike (tests/conftest.py)
pytestmark = [pytest.mark.filterwarnings("ignore:the load_module"), pytest.mark.optimized_compile]
ROOT = pathlib.Path(__file__).resolve().parents[2]


def tiny_config(data_dir, **overrides):
    spec = importlib.util.spec_from_file_location("cfg_tiny", ROOT / "configs" / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.dataset.data_dir = str(data_dir)
    config.eval.lengths = ()
    config.mesh.data = 1
    config.update(overrides)
    return config


def one_device():
    return jax.devices()[:1]


def cli(workdir, data_dir, **overrides) -> list[str]:
    """`python -m train` running `tiny_config(data_dir, **overrides)` in `workdir`."""
    flags = {"dataset.data_dir": data_dir, "eval.lengths": "()", "mesh.data": 1, **overrides}
    return [sys.executable, "-m", "train", f"--config={ROOT / 'configs' / 'tiny.py'}",
            f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in flags.items())]


def env_for(cache_dir) -> dict:
    env = dict(os.environ)
    env.update(XLA_FLAGS="", JAX_NUM_CPU_DEVICES="1", JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               JAX_COMPILATION_CACHE_DIR=str(cache_dir),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return env


def logged_step(workdir) -> int:
    path = pathlib.Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    try:
        return json.loads(lines[-1])["step"] if lines else 0
    except json.JSONDecodeError:  # a line being written
        return 0


def saving(workdir) -> bool:
    """Whether a checkpoint is being written (orbax's temporary directory exists)."""
    return any(pathlib.Path(workdir).glob("checkpoints/*.orbax-checkpoint-tmp*"))


def start_and_signal(args, env, workdir, *, at_step: int, sig, timeout=240.0, during_save=False):
    """Starts the command, sends `sig` once metrics.jsonl shows `at_step` (and, with
    `during_save`, a checkpoint is being written); -> (rc, out, err)."""
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if logged_step(workdir) >= at_step and (saving(workdir) or not during_save):
                proc.send_signal(sig)
                break
            time.sleep(0.005)
        out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1.0))
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def saved_state(config, workdir, step=None):
    setup = state.make_setup(config, sharding.make_mesh(config.mesh, devices=one_device()))
    ckpt = checkpoint.Checkpointer(str(pathlib.Path(workdir) / "checkpoints"), async_save=False)
    try:
        return checkpoint.to_numpy(ckpt.restore(step or ckpt.latest_step(), setup.abstract)[0])
    finally:
        ckpt.close()


def assert_bit_identical(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and np.array_equal(x, y)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory):
    """One persistent compilation cache for every subprocess of this module: the suite's
    (tests/conftest.py), so a later run reads it back, else a folder of this module's."""
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or tmp_path_factory.mktemp("xla_cache")


KILL_RUN = {"num_train_steps": 160, "checkpoint_every_steps": 20}


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """An uninterrupted KILL_RUN in this process, on one device (checkpoints 120, 140, 160)."""
    workdir = tmp_path_factory.mktemp("reference")
    trainer.train_and_evaluate(tiny_config(data_dir, **KILL_RUN), str(workdir),
                               devices=one_device())
    return workdir


def test_sigkill_twice_then_resume_is_bit_identical(data_dir, xla_cache, reference, tmp_path):
    config = tiny_config(data_dir, **KILL_RUN)
    workdir, env = tmp_path / "killed", env_for(xla_cache)
    args = cli(workdir, data_dir, **KILL_RUN)
    # Each kill is sent once a checkpoint's temporary directory exists after step 60 (then
    # 100), i.e. while a save is being written; a half-written save left on disk proves that
    # it landed mid-save (the rename can win the race, so one of the two must show it).
    hits = 0
    for at_step in (60, 100):  # the second kill lands in the resumed run
        rc, _, err = start_and_signal(args, env, workdir, at_step=at_step, sig=signal.SIGKILL,
                                      during_save=True)
        assert rc == -signal.SIGKILL, f"the run was not killed mid-run (rc={rc}):\n{err[-3000:]}"
        assert logged_step(workdir) < 160
        hits += saving(workdir)
    assert hits >= 1, "neither kill landed while a checkpoint was being written"
    rc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
                        check=False)
    assert rc.returncode == 0, rc.stderr[-3000:]

    assert_bit_identical(saved_state(config, workdir), saved_state(config, reference))
    got, want = metrics.read_metrics(str(workdir)), metrics.read_metrics(str(reference))
    assert [r["step"] for r in got] == list(range(1, 161))
    assert [r["loss"] for r in got] == [r["loss"] for r in want]
    events = tensorboard_log.read_scalars(str(workdir))["train/loss"]  # TensorBoard: the same
    assert [step for step, _ in events] == list(range(1, 161))
    assert events == tensorboard_log.read_scalars(str(reference))["train/loss"]


def test_sigterm_saves_then_exits_zero(data_dir, xla_cache, tmp_path):
    workdir = tmp_path / "term"
    rc, out, err = start_and_signal(cli(workdir, data_dir, **KILL_RUN), env_for(xla_cache),
                                    workdir, at_step=30, sig=signal.SIGTERM)
    assert rc == 0, err[-3000:]
    assert "preempted=True" in out
    stopped = logged_step(workdir)
    assert 30 <= stopped < 160
    assert checkpoint_steps(workdir)[-1] == stopped  # saved where it stopped


def corrupt(step_dir: pathlib.Path) -> None:
    """Overwrites the array data of a saved step (its `d/` chunk files) with garbage."""
    chunks = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    assert chunks
    for path in chunks:
        path.write_bytes(b"not a checkpoint")


def test_corrupt_newest_checkpoint_falls_back(data_dir, reference, tmp_path):
    config = tiny_config(data_dir, **KILL_RUN)
    workdir = tmp_path / "corrupt"
    shutil.copytree(reference, workdir)
    shutil.rmtree(workdir / "checkpoints" / "160")         # as if killed before the end
    corrupt(workdir / "checkpoints" / "140")                # and step 140 damaged on disk
    half = workdir / "checkpoints" / "150.orbax-checkpoint-tmp-1"  # a half-written save
    (half / "state").mkdir(parents=True)
    with pytest.warns(RuntimeWarning, match="checkpoint at step 140 .* could not be restored"):
        result = trainer.train_and_evaluate(config, str(workdir), devices=one_device())
    assert result["step"] == 160
    assert not half.exists()
    assert (workdir / "corrupt_checkpoints").is_dir()
    assert [r["step"] for r in metrics.read_metrics(str(workdir))] == list(range(1, 161))
    assert_bit_identical(saved_state(config, workdir), saved_state(config, reference))


def test_only_unreadable_checkpoints_is_an_error(data_dir, reference, tmp_path):
    workdir = tmp_path / "broken"
    shutil.copytree(reference, workdir)
    for step_dir in (workdir / "checkpoints").iterdir():
        corrupt(step_dir)
    with pytest.warns(RuntimeWarning), pytest.raises(checkpoint.CheckpointError,
                                                     match="no checkpoint in .* could be"):
        trainer.train_and_evaluate(tiny_config(data_dir, **KILL_RUN), str(workdir),
                                   devices=one_device())


def test_diverging_run_stops_at_the_step_and_keeps_last_good_checkpoint(data_dir, tmp_path):
    """A learning rate of 1e30: the second step's gradient is NaN; step 1 stays the last."""
    config = tiny_config(data_dir, learning_rate=1e30, checkpoint_every_steps=1)
    workdir = tmp_path / "diverge"
    with pytest.raises(trainer.NonFiniteLossError,
                       match="non-finite grad_norm at step 2 .* last good checkpoint is step 1"):
        trainer.train_and_evaluate(config, str(workdir), devices=one_device())
    assert checkpoint_steps(workdir) == [1]
    params = saved_state(config, workdir)["params"]
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params))


def test_nan_loss_stops_with_the_step_in_the_message(data_dir, tmp_path, monkeypatch):
    """A NaN injected into the batch of step 3 (index 2): stop there, keep step 2."""
    real = trainer.data.train_batch

    def poisoned(stream, *, step, **kwargs):
        batch = real(stream, step=step, **kwargs)
        if step == 2:
            batch["weights"] = batch["weights"].copy()
            batch["weights"][0, 0] = np.nan
        return batch

    monkeypatch.setattr(trainer.data, "train_batch", poisoned)
    config = tiny_config(data_dir, **{**KILL_RUN, "checkpoint_every_steps": 1})
    workdir = tmp_path / "nan"
    with pytest.raises(trainer.NonFiniteLossError,
                       match="non-finite loss and grad_norm at step 3 .* last good checkpoint "
                             "is step 2"):
        trainer.train_and_evaluate(config, str(workdir), devices=one_device())
    assert checkpoint_steps(workdir) == [1, 2]
    assert [r["step"] for r in metrics.read_metrics(str(workdir))] == [1, 2]


def checkpoint_steps(workdir) -> list[int]:
    ckpt = checkpoint.Checkpointer(str(pathlib.Path(workdir) / "checkpoints"), async_save=False)
    try:
        return ckpt.all_steps()
    finally:
        ckpt.close()


def checkpoint_tree(workdir) -> dict[str, bytes]:
    """Every file under workdir (path -> bytes): to prove that nothing was touched."""
    root = pathlib.Path(workdir)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_config_mismatch_refuses_and_touches_nothing(data_dir, reference, tmp_path):
    workdir = tmp_path / "mismatch"
    shutil.copytree(reference, workdir)
    before = checkpoint_tree(workdir)
    other = tiny_config(data_dir, **KILL_RUN)
    other.model.embed_dim = 64
    with pytest.raises(trainer.ConfigMismatchError,
                       match=r"another model \(step 160: config.model.embed_dim=32 there, 64 "
                             r"here\); nothing was changed"):
        trainer.train_and_evaluate(other, str(workdir), devices=one_device())
    assert checkpoint_tree(workdir) == before
    assert not (workdir / "corrupt_checkpoints").exists()
    # The original config still finds its checkpoints: nothing to train, nothing rewritten.
    result = trainer.train_and_evaluate(tiny_config(data_dir, **KILL_RUN), str(workdir),
                                        devices=one_device())
    assert result["step"] == 160
    assert checkpoint_tree(workdir) == before


def test_silent_corruption_is_caught_by_the_fingerprint(data_dir, reference, tmp_path):
    """Step 160 rewritten with one parameter changed and the original metadata: orbax reads it
    without complaint, only the fingerprint sees it. It is moved aside and 140 is used."""
    config = tiny_config(data_dir, **KILL_RUN)
    workdir = tmp_path / "silent"
    shutil.copytree(reference, workdir)
    setup = state.make_setup(config, sharding.make_mesh(config.mesh, devices=one_device()))
    ckpt = checkpoint.Checkpointer(str(workdir / "checkpoints"), async_save=False)
    try:
        good, meta = ckpt.restore(160, setup.abstract)
    finally:
        ckpt.close()
    shutil.rmtree(workdir / "checkpoints" / "160")
    leaves, treedef = jax.tree.flatten(good)
    leaves[1] = leaves[1].at[(0,) * leaves[1].ndim].add(1.0)  # one word of one leaf
    bad = jax.tree.unflatten(treedef, leaves)
    ckpt = checkpoint.Checkpointer(str(workdir / "checkpoints"), async_save=False)
    try:
        ckpt._manager.save(160, args=checkpoint.ocp.args.Composite(
            state=checkpoint.ocp.args.StandardSave(bad),
            meta=checkpoint.ocp.args.JsonSave(meta)), force=True)
        ckpt.wait()
        with pytest.warns(RuntimeWarning, match="step 160 .* fingerprint mismatch"):
            _, restored_meta = ckpt.restore_latest(setup.abstract)
    finally:
        ckpt.close()
    assert restored_meta["step"] == 140
    assert (workdir / "corrupt_checkpoints").is_dir()


def test_truncated_checkpoint_is_recovered_quietly(data_dir, reference, tmp_path, capfd):
    """A newest step cut short on disk: one warning, the previous step, no tracebacks."""
    config = tiny_config(data_dir, **KILL_RUN)
    workdir = tmp_path / "truncated"
    shutil.copytree(reference, workdir)
    chunks = [p for p in (workdir / "checkpoints" / "160" / "state").rglob("*")
              if p.is_file() and p.parent.name == "d"]
    for path in chunks:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    capfd.readouterr()
    with pytest.warns(RuntimeWarning, match="checkpoint at step 160 .* could not be restored"):
        result = trainer.train_and_evaluate(config, str(workdir), devices=one_device())
    gc.collect()
    err = capfd.readouterr().err
    assert result["step"] == 160
    assert "Exception ignored" not in err and "Traceback" not in err, err[-3000:]
    assert "never retrieved" not in err, err[-3000:]


def test_quiet_failed_restores_is_scoped():
    """The trainer's noise filter is installed only inside a run: importing changes nothing."""
    logger = logging.getLogger("asyncio")
    hook, filters = sys.unraisablehook, list(logger.filters)
    with checkpoint.quiet_failed_restores():
        assert sys.unraisablehook is not hook and len(logger.filters) == len(filters) + 1
    assert sys.unraisablehook is hook and logger.filters == filters


def unwritable(args) -> list[str]:
    """`args` run without the capability that lets root write into a read-only directory."""
    return ["setpriv", "--inh-caps=-dac_override", "--bounding-set=-dac_override", *args]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to drop CAP_DAC_OVERRIDE (CI runs as root)")
@pytest.mark.parametrize("async_save", [True, False])
def test_unwritable_checkpoints_exit_nonzero_naming_the_step(data_dir, xla_cache, tmp_path,
                                                             async_save):
    """Issue 15: a failed background save used to leave orbax threads waiting forever at
    exit. Now the run exits with status 1 within seconds, naming the step and the cause."""
    workdir = tmp_path / "readonly"
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "checkpoints").chmod(0o555)
    args = unwritable(cli(workdir, data_dir, num_train_steps=4, checkpoint_every_steps=2,
                          async_checkpointing=async_save))
    start = time.monotonic()
    try:
        proc = subprocess.run(args, cwd=ROOT, env=env_for(xla_cache), capture_output=True,
                              text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the run hung after a failed checkpoint save")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert time.monotonic() - start < 120
    assert "CheckpointSaveError: could not save the checkpoint of step 2" in proc.stderr
    assert "Permission denied" in proc.stderr


def test_second_run_on_a_workdir_is_refused_and_a_killed_run_leaves_no_lock(
        data_dir, xla_cache, tmp_path):
    """Issue 15: two runs on one workdir wrote the same metrics and checkpoints. The second
    is refused naming the first (pid, host); after the first is SIGKILLed, the lock is gone
    and a rerun resumes and finishes with every step logged once."""
    config = tiny_config(data_dir, **KILL_RUN)
    workdir = tmp_path / "shared"
    proc = subprocess.Popen(cli(workdir, data_dir, **KILL_RUN), cwd=ROOT, env=env_for(xla_cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while logged_step(workdir) < 5 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, "the first run ended before the second started"
        with pytest.raises(trainer.WorkdirBusyError,
                           match=rf"in use by another run: pid {proc.pid} on host "):
            trainer.train_and_evaluate(config, str(workdir), devices=one_device())
        before = logged_step(workdir)
        proc.kill()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert before < 160
    result = trainer.train_and_evaluate(config, str(workdir), devices=one_device())
    assert result["step"] == 160
    assert [r["step"] for r in metrics.read_metrics(str(workdir))] == list(range(1, 161))
