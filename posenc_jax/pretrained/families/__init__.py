"""Model families, one record per family (one module each), and what reads them.

    from posenc_jax.pretrained import families
    families.by_model_type("phi3")           # the record (ValueError listing the known ones)
    families.config_kwargs(config_json, where=path)     # -> TransformerConfig kwargs

`record` (the `Family` type, its `read_keys` / `write_keys` hooks), `transforms` (tensor
layouts, GGUF fixes), one module per family (`llama`, `mistral`, `qwen2`, `qwen3`, `gemma`,
`gemma3`, `phi3`, `qwen3_moe`, `mixtral`, `gpt_oss`, `llama4`), `moe_keys` (the config keys the
MoE families share), `registry` (the one list), `mapping` (config.json -> TransformerConfig
through a record). A family's name is written only
in its own module.
"""

from posenc_jax.pretrained.families.mapping import config_kwargs, family_of_config
from posenc_jax.pretrained.families.record import GGUF, Family, Row
from posenc_jax.pretrained.families.registry import (
    CHOICE,
    FAMILIES,
    by_model_type,
    claimed,
    for_gguf,
    gguf_archs,
    model_types,
)

__all__ = ["CHOICE", "FAMILIES", "GGUF", "Family", "Row", "by_model_type", "claimed",
           "config_kwargs", "family_of_config", "for_gguf", "gguf_archs", "model_types"]
