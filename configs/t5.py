"""The default run with T5 relative buckets (32 buckets, max_distance 128; Raffel et al. 2020)."""

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
    config.model.encoding = "t5"
    return config
