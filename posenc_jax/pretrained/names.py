"""A family's Hugging Face tensor table (`Family.hf_tensors`) expanded for one model.

    plan = targets(cfg, family, prefix="model.")   # {HF name: Target}, in the table's order

Each `Row` of the record is expanded over the layers (`{i}`) and kept when the model has its
params (q / k / v biases only with `qkv_bias`, `lm_head` only untied, the gate only for a gated
MLP, ...). A `Target` is one checkpoint tensor: its Hugging Face shape and the params it fills
(`parts`: path, our shape, its place in the tensor, the layout; one part for a plain tensor,
several for a fused one: Phi-3's qkv_proj (rows), Llama 4's and gpt-oss's expert gate_up_proj
(halves / alternate columns of the last axis, `Row.split`)). Rows marked `moe` expand only
on the layers whose MLP is (True) or is not (False) the mixture of experts, so a dense MLP's
rows never claim a MoE layer's stacked params of the same name. Shapes come from the model itself
(`nnx.eval_shape`: no memory), so a record never writes a formula for them.

A tied model ignores an `lm_head.weight` (some exports write the tied copy); Gemma 3's and
Llama 4's multimodal checkpoints prefix the text model (`model.language_model.`,
`language_model.model.`) and their vision tower / model and projector are ignored. Rotary `inv_freq` buffers of old exports are
ignored too. Anything else is an extra tensor, and an error.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from flax import nnx

from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.transformer import Transformer
from posenc_jax.pretrained.families.record import Family, Row
from posenc_jax.pretrained.families.transforms import Layout

__all__ = ["Part", "Target", "ignored", "param_shapes", "prefix_of", "targets"]

PREFIXES = ("model.", "model.language_model.", "language_model.model.")
_IGNORED_STARTS = ("vision_tower.", "model.vision_tower.", "multi_modal_projector.",
                   "model.multi_modal_projector.", "vision_model.", "model.vision_model.")


@dataclasses.dataclass(frozen=True)
class Part:
    """One param inside a checkpoint tensor, in `layout`: split "rows": rows [start, stop) of
    the tensor; "halves": the last axis' [start, stop); "alternate": the last axis' entries
    start, start + stop, start + 2 stop, ... (stop = the number of parts)."""

    path: tuple
    shape: tuple[int, ...]
    start: int
    stop: int
    layout: Layout
    split: str = "rows"

    def convert(self, w: np.ndarray) -> np.ndarray:
        """np [the whole HF tensor] -> np [our shape] (the tensor itself for an unfused one in
        the same layout: export recognises the identity by that)."""
        if self.split == "halves":
            w = w[..., self.start:self.stop]
        elif self.split == "alternate":
            w = w[..., self.start::self.stop]
        elif not (self.start == 0 and self.stop == w.shape[0]):
            w = w[self.start:self.stop]
        return self.layout.to_ours(w, self.shape)


@dataclasses.dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: the Hugging Face shape it must have, and its parts."""

    hf_shape: tuple[int, ...]
    parts: tuple[Part, ...]


def ignored(name: str, *, tied: bool) -> bool:
    """Tensors a checkpoint may carry that the text model does not read."""
    return (name.endswith("rotary_emb.inv_freq") or name.startswith(_IGNORED_STARTS)
            or (tied and name in ("lm_head.weight", "language_model.lm_head.weight")))


def prefix_of(names) -> str:
    """The text model's prefix in these names ("model." for plain causal LMs)."""
    for prefix in PREFIXES[::-1]:
        if f"{prefix}embed_tokens.weight" in names:
            return prefix
    return PREFIXES[0]


def param_shapes(model: Transformer) -> dict[tuple, tuple[int, ...]]:
    """{param path: shape} of a model (concrete or abstract: `nnx.eval_shape`)."""
    return {path: tuple(v.get_value().shape)
            for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _placed(name: str, prefix: str) -> str:
    """A table name ("model.…", "lm_head.…") under the checkpoint's text-model prefix."""
    if name.startswith("model."):
        return prefix + name[len("model."):]
    if prefix == "language_model.model.":
        return "language_model." + name
    return name


def _expand(row: Row, i: int | None, shapes: dict, cfg: TransformerConfig) -> Target | None:
    if row.moe is not None and (i is None or cfg.layer(i).moe != row.moe):
        return None
    paths = [tuple(i if k == "{i}" else k for k in p) for p in row.paths]
    if not all(p in shapes for p in paths):
        return None
    first = row.layout.hf_shape(shapes[paths[0]])
    if row.split != "rows":  # along the last axis: halves or alternate columns
        n = len(paths)
        width = first[-1]
        parts = tuple(
            Part(path, shapes[path], j * width, (j + 1) * width, row.layout, row.split)
            if row.split == "halves" else Part(path, shapes[path], j, n, row.layout, row.split)
            for j, path in enumerate(paths))
        return Target((*first[:-1], n * width), parts)
    parts, start = [], 0
    for path in paths:
        hf = row.layout.hf_shape(shapes[path])
        parts.append(Part(path, shapes[path], start, start + hf[0], row.layout))
        start += hf[0]
    return Target((start, *first[1:]), tuple(parts))


def targets(cfg: TransformerConfig, family: Family, prefix: str = "model.", *,
            shapes: dict | None = None) -> dict[str, Target]:
    """{Hugging Face name: Target} for every tensor of family `family` that a `Transformer(cfg)`
    has params for; `shapes`: the model's {path: shape} (default: from the abstract model)."""
    if shapes is None:
        shapes = param_shapes(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    top = [(row, None) for row in family.hf_tensors if "{i}" not in row.hf]
    per_layer = [(row, i) for i in range(cfg.num_layers) for row in family.hf_tensors
                 if "{i}" in row.hf]
    out = {}
    for row, i in top + per_layer:
        target = _expand(row, i, shapes, cfg)
        if target is not None:
            out[_placed(row.hf.format(i=i), prefix)] = target
    return out
