"""The default run with no positional encoding: causal masking alone (Kazemnejad et al. 2023)."""

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
    config.model.encoding = "nope"
    return config
