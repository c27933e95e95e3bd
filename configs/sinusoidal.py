"""The default run with fixed sinusoidal embeddings added at the input (Vaswani et al. 2017)."""

from configs import default


def get_config():
    config = default.get_config()
    config.model.encoding = "sinusoidal"
    return config
