"""A run that starts from a pretrained checkpoint (`config.init.checkpoint`).

    model_config(config) -> TransformerConfig      the checkpoint's architecture + fine-tune keys
    load_params(config, setup) -> params           its weights, in the setup's shardings
    tokenizer(config) -> Tokenizer                 the checkpoint's tokenizer

Config block `init`:
  checkpoint     '' (train from scratch) or a Hugging Face directory (config.json +
                 *.safetensors) or a GGUF file
  rope_scaling   '' (the checkpoint's own), a Hugging Face rope_scaling dict written as a
                 Python / JSON literal ("{'rope_type': 'yarn', 'factor': 2.0, ...}"), or
                 "METHOD:FACTOR" ("yarn:4"): the registry's stretch rule
                 (`rope_scaling.stretch`) from the checkpoint's max_position_embeddings;
                 a stretch to factor x original also sets max_position_embeddings to that
                 length (`with_new_context`), as a long-context checkpoint's config.json does

The architecture comes from the checkpoint (`posenc_jax.pretrained`'s family records). A
`config.model` key left None takes the checkpoint's value; one that is set must agree with it
unless a fine-tune may change it (`FINETUNE_KEYS`: attention backend, block sizes, dtypes,
scan, context mode, remat); a contradiction is a ValueError naming both values. The weights
are read one tensor at a time and placed straight into the mesh's shardings
(`posenc_jax.pretrained.loader.build` under the setup's mesh and rules).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
from typing import Any

import jax
from flax import nnx

from posenc_jax.encodings import rope_scaling as scaling_registry
from posenc_jax.encodings.hf.read import resolve
from posenc_jax.model.config import TransformerConfig
from posenc_jax.pretrained.api import open_checkpoint
from posenc_jax.pretrained.families import config_kwargs
from posenc_jax.pretrained.loader import build, with_rope_scaling
from posenc_jax.pretrained.tokenizer import Tokenizer

#: `config.model` keys a fine-tune may set whatever the checkpoint says.
FINETUNE_KEYS = ("attention", "block_size", "kernel_blocks", "dtype", "param_dtype",
                 "scan_layers", "context_mode", "remat", "dense_backend")


def checkpoint_path(config) -> str:
    """`config.init.checkpoint`, or '' when the run starts from scratch."""
    init = config.get("init")
    path = (init.get("checkpoint") if init is not None else None) or ""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"config.init.checkpoint must be a path (a Hugging Face directory or a "
                        f".gguf file), got config.init.checkpoint={path!r}")
    return os.fspath(path)


def open_source(config):
    """The checkpoint `config.init.checkpoint` names (FileNotFoundError naming the key)."""
    path = checkpoint_path(config)
    if not os.path.exists(path):
        raise FileNotFoundError(f"config.init.checkpoint={path!r}: no such Hugging Face "
                                "directory or .gguf file")
    return open_checkpoint(path)


def _rope_dims(flat: dict, cfg_kwargs: dict) -> tuple[int, int]:
    """(original context length, rotary dim) of the checkpoint's RoPE."""
    head = cfg_kwargs.get("head_dim") or cfg_kwargs["embed_dim"] // cfg_kwargs["num_heads"]
    rotary = int(head * float(flat.get("partial_rotary_factor") or 1.0))
    old = flat.get("rope_scaling") or {}
    length = old.get("original_max_position_embeddings") or flat["max_position_embeddings"]
    return int(length), rotary


def rope_scaling(config, hf: dict) -> dict | None:
    """The `config.init.rope_scaling` dict (None: the checkpoint's own); see the module doc."""
    text = config.init.get("rope_scaling") or ""
    if isinstance(text, dict) or hasattr(text, "to_dict"):
        return dict(text.to_dict() if hasattr(text, "to_dict") else text)
    if not isinstance(text, str):
        raise TypeError(f"config.init.rope_scaling must be a string, got "
                        f"config.init.rope_scaling={text!r}")
    if not text.strip():
        return None
    if ":" in text and not text.lstrip().startswith("{"):
        method, _, factor = text.partition(":")
        try:
            factor = float(factor)
        except ValueError:
            raise ValueError(f"config.init.rope_scaling={text!r}: FACTOR in METHOD:FACTOR "
                             "must be a number") from None
        flat, _, _ = resolve(hf)
        length, rotary = _rope_dims(flat, config_kwargs(hf, where=checkpoint_path(config)))
        return scaling_registry.stretch(method.strip(), factor=factor,
                                        original_max_position_embeddings=length,
                                        rotary_dim=rotary)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
    if not isinstance(value, dict):
        raise ValueError(f"config.init.rope_scaling={text!r} is neither a dict literal nor "
                         "METHOD:FACTOR (e.g. 'yarn:2')")
    return value


