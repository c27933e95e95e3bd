"""`load(path)`: a Hugging Face directory or a GGUF file -> the model, its config, its tokenizer.

    from posenc_jax import pretrained
    lm = pretrained.load("SmolLM2-135M-Instruct.Q4_1.gguf")            # or a directory
    logits = lm.model(jnp.asarray([lm.tokenizer.encode("The capital of France is")]))
    lm = pretrained.load(path, rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                             "original_max_position_embeddings": 8192})

`path` is a directory holding `config.json` and `*.safetensors` (a sharded
`model.safetensors.index.json` too; `open_safetensors`) or a `.gguf` file (`open_gguf`); the
weights go into the model one tensor at a time (`loader.build`). The tokenizer comes from the
directory's `tokenizer.json` or from the GGUF file's own vocabulary (None for a directory that
has no tokenizer.json).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any, NamedTuple

from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.transformer import Transformer
from posenc_jax.pretrained.gguf import open_gguf
from posenc_jax.pretrained.loader import build
from posenc_jax.pretrained.safetensors_io import open_safetensors
from posenc_jax.pretrained.tokenizer import Tokenizer

__all__ = ["Pretrained", "load", "open_checkpoint"]


class Pretrained(NamedTuple):
    """A loaded checkpoint: `model(tokens) -> logits`, its config, tokenizer and config.json."""

    model: Transformer
    config: TransformerConfig
    tokenizer: Tokenizer | None
    hf_config: dict


def open_checkpoint(path: str | os.PathLike):
    """The checkpoint at `path`: a `.gguf` file or a safetensors directory.

    Raises:
      TypeError: `path` is not a str or PathLike.
      ValueError: it does not exist, or is neither a directory nor a `.gguf` file.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or PathLike, got {type(path).__name__} {path!r}")
    p = pathlib.Path(path)
    if p.is_dir():
        return open_safetensors(p)
    if p.is_file() and p.suffix == ".gguf":
        return open_gguf(p)
    what = "does not exist" if not p.exists() else "is neither a directory nor a .gguf file"
    raise ValueError(f"pretrained path {str(p)!r} {what}; give a Hugging Face directory "
                     "(config.json + *.safetensors) or a .gguf file")


def _tokenizer(ckpt, path: pathlib.Path) -> Tokenizer | None:
    if path.is_dir():
        return Tokenizer.from_directory(path) if (path / "tokenizer.json").exists() else None
    return Tokenizer.from_gguf(ckpt)


def load(path: str | os.PathLike, *, dtype: str = "float32",
         rope_scaling: Mapping[str, Any] | None = None, attention: str = "auto") -> Pretrained:
    """Loads a pretrained checkpoint into the NNX `Transformer` (see the module docstring).

    Args:
      path: a Hugging Face directory or a `.gguf` file.
      dtype: "float32" or "bfloat16" (params and activations).
      rope_scaling: a Hugging Face `rope_scaling` / `rope_parameters` dict that replaces the
        checkpoint's: context extension in one argument (read as transformers reads it).
      attention: the attention backend (`posenc_jax.model.backends`), "auto" by default.

    Raises:
      ValueError / TypeError: as `open_checkpoint` and `loader.build` (an unsupported
        model_type, a missing, extra or misshapen tensor: naming the file and the tensor).
    """
    ckpt = open_checkpoint(path)
    model, config, hf = build(ckpt, dtype=dtype, rope_scaling=rope_scaling,
                              attention=attention)
    return Pretrained(model=model, config=config, tokenizer=_tokenizer(ckpt, pathlib.Path(path)),
                      hf_config=hf)
