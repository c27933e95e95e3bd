"""The default run with ALiBi linear score biases, the paper's slopes (Press et al. 2022)."""

from configs import default


def get_config():
    config = default.get_config()
    config.model.encoding = "alibi"
    return config
