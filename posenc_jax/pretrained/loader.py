"""A checkpoint (see `posenc_jax.pretrained.checkpoint`) -> a `Transformer` holding its weights.

    model, config, hf_config = build(ckpt, dtype="float32", rope_scaling=None)

Order, so that a bad checkpoint never gives a half-loaded model:

1. the config: the family's config.json (with `rope_scaling` in place of the checkpoint's own,
   if given) -> `TransformerConfig` through the family's record (`families.config_kwargs`);
2. the abstract model (`nnx.eval_shape`: shapes, dtypes and shardings, no memory);
3. the plan: every checkpoint tensor's target param(s) and expected shape (`names.targets`,
   the record's tensor table), checked against the checkpoint's names and shapes WITHOUT
   reading any tensor -- a missing, extra or misshapen tensor is a ValueError naming the file
   and the tensor (a MoE's per-expert tensors are checked as their stacks, `experts.stacked`);
4. the tensors, one at a time: read (float32), change layout (a fused tensor is split into its
   params), cast to `dtype`, `device_put` straight into the param's sharding (the mesh and
   logical axis rules of the caller's `jax.set_mesh` / `nnx.logical_axis_rules`, if any). The
   host holds one tensor (and its converted copies) at a time, never the whole checkpoint.

Context extension in one argument: `rope_scaling` is a Hugging Face `rope_scaling` /
`rope_parameters` dict ({"rope_type": "yarn", "factor": 2.0, ...}); it replaces the
checkpoint's (the checkpoint's rope_theta is kept unless the dict gives one), and is read by
`posenc_jax.encodings.hf` as transformers reads it. For Gemma 3 a flat dict applies to the
full-attention layers (transformers' legacy `rope_scaling`), a dict keyed by layer type
replaces `rope_parameters`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from posenc_jax.encodings.hf.read import layer_types, resolve, text_config
from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.transformer import Transformer
from posenc_jax.pretrained import experts
from posenc_jax.pretrained.checkpoint import tensor_error
from posenc_jax.pretrained.families import config_kwargs, family_of_config
from posenc_jax.pretrained.names import ignored, param_shapes, prefix_of, targets

__all__ = ["DTYPES", "build", "with_rope_scaling"]

DTYPES = ("float32", "bfloat16")


def _file(ckpt, name: str):
    """The file holding `name` (safetensors shards know it), else the checkpoint's path."""
    file_of = getattr(ckpt, "file_of", None)
    return file_of(name) if file_of is not None else ckpt.path


def with_rope_scaling(config: Mapping[str, Any], rope_scaling: Mapping | None) -> dict:
    """A copy of the config.json dict whose RoPE scaling is `rope_scaling` (see module doc)."""
    out = copy.deepcopy(dict(config))
    if rope_scaling is None:
        return out
    if not isinstance(rope_scaling, Mapping):
        raise TypeError(f"rope_scaling must be a dict (a Hugging Face rope_scaling / "
                        f"rope_parameters), got rope_scaling={rope_scaling!r}")
    new = copy.deepcopy(dict(rope_scaling))
    target = out["text_config"] if isinstance(out.get("text_config"), dict) else out
    old = target.get("rope_parameters") or {}
    if new and all(isinstance(v, Mapping) for v in new.values()):  # keyed by layer type
        for layer_type, params in new.items():
            theta = (old.get(layer_type) or {}).get("rope_theta")
            if theta is not None:
                params.setdefault("rope_theta", theta)
        target["rope_parameters"] = new
        target.pop("rope_scaling", None)
        return out
    flat, _, family = resolve(out)
    if layer_types(flat, family) is None:  # one RoPE: keep the checkpoint's theta
        theta = old.get("rope_theta", target.get("rope_theta"))
        if theta is not None:
            new.setdefault("rope_theta", theta)
    target["rope_scaling"] = new  # read before rope_parameters (per layer: full_attention)
    return out


