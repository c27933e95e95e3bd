"""The default run with a learned absolute position table of exactly seq_len rows.

The table cannot encode positions past `seq_len`: evaluating longer windows is an error, not
a clamp (the study reports that row as such)."""

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
    config.model.encoding = "learned"
    # A reference, not a copy: --config.seq_len=256 also resizes the table.
    config.model.encoding_kwargs.max_len = config.get_ref("seq_len")
    return config
