"""The checkpoint protocol every reader implements (safetensors directory, GGUF file).

    ckpt.path            the directory or file it reads
    ckpt.config          a dict shaped like the family's Hugging Face config.json (model_type)
    ckpt.names()         Hugging Face tensor names ("model.layers.0.self_attn.q_proj.weight"),
                         in Hugging Face layout ([out, in] for a linear layer)
    ckpt.shape(name)     that tensor's shape, without reading it
    ckpt.tensor(name)    one tensor as float32 np.ndarray: exactly the values transformers holds
                         after its own loading (GGUF q/k rows un-permuted, Gemma norms minus 1)

Errors name the file and the tensor (`tensor_error`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Checkpoint", "tensor_error"]


@runtime_checkable
class Checkpoint(Protocol):
    """What `posenc_jax.pretrained.load` reads (see the module docstring)."""

    path: Any
    config: dict

    def names(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def tensor(self, name: str) -> np.ndarray: ...


def tensor_error(path: Any, name: str, what: str) -> ValueError:
    """ValueError("<path>: tensor <name>: <what>")."""
    return ValueError(f"{path}: tensor {name!r}: {what}")
