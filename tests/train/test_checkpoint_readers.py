"""A reader of a checkpoint folder never disturbs a writer (the study's parent asks whether a
training finished while a worker is saving: opening a writer's CheckpointManager there removed
the worker's `*.orbax-checkpoint-tmp` folder mid-save, found when the compilation cache made
the workers fast enough to race)."""

import os

from train import checkpoint as ckpt_lib


def test_a_read_only_checkpointer_leaves_a_save_in_flight_alone(tmp_path):
    folder = tmp_path / "checkpoints"
    in_flight = folder / "3.orbax-checkpoint-tmp"
    in_flight.mkdir(parents=True)
    reader = ckpt_lib.Checkpointer(str(folder), async_save=False, read_only=True)
    try:
        assert reader.all_steps() == [] and reader.latest_step() is None
    finally:
        reader.close()
    assert in_flight.is_dir()  # the race itself: tests/study/test_study_parallel.py (two workers)


def test_a_read_only_checkpointer_creates_nothing(tmp_path):
    reader = ckpt_lib.Checkpointer(str(tmp_path / "none" / "checkpoints"), read_only=True)
    try:
        assert reader.all_steps() == []
    finally:
        reader.close()
    assert not os.path.exists(tmp_path / "none")
