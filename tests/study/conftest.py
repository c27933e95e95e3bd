"""Fixtures of the study's tests (train.study): the tiny study config, its corpus folder and
one Runtime per module, and a guard that fails a test if anything is trained or evaluated."""

import importlib.util
import pathlib

import pytest

from train import evaluation, trainer
from train.runtime import Runtime

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load(name):
    """`configs/<name>.py`'s get_config() (configs/ is a folder, not a package)."""
    spec = importlib.util.spec_from_file_location(f"cfg_{name}", ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


@pytest.fixture(scope="session")
def load_config():
    """`load_config(name)`: configs/<name>.py's config, fresh each call."""
    return _load


@pytest.fixture(scope="module")
def runtime():
    """One Runtime per module: reruns reuse its setups, compiled steps and streams."""
    return Runtime()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture
def tiny(data_dir):
    """configs/study_tiny.py reading its corpus from this module's data_dir."""
    config = _load("study_tiny")
    config.train.dataset.data_dir = data_dir
    return config


@pytest.fixture
def forbid_work(monkeypatch):
    """Any training or evaluation fails the test."""
    def no_training(*args, **kwargs):
        raise AssertionError("the study trained a model it should have reused or rejected")

    def no_eval(*args, **kwargs):
        raise AssertionError("the study evaluated what it should have reused")

    monkeypatch.setattr(trainer, "train_and_evaluate", no_training)
    monkeypatch.setattr(evaluation, "evaluate_params", no_eval)

