"""The default run with no positional encoding: causal masking alone (Kazemnejad et al. 2023)."""

from configs import default


def get_config():
    config = default.get_config()
    config.model.encoding = "nope"
    return config
