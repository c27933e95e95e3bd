"""A MoE checkpoint's per-expert tensors, seen stacked (load) and split again (export).

transformers (5.x as 4.x) saves a mixture of experts one tensor per expert and projection:

    model.layers.N.mlp.experts.J.gate_proj.weight   [F, E]    J = 0 .. X-1

while the model holds each projection stacked over the experts ([X, E, F], `model.moe`). The
family records name the stack with a `*` in place of J:

    model.layers.N.mlp.experts.*.gate_proj.weight   [X, F, E]  (EXPERTS_TRANSPOSE -> [X, E, F])

`stacked(ckpt)` is the checkpoint with every such group shown as its stack (names, shape,
tensor: the experts read one at a time and stacked; `file_of` the first expert's file), so the
loader's plan checks the stack like any tensor; `split(tensors)` turns an export's stacks back
into per-expert tensors. A group whose experts are not exactly 0 .. n-1, or whose experts
differ in shape, is a ValueError naming the file and the missing (or odd) expert tensor; a
group of n experts where the config has X != n fails the plan's shape check, which names the
stack and both shapes.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from posenc_jax.pretrained.checkpoint import tensor_error

__all__ = ["STAR", "split", "stacked"]

STAR = ".experts.*."
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(.+)$")


def _groups(names) -> dict[str, dict[int, str]]:
    """{stack name: {expert index: tensor name}} for the per-expert names among `names`."""
    out: dict[str, dict[int, str]] = {}
    for name in names:
        m = _EXPERT.match(name)
        if m:
            out.setdefault(f"{m.group(1)}.*.{m.group(3)}", {})[int(m.group(2))] = name
    return out


class _Stacked:
    """`ckpt` with its per-expert tensors shown stacked (see the module docstring)."""

    def __init__(self, ckpt: Any, groups: dict[str, dict[int, str]]):
        self._ckpt, self._groups = ckpt, groups
        self.path, self.config = ckpt.path, ckpt.config
        for stack, members in groups.items():
            missing = sorted(set(range(max(members) + 1)) - set(members))
            if missing:
                raise tensor_error(self.file_of(stack), stack.replace(
                    "*", str(missing[0])), f"missing from the checkpoint: the experts of "
                    f"{stack} are {sorted(members)}, not 0 .. {max(members)}")
            shapes = {tuple(ckpt.shape(n)) for n in members.values()}
            if len(shapes) > 1:
                odd = next(n for n in members.values()
                           if tuple(ckpt.shape(n)) != tuple(ckpt.shape(members[0])))
                raise tensor_error(self._file(odd), odd, f"shape {tuple(ckpt.shape(odd))} "
                                   f"differs from expert 0's {tuple(ckpt.shape(members[0]))}")

    def _file(self, name: str) -> Any:
        file_of = getattr(self._ckpt, "file_of", None)
        return file_of(name) if file_of is not None else self._ckpt.path

    def file_of(self, name: str) -> Any:
        members = self._groups.get(name)
        return self._file(members[min(members)] if members else name)

    def names(self) -> list[str]:
        inner = {n for members in self._groups.values() for n in members.values()}
        return [n for n in self._ckpt.names() if n not in inner] + list(self._groups)

    def shape(self, name: str) -> tuple[int, ...]:
        members = self._groups.get(name)
        if members is None:
            return tuple(self._ckpt.shape(name))
        return (len(members), *self._ckpt.shape(members[0]))

    def tensor(self, name: str) -> np.ndarray:
        members = self._groups.get(name)
        if members is None:
            return self._ckpt.tensor(name)
        return np.stack([self._ckpt.tensor(members[j]) for j in range(len(members))])


def stacked(ckpt: Any) -> Any:
    """`ckpt` itself when it has no per-expert tensors, else its stacked view."""
    groups = _groups(ckpt.names())
    return _Stacked(ckpt, groups) if groups else ckpt


def split(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{name: array} with every stack `….experts.*.…` [X, ...] replaced by its X experts."""
    out = {}
    for name, value in tensors.items():
        if STAR not in name:
            out[name] = value
            continue
        for j in range(value.shape[0]):
            out[name.replace(STAR, f".experts.{j}.")] = np.ascontiguousarray(value[j])
    return out
