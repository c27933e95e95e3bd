"""The default run with rotary embeddings, base 10000, half layout (Su et al. 2021).

The same as default.py, spelled out so every encoding family has its own file."""

from configs import default


def get_config():
    config = default.get_config()
    config.model.encoding = "rope"
    return config
