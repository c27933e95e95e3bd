"""`load(path)`: a Hugging Face directory or a GGUF file -> model, config and tokenizer.

    from posenc_jax import pretrained
    lm = pretrained.load("SmolLM2-135M-Instruct.Q4_1.gguf")          # or a safetensors dir
    logits = lm.model(jnp.asarray([lm.tokenizer.encode("The capital of France is")]))
    lm = pretrained.load(path, rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                             "original_max_position_embeddings": 8192})
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.transformer import Transformer
from posenc_jax.pretrained.gguf import open_gguf
from posenc_jax.pretrained.loader import build
from posenc_jax.pretrained.safetensors_io import open_safetensors
from posenc_jax.pretrained.tokenizer import Tokenizer

__all__ = ["Pretrained", "load", "open_checkpoint"]


@dataclasses.dataclass
class Pretrained:
    """A loaded checkpoint: `model` (NNX Transformer), `config` (its TransformerConfig),
    `tokenizer` (None for a directory without tokenizer.json), `hf_config` (the config.json
    dict it was built from, rope_scaling applied)."""

    model: Transformer
    config: TransformerConfig
    tokenizer: Any
    hf_config: dict


def open_checkpoint(path: str | os.PathLike):
    """`open_gguf` for a .gguf file, `open_safetensors` for a directory."""
    p = pathlib.Path(path)
    if p.is_dir():
        return open_safetensors(p)
    if p.suffix == ".gguf" or p.is_file():
        return open_gguf(p)
    raise ValueError(f"{p}: no such directory or .gguf file")


def load(path: str | os.PathLike, *, dtype: str = "float32",
         rope_scaling: Mapping | None = None, attention: str = "auto") -> Pretrained:
    """The checkpoint at `path` loaded into the model (see `posenc_jax.pretrained.loader`).

    dtype: "float32" or "bfloat16"; rope_scaling: a Hugging Face rope_scaling /
    rope_parameters dict replacing the checkpoint's; attention: the backend name."""
    ckpt = open_checkpoint(path)
    model, config, hf = build(ckpt, dtype=dtype, rope_scaling=rope_scaling, attention=attention)
    if isinstance(ckpt.path, pathlib.Path) and ckpt.path.is_dir():
        has = (ckpt.path / "tokenizer.json").is_file()
        tokenizer = Tokenizer.from_directory(ckpt.path) if has else None
    else:
        tokenizer = Tokenizer.from_gguf(ckpt)
    return Pretrained(model=model, config=config, tokenizer=tokenizer, hf_config=hf)
