"""Writing Hugging Face-named tensors as safetensors files that transformers loads.

`write_safetensors(tensors, directory, *, max_shard_bytes)` writes `model.safetensors`, or,
when the tensors together exceed `max_shard_bytes`, `model-00001-of-0000N.safetensors` ...
plus `model.safetensors.index.json` (`{"metadata": {"total_size": bytes}, "weight_map": {name:
file}}`), the layout `transformers.PreTrainedModel.save_pretrained` writes. Tensors are
assigned to shards in name order, a new shard starting when the next tensor would overflow
the current one (a tensor larger than the limit gets a shard of its own). Each file carries
the metadata `{"format": "pt"}` that transformers expects.

Every file is written beside its final name and moved into place, and files of an earlier
export with other names (`model*.safetensors`, the index) are removed, so the directory never
mixes two exports' weights.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import numpy as np
from safetensors.numpy import save_file

__all__ = ["INDEX_NAME", "SINGLE_NAME", "plan_shards", "write_safetensors"]

SINGLE_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
#: transformers' default `max_shard_size` ("5GB": 5 * 10^9 bytes).
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9


def plan_shards(sizes: Mapping[str, int], *, max_shard_bytes: int) -> list[list[str]]:
    """Names grouped into shards (name order) of at most `max_shard_bytes` each, except a
    single tensor larger than that, which is alone in its shard."""
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int):
        raise TypeError(f"max_shard_bytes must be an int, got {max_shard_bytes!r}")
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    shards: list[list[str]] = []
    used = 0
    for name in sorted(sizes):
        if not shards or (used + sizes[name] > max_shard_bytes and shards[-1]):
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += sizes[name]
    return shards


def _shard_name(i: int, n: int) -> str:
    return SINGLE_NAME if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _save(tensors: Mapping[str, np.ndarray], path: str) -> None:
    tmp = path + ".tmp"
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp,
              metadata={"format": "pt"})
    os.replace(tmp, path)


def _remove_stale(directory: str, keep: set[str]) -> None:
    for name in os.listdir(directory):
        stale = name == INDEX_NAME or (name.startswith("model") and name.endswith(".safetensors"))
        if stale and name not in keep:
            os.remove(os.path.join(directory, name))


def write_safetensors(tensors: Mapping[str, np.ndarray], directory: str, *,
                      max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """Writes `tensors` (HF name -> array) into `directory`; returns the files written."""
    for name, value in tensors.items():
        if not isinstance(value, np.ndarray):
            raise TypeError(f"tensor {name!r} must be a numpy array, got {type(value).__name__}")
    shards = plan_shards({k: v.nbytes for k, v in tensors.items()},
                         max_shard_bytes=max_shard_bytes)
    os.makedirs(directory, exist_ok=True)
    files = [_shard_name(i, len(shards)) for i in range(len(shards))]
    for names, file in zip(shards, files):
        _save({k: tensors[k] for k in names}, os.path.join(directory, file))
    if len(shards) > 1:
        index = {"metadata": {"total_size": int(sum(v.nbytes for v in tensors.values()))},
                 "weight_map": {k: file for names, file in zip(shards, files) for k in names}}
        tmp = os.path.join(directory, INDEX_NAME + ".tmp")
        with open(tmp, "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
        os.replace(tmp, os.path.join(directory, INDEX_NAME))
        files.append(INDEX_NAME)
    _remove_stale(directory, set(files))
    return files
