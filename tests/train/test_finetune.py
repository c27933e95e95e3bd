"""Fine-tuning at a longer length (train.finetune): the pretrained state is the fine-tune's
first checkpoint, the config differs only where it must, the data stream continues."""

import os

import jax
import numpy as np
import pytest

from configs import default
from train import checkpoint, data, evaluation, finetune, trainer

SCALING = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    config = default.get_config()
    config.update(num_train_steps=3, batch_size=8, seq_len=16, warmup_steps=1,
                  log_every_steps=1, checkpoint_every_steps=3, async_checkpointing=False)
    config.dataset.data_dir = str(tmp_path_factory.mktemp("tfds"))
    config.dataset.kwargs.max_files = 40
    config.model.update(num_layers=1, embed_dim=16, num_heads=2, mlp_dim=32)
    config.eval.lengths = ()
    config.eval_every_steps = 0
    workdir = str(tmp_path_factory.mktemp("pre"))
    trainer.train_and_evaluate(config, workdir)
    return config, workdir


def test_config_differs_only_in_length_scaling_and_steps(pretrained):
    config, _ = pretrained
    ft = finetune.finetune_config(config, seq_len=32, steps=2,
                                  encoding_kwargs={"scaling": SCALING})
    a, b = config.to_dict(), ft.to_dict()
    changed = {k for k in a if a[k] != b[k]} | {f"model.{k}" for k in a["model"]
                                               if a["model"][k] != b["model"][k]}
    assert changed == {"seq_len", "num_train_steps", "model", "model.encoding_kwargs"}
    assert (ft.seq_len, ft.num_train_steps) == (32, 5) and config.seq_len == 16
    with pytest.raises(ValueError, match="steps must be >= 1, got steps=0"):
        finetune.finetune_config(config, seq_len=32, steps=0, encoding_kwargs={})


def test_finetune_starts_from_the_pretrained_state_and_continues_the_stream(pretrained,
                                                                           tmp_path):
    config, pre_dir = pretrained
    ft = finetune.finetune_config(config, seq_len=32, steps=2,
                                  encoding_kwargs={"scaling": SCALING})
    workdir = str(tmp_path / "ft")
    finetune.start_from(pre_dir, workdir, ft, step=3)
    _, start, _ = evaluation.load_params(workdir, step=3, config=ft)
    _, before, _ = evaluation.load_params(pre_dir, step=3, config=config)
    jax.tree.map(np.testing.assert_array_equal, checkpoint.to_numpy(start),
                 checkpoint.to_numpy(before))

    seen = []
    real = data.train_batch

    def spy(stream, *, step, **kwargs):
        seen.append((step, kwargs["seq_len"]))
        return real(stream, step=step, **kwargs)

    data.train_batch, original = spy, data.train_batch
    try:
        result = finetune.finetune(pre_dir, workdir, ft, step=3)
    finally:
        data.train_batch = original
    assert seen == [(3, 32), (4, 32)] and result["step"] == 5
    assert np.isfinite(result["loss"])
    _, after, _ = evaluation.load_params(workdir, config=ft)
    moved = jax.tree.map(lambda x, y: not np.array_equal(x, y), checkpoint.to_numpy(after),
                         checkpoint.to_numpy(before))
    assert any(jax.tree.leaves(moved))
    ckpt = checkpoint.Checkpointer(os.path.join(workdir, checkpoint.CHECKPOINT_DIR))
    try:
        meta = ckpt.restore_meta(5)
    finally:
        ckpt.close()
    assert meta["config"]["model"]["encoding_kwargs"]["scaling"]["rope_type"] == "yarn"


def test_missing_step_and_short_run_are_errors(pretrained, tmp_path):
    config, pre_dir = pretrained
    ft = finetune.finetune_config(config, seq_len=32, steps=2, encoding_kwargs={})
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at step 2 .* \[3\]"):
        finetune.start_from(pre_dir, str(tmp_path / "a"), ft, step=2)
    with pytest.raises(ValueError, match="num_train_steps=3 must exceed the pretrained step 3"):
        finetune.finetune(pre_dir, str(tmp_path / "b"), config, step=3)


def test_start_from_takes_the_workdir_lock_and_writes_nothing_without_it(pretrained, tmp_path):
    from train.workdir_lock import WorkdirBusyError, WorkdirLock

    config, pre_dir = pretrained
    ft = finetune.finetune_config(config, seq_len=32, steps=2, encoding_kwargs={})
    workdir = tmp_path / "ft"
    with WorkdirLock(str(workdir)), pytest.raises(WorkdirBusyError, match="in use by another"):
        finetune.start_from(pre_dir, str(workdir), ft, step=3)
    assert sorted(p.name for p in workdir.iterdir()) == [".lock"]   # no checkpoint written
    finetune.start_from(pre_dir, str(workdir), ft, step=3)          # free again: it copies
    assert (workdir / checkpoint.CHECKPOINT_DIR).is_dir()

