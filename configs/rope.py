"""The default run with rotary embeddings, base 10000, half layout (Su et al. 2021).

The same as default.py, spelled out so every encoding family has its own file."""

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
    config.model.encoding = "rope"
    return config