def with_new_context(hf: dict, scaling: dict | None) -> dict:
    """`hf` with max_position_embeddings = factor x original when `scaling` stretches RoPE
    to a longer context (YaRN, LongRoPE, Llama 3 name both): the fine-tuned model's new
    length, which transformers reads YaRN's attention factor from."""
    if not scaling or not all(k in scaling for k in ("factor", "original_max_position_embeddings")):
        return hf
    if scaling.get("rope_type") not in ("yarn", "longrope", "llama3"):
        return hf
    target = hf["text_config"] if isinstance(hf.get("text_config"), dict) else hf
    target["max_position_embeddings"] = round(float(scaling["factor"]) *
                                              int(scaling["original_max_position_embeddings"]))
    return hf


def _model_block(config) -> dict:
    model = config.get("model")
    return dict(model.to_dict() if hasattr(model, "to_dict") else (model or {}))


def model_config(config) -> tuple[TransformerConfig, dict]:
    """(the TransformerConfig, the config.json dict with the new scaling) of the checkpoint
    with `config.model`'s fine-tune keys applied; ValueError for a contradicting key."""
    ckpt = open_source(config)
    scaling = rope_scaling(config, ckpt.config)
    hf = with_new_context(with_rope_scaling(ckpt.config, scaling), scaling)
    kwargs = config_kwargs(hf, where=ckpt.path)
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    block = {k: v for k, v in _model_block(config).items() if v is not None}
    unknown = sorted(set(block) - fields)
    if unknown:
        raise ValueError(f"config.model has unknown key(s) {unknown}; TransformerConfig takes "
                         f"{sorted(fields)}")
    reference = TransformerConfig(**kwargs)
    for key, value in sorted(block.items()):
        if key in FINETUNE_KEYS:
            continue
        theirs = getattr(reference, key)
        if value != theirs and TransformerConfig(**{**kwargs, key: value}) != reference:
            raise ValueError(
                f"config.model.{key}={value!r} contradicts the checkpoint "
                f"{checkpoint_path(config)}, whose {key} is {theirs!r}: leave config.model."
                f"{key} unset (None) to take the checkpoint's; a fine-tune may change only "
                f"{', '.join(FINETUNE_KEYS)} (and the RoPE through config.init.rope_scaling)")
    kwargs.update({k: v for k, v in block.items() if k in FINETUNE_KEYS})
    return TransformerConfig(**kwargs), hf


def load_params(config, setup) -> dict[str, Any]:
    """The checkpoint's weights as a pure dict in `setup.params_shardings`, read one
    tensor at a time (never the whole model on one device or in host memory)."""
    ckpt = open_source(config)
    dtype = jax.numpy.dtype(setup.model_config.param_dtype).name
    with setup.context():
        model, _, _ = build(ckpt, dtype=dtype, rope_scaling=rope_scaling(config, ckpt.config),
                            attention=setup.model_config.attention)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return jax.device_put(params, setup.params_shardings)


def tokenizer(config) -> Tokenizer:
    """The checkpoint's tokenizer (its tokenizer.json, or the GGUF file's own vocabulary);
    ValueError naming config.init.checkpoint when a directory has none."""
    path = checkpoint_path(config)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "tokenizer.json")):
            raise ValueError(f"config.init.checkpoint={path!r} has no tokenizer.json: set "
                             "config.dataset.tokenizer='bytes' or add the tokenizer's files")
        return Tokenizer.from_directory(path)
    return Tokenizer.from_gguf(open_source(config))


def original_context(config) -> int | None:
    """The checkpoint's own context length (its RoPE's original, else max_position_embeddings)."""
    flat, _, _ = resolve(open_source(config).config)
    old = flat.get("rope_scaling") or {}
    value = old.get("original_max_position_embeddings") or flat.get("max_position_embeddings")
    return None if value is None else int(value)


def model_type(config) -> str:
    """The checkpoint's model_type (what `python -m train.export` writes back)."""
    flat, model_type_, _ = resolve(open_source(config).config)
    del flat
    return model_type_
