"""How a kernel's inputs and outputs are passed by role, and the one `pallas_call` wrapper.

A Pallas kernel receives a flat list of refs. Here they are told apart by ROLE, never by
their names' spelling: `Layout` records the named arrays (q, k, v, positions, ..., in order),
how many encoding-parameter leaves follow them, the named outputs and how many per-block
parameter-gradient outputs follow those, then the scratch buffers. `Refs` is the kernel's
view: `r["q"]`, `r.params`, `r.out["o"]`, `r.param_grads`, `r.scratch`.

`call` builds the `pallas_call` from a platform's block specs by name (anything unnamed, the
parameter leaves included, gets a whole-array block) and is what `gpu.py` and `tpu.py` both
use; `param_grad_outputs` gives the parameter-gradient outputs, one per leading grid index
(summed by the caller), the same on both platforms.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

__all__ = ["Layout", "Refs", "call", "full_block", "param_grad_outputs"]

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which ref is which: named inputs, then `params` parameter leaves; named outputs, then
    `param_grads` gradient outputs; then the scratch buffers."""

    inputs: tuple[str, ...]
    params: int
    outputs: tuple[str, ...]
    param_grads: int


class Refs:
    """A kernel's refs by role (see `Layout`)."""

    def __init__(self, layout: Layout, refs):
        n_in, n_out = len(layout.inputs), len(layout.outputs)
        at = n_in + layout.params
        self._inputs = dict(zip(layout.inputs, refs[:n_in]))
        self.params = list(refs[n_in:at])
        self.out = dict(zip(layout.outputs, refs[at:at + n_out]))
        at += n_out
        self.param_grads = list(refs[at:at + layout.param_grads])
        self.scratch = list(refs[at + layout.param_grads:])

    def __getitem__(self, name: str):
        return self._inputs[name]

    def load_params(self, param_tree, shapes=None):
        """The encoding's params pytree, each leaf loaded whole (they are small tables),
        reshaped to `shapes` where the platform passed them in another shape."""
        leaves = [r[...] for r in self.params]
        if shapes is not None:
            leaves = [x.reshape(s) if x.shape != s else x for x, s in zip(leaves, shapes)]
        return jax.tree.unflatten(param_tree, leaves)


def full_block(x) -> pl.BlockSpec:
    """A block holding the whole array (any grid)."""
    return pl.BlockSpec(x.shape, lambda *_, n=len(x.shape): (0,) * n)


def param_grad_outputs(params: list, lead: tuple[int, ...]) -> tuple[list, list]:
    """(out shapes, block specs) of the params-gradient outputs: float32 [*lead, *leaf.shape]
    per leaf, one block per value of the first len(lead) grid indices."""
    n = len(lead)

    def index(ndim):
        return lambda *ids: tuple(ids[:n]) + (0,) * ndim

    shapes = [jax.ShapeDtypeStruct(tuple(lead) + tuple(p.shape), F32) for p in params]
    specs = [pl.BlockSpec((None,) * n + tuple(p.shape), index(len(p.shape))) for p in params]
    return shapes, specs


def call(kernel: Callable, *, inputs: dict, params: list, outputs: dict, param_grads=(),
         specs: dict, out_specs: list, grid: tuple, interpret: bool, scratch=(),
         compiler_params: Any = None, **static) -> list:
    """`pl.pallas_call` of `kernel(*refs, layout=..., **static)` on the inputs by role.

    Args:
      inputs: named arrays; params: the encoding's parameter leaves.
      outputs: named ShapeDtypeStructs; param_grads: (shapes, specs) of `param_grad_outputs`.
      specs: BlockSpecs by input name (missing names and params: whole-array blocks).
      out_specs: BlockSpecs of the named outputs, in order.
    """
    grad_shapes, grad_specs = param_grads or ([], [])
    layout = Layout(tuple(inputs), len(params), tuple(outputs), len(grad_shapes))
    in_specs = ([specs.get(n) or full_block(x) for n, x in inputs.items()]
                + [full_block(p) for p in params])
    kw = {} if compiler_params is None else {"compiler_params": compiler_params}
    return pl.pallas_call(
        functools.partial(kernel, layout=layout, **static), grid=grid, in_specs=in_specs,
        out_specs=list(out_specs) + list(grad_specs),
        out_shape=list(outputs.values()) + list(grad_shapes), scratch_shapes=list(scratch),
        interpret=interpret, name=f"posenc_flash_{kernel.__name__.lstrip('_')}", **kw,
    )(*inputs.values(), *params)
