"""A Hugging Face model directory (config.json + *.safetensors) as a `Checkpoint`.

    ckpt = open_safetensors("path/to/SmolLM2-135M")      # config.json, model.safetensors
    ckpt.config["model_type"], ckpt.names(), ckpt.shape(name), ckpt.tensor(name)

Sharded checkpoints are read through `model.safetensors.index.json` (its weight_map names
the file of every tensor); without an index, every `*.safetensors` file in the directory is
read. Nothing is loaded at opening beyond the files' headers: `tensor(name)` reads one
tensor with safetensors' `safe_open` (memory-mapped; float8 from the file's bytes through
ml_dtypes) and returns it as float32 after `tensor_values`' checks (floating point, finite).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open

from posenc_jax.pretrained.checkpoint import tensor_error
from posenc_jax.pretrained.tensor_values import (
    NEEDS_RAW,
    checked_weights,
    float_dtype,
    raw_safetensors,
)

__all__ = ["SafetensorsCheckpoint", "open_safetensors"]

INDEX = "model.safetensors.index.json"


def _json(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read JSON ({err})") from None


class SafetensorsCheckpoint:
    """See the module docstring; build with `open_safetensors`."""

    def __init__(self, path: pathlib.Path, config: dict, where: dict[str, pathlib.Path],
                 shapes: dict[str, tuple[int, ...]]):
        self.path, self.config, self._where, self._shapes = path, config, where, shapes

    def names(self) -> list[str]:
        return list(self._where)

    def file_of(self, name: str) -> pathlib.Path:
        """The .safetensors file holding tensor `name`."""
        if name not in self._where:
            raise tensor_error(self.path, name, "no such tensor in the checkpoint")
        return self._where[name]

    def shape(self, name: str) -> tuple[int, ...]:
        self.file_of(name)
        return self._shapes[name]

    def tensor(self, name: str) -> np.ndarray:
        """One tensor as float32 (float16, bfloat16 and float8 files are upcast exactly);
        ValueError naming the file and the tensor for a non-float dtype or a NaN / inf value
        (`tensor_values`)."""
        file = self.file_of(name)
        try:
            with safe_open(file, framework="np") as f:
                code = f.get_slice(name).get_dtype()
                dtype = float_dtype(file, name, code)  # ints, bools: refused by name
                value = (raw_safetensors(file, name, dtype) if code in NEEDS_RAW
                         else f.get_tensor(name))
        except (SafetensorError, OSError, TypeError, KeyError) as err:
            raise tensor_error(file, name, f"cannot be read ({err})") from None
        return checked_weights(file, name, value)  # float32, finite


def _headers(files: list[pathlib.Path]) -> tuple[dict, dict]:
    where, shapes = {}, {}
    for file in files:
        try:
            with safe_open(file, framework="np") as f:
                for name in f.keys():
                    if name in where:
                        raise tensor_error(file, name, f"also in {where[name]}")
                    where[name] = file
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{file}: not a readable safetensors file ({err})") from None
    return where, shapes


def open_safetensors(directory: str | os.PathLike) -> SafetensorsCheckpoint:
    """The checkpoint in `directory` (config.json + *.safetensors, or a sharded index).

    Raises:
      ValueError: no such directory, no config.json, no safetensors file, an unreadable file,
        an index naming a file that is absent or a tensor its file lacks (naming them).
    """
    path = pathlib.Path(directory)
    if not path.is_dir():
        raise ValueError(f"{path}: not a directory (expected config.json + *.safetensors)")
    if not (path / "config.json").is_file():
        raise ValueError(f"{path}: no config.json")
    config = _json(path / "config.json")
    if not isinstance(config, dict):
        raise ValueError(f"{path / 'config.json'}: expected a JSON object, got "
                         f"{type(config).__name__}")
    if (path / INDEX).is_file():
        weight_map = _json(path / INDEX).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{path / INDEX}: no weight_map object")
        for name, file in weight_map.items():
            if not isinstance(file, str) or not file:
                raise ValueError(f"{path / INDEX}: weight_map[{name!r}] must be a file name "
                                 f"(a non-empty str), got {file!r} ({type(file).__name__})")
        files = sorted({path / f for f in weight_map.values()})
        for file in files:
            if not file.is_file():
                raise ValueError(f"{path / INDEX}: names {file.name}, which is absent")
        where, shapes = _headers(files)
        for name, file in weight_map.items():
            if where.get(name) != path / file:
                raise tensor_error(path / file, name, f"named by {INDEX} but not in the file")
    else:
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ValueError(f"{path}: no *.safetensors file")
        where, shapes = _headers(files)
    return SafetensorsCheckpoint(path, config, where, shapes)
