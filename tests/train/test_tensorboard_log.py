"""TensorBoard event files from training (`train.tensorboard_log`).

- A tiny training stopped at step 6 (the trainer's preemption path: a checkpoint, then a normal
  return) and resumed to step 12 leaves event files that, read back, hold every logged step
  exactly once, with the losses of metrics.jsonl, the learning rate, tokens/s and the
  evaluations at their steps;
- a run killed after its checkpoint (its later checkpoints removed, so the rerun resumes from
  step 6 while the files hold steps up to 12) drops the events after 6, keeps those up to 6
  byte for byte, and logs 7..12 again once each, with the same losses;
- the reader stops at a torn or corrupt record, and `truncate_after` cuts a torn tail.
"""

import importlib.util
import pathlib
import shutil
import struct

import jax
import numpy as np
import pytest
from tensorboardX import SummaryWriter

from train import metrics, tensorboard_log, trainer

pytestmark = pytest.mark.filterwarnings("ignore:the load_module")
ROOT = pathlib.Path(__file__).resolve().parents[2]


def tiny_config(data_dir, **overrides):
    spec = importlib.util.spec_from_file_location("cfg_tiny", ROOT / "configs" / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.dataset.data_dir = str(data_dir)
    config.mesh.data = 1
    config.update(num_train_steps=12, checkpoint_every_steps=4, eval_every_steps=4,
                  async_checkpointing=False, **overrides)
    return config


def train(config, workdir):
    return trainer.train_and_evaluate(config, str(workdir), devices=jax.devices()[:1],
                                      progress=False)


def steps(scalars, tag):
    return [step for step, _ in scalars[tag]]


def summaries_up_to(workdir, step):
    return [e.SerializeToString() for e in tensorboard_log.read_events(str(workdir))
            if e.HasField("summary") and e.step <= step]


@pytest.fixture(scope="module")
def stopped_and_resumed(tmp_path_factory):
    data_dir, workdir = tmp_path_factory.mktemp("data"), tmp_path_factory.mktemp("run")
    config = tiny_config(data_dir)
    with pytest.MonkeyPatch.context() as patch:  # a SIGTERM seen at step 6
        patch.setattr(trainer._Preemption, "reached", lambda self, step: step == 6)
        first = train(config, workdir)
    assert first["preempted"] and first["step"] == 6
    assert steps(tensorboard_log.read_scalars(str(workdir)), "train/loss") == list(range(1, 7))
    second = train(config, workdir)
    assert not second["preempted"] and second["step"] == 12
    return config, workdir


def test_resumed_run_holds_every_step_once(stopped_and_resumed):
    _, workdir = stopped_and_resumed
    scalars = tensorboard_log.read_scalars(str(workdir))
    assert len(tensorboard_log.event_files(str(workdir))) == 2  # one file per run
    for tag in ("train/loss", "train/learning_rate", "train/grad_norm"):
        assert steps(scalars, tag) == list(range(1, 13)), tag
    # tokens/s from the second logged step of each run (the first one compiles)
    assert steps(scalars, "train/tokens_per_sec") == [2, 3, 4, 5, 6, 8, 9, 10, 11, 12]
    assert steps(scalars, "eval/32/loss") == [4, 8, 12]
    assert steps(scalars, "eval/32/ppl") == [4, 8, 12]
    records = {r["step"]: r for r in metrics.read_metrics(str(workdir))}
    for tag, key in (("train/loss", "loss"), ("train/learning_rate", "learning_rate"),
                     ("eval/32/loss", "eval/32/loss")):
        got = np.array([value for _, value in scalars[tag]])
        want = np.array([records[step][key] for step in steps(scalars, tag)])
        np.testing.assert_allclose(got, want, rtol=1e-6)  # simple_value is float32


def test_killed_after_checkpoint_rewrites_no_step_twice(stopped_and_resumed, tmp_path):
    config, original = stopped_and_resumed
    workdir = tmp_path / "run"
    shutil.copytree(original, workdir)
    for path in (workdir / "checkpoints").iterdir():  # as if killed after checkpoint 6
        if path.name.isdigit() and int(path.name) > 6:
            shutil.rmtree(path)
    before = tensorboard_log.read_scalars(str(workdir))
    kept = summaries_up_to(workdir, 6)
    assert train(config, workdir)["step"] == 12
    after = tensorboard_log.read_scalars(str(workdir))
    assert steps(after, "train/loss") == list(range(1, 13))
    assert steps(after, "eval/32/loss") == [4, 8, 12]
    assert summaries_up_to(workdir, 6) == kept  # steps up to the checkpoint: untouched
    np.testing.assert_array_equal([v for _, v in after["train/loss"]],
                                  [v for _, v in before["train/loss"]])  # same batches


def _write(logdir, values):
    writer = SummaryWriter(logdir=str(logdir), filename_suffix=".test")
    for step, value in enumerate(values, start=1):
        writer.add_scalar("train/loss", value, global_step=step)
    writer.close()
    (path,) = tensorboard_log.event_files(str(logdir))
    return pathlib.Path(path)


def test_reader_reads_what_tensorboardx_wrote(tmp_path):
    _write(tmp_path, [3.5, 2.25, float("inf")])
    assert tensorboard_log.read_scalars(str(tmp_path)) == {
        "train/loss": [(1, 3.5), (2, 2.25), (3, float("inf"))]}


def test_torn_and_corrupt_records_end_the_file(tmp_path):
    path = _write(tmp_path, [1.0, 2.0, 3.0])
    blob = path.read_bytes()
    path.write_bytes(blob[:-3])  # the last record torn
    assert steps(tensorboard_log.read_scalars(str(tmp_path)), "train/loss") == [1, 2]
    tensorboard_log.truncate_after(str(tmp_path), 10)  # cuts the torn tail only
    assert len(path.read_bytes()) < len(blob) - 3
    assert steps(tensorboard_log.read_scalars(str(tmp_path)), "train/loss") == [1, 2]
    data = bytearray(path.read_bytes())
    (first,) = struct.unpack("<Q", data[:8])  # the file_version record
    data[12 + first + 4 + 12] ^= 0xFF  # one byte of the step-1 summary's data
    path.write_bytes(bytes(data))
    assert tensorboard_log.read_scalars(str(tmp_path)) == {}


def test_truncate_removes_a_file_left_without_summaries(tmp_path):
    path = _write(tmp_path, [1.0, 2.0])
    tensorboard_log.truncate_after(str(tmp_path), 0)
    assert not path.exists()
