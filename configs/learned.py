"""The default run with a learned absolute position table of exactly seq_len rows.

The table cannot encode positions past `seq_len`: evaluating longer windows is an error, not
a clamp (the study reports that row as such)."""

from configs import default


def get_config():
    config = default.get_config()
    config.model.encoding = "learned"
    # A reference, not a copy: --config.seq_len=256 also resizes the table.
    config.model.encoding_kwargs.max_len = config.get_ref("seq_len")
    return config
