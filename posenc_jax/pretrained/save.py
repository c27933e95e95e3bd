"""`save(model_or_lm, directory)`: a model as a Hugging Face checkpoint transformers loads.

    pretrained.save(lm, "out/smollm2-yarn")                 # a `load(...)` result
    pretrained.save(model, "out/mine", tokenizer=tok)       # any exportable `Transformer`
    AutoModelForCausalLM.from_pretrained("out/mine")        # (transformers, elsewhere)

Writes `config.json` (`export_config.hf_config`: the family's model_type, its RoPE in
`rope_parameters`, Gemma 3's layer types), the weights as `model.safetensors` (or shards plus
`model.safetensors.index.json` past `max_shard_bytes`, `shards.write_safetensors`) in the
model's param dtype, and the tokenizer's files when it has them. The weights go through the
loader's own table (the family record's, `names.targets`) read backwards: each param's layout
change is a selection of the Hugging Face tensor's entries, so it is inverted exactly (an index
array of the tensor's size is built once per tensor, and each param's selection of it says where
its entries go; a fused tensor such as Phi-3's qkv_proj is filled by several params, every
entry exactly once). Norm weights move between the model's and the family's convention (`w` vs
`1 + w`: Gemma) by adding the difference of the two offsets.

Refusals (ValueError, nothing written): a model no family can express
(`export_config.check_expressible`), a config that would not read back as the model's, a
param no checkpoint tensor holds (an encoding's own table, say).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

import numpy as np

from posenc_jax.model.transformer import Transformer
from posenc_jax.pretrained.experts import split
from posenc_jax.pretrained.export_config import choose_model_type, hf_config
from posenc_jax.pretrained.families import by_model_type
from posenc_jax.pretrained.names import Target, param_shapes, targets
from posenc_jax.pretrained.shards import DEFAULT_MAX_SHARD_BYTES, write_safetensors

__all__ = ["TOKENIZER_FILES", "hf_tensors", "save"]

#: Tokenizer files copied from a tokenizer's source directory, when it has one.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
                   "generation_config.json")


def _unpack(model_or_lm) -> tuple[Transformer, Any, dict]:
    """(model, tokenizer or None, the checkpoint's config.json or {})."""
    if isinstance(model_or_lm, Transformer):
        return model_or_lm, None, {}
    model = getattr(model_or_lm, "model", None)
    if not isinstance(model, Transformer):
        raise TypeError(f"model_or_lm must be a Transformer or a pretrained.load result (with "
                        f".model), got {type(model_or_lm).__name__}")
    return model, getattr(model_or_lm, "tokenizer", None), dict(
        getattr(model_or_lm, "hf_config", None) or {})


def _inverse(target: Target, values: list[np.ndarray]) -> np.ndarray:
    """The Hugging Face tensor whose parts' `convert(.)` are `values` (each selects entries)."""
    size = int(np.prod(target.hf_shape))
    index = np.arange(size, dtype=np.int64 if size >= 2**31 else np.int32).reshape(
        target.hf_shape)
    if len(target.parts) == 1 and target.parts[0].convert(index) is index:  # the identity
        return np.ascontiguousarray(values[0].reshape(target.hf_shape))
    out = np.empty(size, values[0].dtype)
    filled = np.zeros(size, bool)
    for part, value in zip(target.parts, values):
        moved = np.asarray(part.convert(index)).ravel()
        out[moved] = value.ravel()
        filled[moved] = True
    if not filled.all():  # a record whose parts do not cover their tensor
        raise ValueError(f"the params {[p.path for p in target.parts]} fill "
                         f"{int(filled.sum())} of the {size} entries of their tensor")
    return out.reshape(target.hf_shape)


def _value(model: Transformer, path: tuple) -> np.ndarray:
    node = model
    for key in path:
        node = node[key] if isinstance(key, int) else getattr(node, key)
    return np.asarray(node[...])


def hf_tensors(model: Transformer, model_type: str) -> dict[str, np.ndarray]:
    """{Hugging Face name: array in HF layout, in the param dtype} for `model` as `model_type`."""
    cfg = model.config
    family = by_model_type(model_type)
    shapes = param_shapes(model)
    plan = targets(cfg, family, shapes=shapes)
    unheld = sorted(map(str, set(shapes) - {p.path for t in plan.values() for p in t.parts}))
    if unheld:
        raise ValueError(f"cannot export this model as a transformers checkpoint: its params "
                         f"{unheld[:3]} have no tensor in a {model_type} checkpoint")
    shift = cfg.norm_offset - family.norm_offset
    out = {}
    for name, target in plan.items():
        values = []
        for part in target.parts:
            value = _value(model, part.path)
            if shift and part.path[-1] == "scale":  # w (offset o) = w' (offset o') + o - o'
                value = (value.astype(np.float32) + np.float32(shift)).astype(value.dtype)
            values.append(value)
        out[name] = _inverse(target, values)
    return split(out)  # a MoE's stacked experts as transformers' per-expert tensors


def _tokenizer_files(tokenizer, directory: pathlib.Path) -> list[str]:
    """Writes the tokenizer's files (see `save`); returns their names."""
    if tokenizer is None:
        return []
    source = tokenizer if isinstance(tokenizer, (str, os.PathLike)) else getattr(
        tokenizer, "directory", None)
    if source is not None and pathlib.Path(source).is_dir():
        names = [n for n in TOKENIZER_FILES if (pathlib.Path(source) / n).is_file()]
        for n in names:
            shutil.copyfile(pathlib.Path(source) / n, directory / n)
        return names
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "to_str"):  # a `tokenizers.Tokenizer`
        (directory / "tokenizer.json").write_text(backend.to_str())
        config = {"tokenizer_class": "PreTrainedTokenizerFast"}
        for key, attr in (("bos_token", "bos_id"), ("eos_token", "eos_id")):
            token_id = getattr(tokenizer, attr, None)
            if token_id is not None:
                config[key] = backend.id_to_token(int(token_id))
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        return ["tokenizer.json", "tokenizer_config.json"]
    raise TypeError(f"tokenizer must be a directory of tokenizer files or a Tokenizer with "
                    f".directory or .backend (a tokenizers.Tokenizer), got "
                    f"{type(tokenizer).__name__}")


