"""The default run with T5 relative buckets (32 buckets, max_distance 128; Raffel et al. 2020)."""

from configs import default


def get_config():
    config = default.get_config()
    config.model.encoding = "t5"
    return config