def _plan(ckpt, cfg: TransformerConfig, family, shapes: dict) -> dict:
    names = ckpt.names()
    plan = targets(cfg, family, prefix_of(names), shapes=shapes)
    missing = [n for n in plan if n not in set(names)]
    if missing:
        raise tensor_error(ckpt.path, missing[0], f"missing from the checkpoint "
                           f"({len(missing)} missing in all)")
    extra = [n for n in names if n not in plan and not ignored(n, tied=cfg.tie_embeddings)]
    if extra:
        raise tensor_error(_file(ckpt, extra[0]), extra[0],
                           f"not a parameter of this {cfg.num_layers}-layer model "
                           f"({len(extra)} extra in all)")
    for name, target in plan.items():
        shape = tuple(ckpt.shape(name))
        if shape != target.hf_shape:
            raise tensor_error(_file(ckpt, name), name,
                               f"shape {shape} does not fit the config (expected "
                               f"{target.hf_shape})")
    return plan


def _sharding(value: jax.ShapeDtypeStruct):
    """The concrete sharding for an abstract param (None: the default device)."""
    sharding = getattr(value, "sharding", None)
    if sharding is None or not hasattr(sharding, "spec"):
        return None
    mesh = jax.sharding.get_mesh()
    if mesh is None or getattr(mesh, "empty", False) or not mesh.shape:
        return None
    return jax.sharding.NamedSharding(mesh, sharding.spec)


def _variable(model: nnx.Module, path: tuple):
    node = model
    for key in path:
        node = node[key] if isinstance(key, int) else getattr(node, key)
    return node


def build(ckpt, *, dtype: str = "float32", rope_scaling: Mapping | None = None,
          attention: str = "auto") -> tuple[Transformer, TransformerConfig, dict]:
    """(model with the checkpoint's weights, its TransformerConfig, the config.json dict used).

    Args:
      ckpt: a `Checkpoint` (`open_safetensors(dir)`, `open_gguf(path)`).
      dtype: "float32" or "bfloat16": the params' and the activations' dtype.
      rope_scaling: a Hugging Face rope_scaling / rope_parameters dict replacing the
        checkpoint's (module docstring), or None.
      attention: the TransformerConfig's attention implementation.

    Raises:
      ValueError: unsupported model_type or config setting, a missing / extra / misshapen /
        unreadable tensor (naming the file and the tensor), an unknown dtype.
      TypeError: rope_scaling not a dict.
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(map(repr, DTYPES))}")
    ckpt = experts.stacked(ckpt)  # a MoE's per-expert tensors as stacks (pretrained.experts)
    hf = with_rope_scaling(ckpt.config, rope_scaling)
    text_config(hf)  # TypeError for a config that is not a dict of dicts
    family, _, _ = family_of_config(hf, ckpt.path)
    cfg = TransformerConfig(**config_kwargs(hf, where=ckpt.path), dtype=dtype,
                            param_dtype=dtype, attention=attention)
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    shapes = param_shapes(model)
    plan = _plan(ckpt, cfg, family, shapes)
    unfilled = set(shapes) - {p.path for t in plan.values() for p in t.parts}
    if unfilled:  # a family record that forgot a param: never return it half loaded
        raise ValueError(f"{ckpt.path}: no checkpoint tensor fills the model's params "
                         f"{sorted(map(str, unfilled))[:3]}")
    np_dtype = jnp.dtype(dtype)
    for name, target in plan.items():
        tensor = ckpt.tensor(name)
        for part in target.parts:
            variable = _variable(model, part.path)
            abstract = variable.get_value()
            value = part.convert(tensor)
            if value.shape != abstract.shape:
                raise tensor_error(_file(ckpt, name), name, f"converts to shape {value.shape}, "
                                   f"the model's param {part.path} is {abstract.shape}")
            variable.set_value(jax.device_put(value.astype(np_dtype), _sharding(abstract)))
            del value
        del tensor
    return model, cfg, hf
