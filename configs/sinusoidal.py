"""The default run with fixed sinusoidal embeddings added at the input (Vaswani et al. 2017)."""

import importlib.util
import pathlib


def _default():
    spec = importlib.util.spec_from_file_location(
        "posenc_configs_default", pathlib.Path(__file__).with_name("default.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config():
    config = _default().get_config()
    config.model.encoding = "sinusoidal"
    return config