def _directory(directory: Any) -> pathlib.Path:
    """`directory` as a path; "" (which would write into the current directory) refused."""
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"save: directory must be a str or os.PathLike, got {directory!r} "
                        f"({type(directory).__name__})")
    if not os.fspath(directory):
        raise ValueError("save: directory must be a non-empty path, got directory='' (it would "
                         "write into the current directory; pass '.' to mean that)")
    out = pathlib.Path(directory)
    if out.exists() and not out.is_dir():
        raise ValueError(f"save: directory={os.fspath(directory)!r} is a file, not a directory")
    return out


def save(model_or_lm, directory: str | os.PathLike, *, tokenizer=None,
         model_type: str | None = None, hf_config_base: Mapping[str, Any] | None = None,
         max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """Writes `model_or_lm` to `directory` as a Hugging Face checkpoint; returns the files.

    Args:
      model_or_lm: a `Transformer`, or a `pretrained.load(...)` result (its `.model`, its
        `.tokenizer` unless `tokenizer` is given, its `.hf_config` for the family and token ids).
      directory: created if needed; an earlier export's weights there are replaced.
      tokenizer: a directory holding tokenizer files, or a Tokenizer (see `_tokenizer_files`).
      model_type: the family to write (default: the loaded checkpoint's, else the one the
        config's features name, `export_config.choose_model_type`).
      hf_config_base: config.json keys to keep (token ids, max_position_embeddings);
        default: the loaded checkpoint's config.json.
      max_shard_bytes: past this many bytes of weights, shards plus an index.

    Raises ValueError (nothing written) for a model that cannot be expressed, naming the part,
    an empty `directory` or one that is a file, or a `tokenizer` path that is no directory.
    """
    out = _directory(directory)
    if isinstance(tokenizer, (str, os.PathLike)) and not pathlib.Path(tokenizer).is_dir():
        raise ValueError(f"save: tokenizer={os.fspath(tokenizer)!r} is not a directory (give a "
                         "directory holding tokenizer.json / tokenizer_config.json, or a "
                         "Tokenizer); nothing written")
    model, own_tokenizer, base = _unpack(model_or_lm)
    base = dict(hf_config_base) if hf_config_base is not None else base
    cfg = model.config
    model_type = model_type or choose_model_type(cfg, base.get("model_type") or (
        base.get("text_config") or {}).get("model_type"))
    config = hf_config(cfg, model_type, base=base)
    tensors = hf_tensors(model, config["model_type"])
    out.mkdir(parents=True, exist_ok=True)
    files = write_safetensors(tensors, str(out), max_shard_bytes=max_shard_bytes)
    tmp = out / "config.json.tmp"
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out / "config.json")
    files.append("config.json")
    files += _tokenizer_files(tokenizer if tokenizer is not None else own_tokenizer, out)
    return files
