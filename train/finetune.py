"""Context extension by fine-tuning: continue a trained run at a longer length.

    finetune_config(config, *, seq_len, steps, encoding_kwargs) -> ConfigDict
    start_from(pretrain_dir, workdir, config, *, step) -> None
    finetune(pretrain_dir, workdir, config, *, step) -> dict   (start_from + the trainer)

The fine-tuning run is the pretraining run continued: its config is the pretraining config
with a new `seq_len` and new `model.encoding_kwargs` (e.g. a RoPE `scaling` dict), and
`num_train_steps` extended by `steps`. Its first checkpoint is the pretrained state at step S
(params, optimizer moments and step count, unchanged), so the trainer resumes at S: batch s
is `data.train_batch(stream, step=s, ...)` for s = S .. S + steps - 1, the data stream
continuing where pretraining stopped (windows of the new length), with the same seed.

Learning rate: the same schedule formula over the extended run (warmup, then the cosine to
`learning_rate * min_lr_ratio` at S + steps). With steps = S / 10 it starts at about
min + 2.4% (peak - min) and ends at the minimum: a small, decaying rate, as in the fine-tunes
of PI (Chen et al. 2023) and YaRN (Peng et al. 2023), which use a small constant rate.

Everything about the fine-tune is resumable like any training: an interrupted fine-tune
resumes from its own newest checkpoint, and `start_from` does nothing once one exists.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from typing import Any

from posenc_jax import checks
from train import checkpoint as ckpt_lib
from train import sharding, trainer
from train import state as state_lib
from train.workdir_lock import WorkdirLock


def finetune_config(config, *, seq_len: int, steps: int,
                    encoding_kwargs: Mapping[str, Any]):
    """The config of a fine-tune of `config`'s run: `seq_len`, `model.encoding_kwargs` and
    `num_train_steps + steps` differ, nothing else."""
    import ml_collections

    checks.positive_int("seq_len", seq_len)
    checks.positive_int("steps", steps)
    if not isinstance(encoding_kwargs, Mapping):
        raise TypeError(f"encoding_kwargs must be a mapping, got {encoding_kwargs!r}")
    out = copy.deepcopy(config)
    with out.unlocked():
        out.seq_len = int(seq_len)
        out.num_train_steps = int(config.num_train_steps) + int(steps)
        out.model.encoding_kwargs = ml_collections.ConfigDict(dict(encoding_kwargs))
    return out


def start_from(pretrain_dir: str, workdir: str, config, *, step: int) -> None:
    """Makes the pretrained state at `step` (in `pretrain_dir`) the first checkpoint of
    `workdir`, restored through `config`'s model (so its param shapes must be the pretrained
    ones); does nothing when `workdir` has a checkpoint already. Holds `workdir`'s lock
    (`WorkdirBusyError` while another run uses it) and writes nothing without it."""
    with WorkdirLock(workdir):
        _copy_first_checkpoint(pretrain_dir, workdir, config, step=step)


def _copy_first_checkpoint(pretrain_dir: str, workdir: str, config, *, step: int) -> None:
    target = ckpt_lib.Checkpointer(os.path.join(workdir, ckpt_lib.CHECKPOINT_DIR),
                                   async_save=False)
    try:
        if target.latest_step() is not None:
            return
        setup = state_lib.make_setup(config, sharding.make_mesh(config.mesh))
        source = ckpt_lib.Checkpointer(os.path.join(pretrain_dir, ckpt_lib.CHECKPOINT_DIR),
                                       async_save=False, read_only=True)
        try:
            if step not in source.all_steps():
                raise FileNotFoundError(f"no checkpoint at step {step} in {source.directory} "
                                        f"(it has {source.all_steps()}) to fine-tune from")
            state, meta = source.restore(step, setup.abstract)
        finally:
            source.close()
        meta = {**meta, "config": json.loads(config.to_json_best_effort()),
                "finetuned_from": {"workdir": os.path.abspath(pretrain_dir), "step": step}}
        target.save(step, state, meta, wait=True)
    finally:
        target.close()


def finetune(pretrain_dir: str, workdir: str, config, *, step: int) -> dict[str, Any]:
    """Fine-tunes the run saved in `pretrain_dir` at `step` with `config` (a
    `finetune_config`) in `workdir`; returns the trainer's result."""
    if int(config.num_train_steps) <= step:
        raise ValueError(f"config.num_train_steps={config.num_train_steps} must exceed the "
                         f"pretrained step {step}: use finetune_config")
    start_from(pretrain_dir, workdir, config, step=step)
    return trainer.train_and_evaluate(config, workdir)
