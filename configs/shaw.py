"""The default run with Shaw et al. (2018) relative key embeddings clipped at distance 16."""

from configs import default


def get_config():
    config = default.get_config()
    config.model.encoding = "shaw"
    return config
