"""Rematerialisation of the blocks (`TransformerConfig.remat`): one registry of named policies.

A train step keeps, per block, the activations its backward pass reads: roughly
L x (10 E + 3 F) floats per layer (issue 30). `jax.checkpoint` around each block trades that
memory for recomputing the block's forward during the backward pass; a policy says which
intermediate values are still saved:

    none        no checkpoint: every activation kept (fastest, most memory)
    block       save nothing inside a block, only its input: the whole block's forward runs
                again in the backward pass (least memory)
    dots        save the outputs of the matmuls without batch dimensions (the q/k/v/o
                projections and the MLP's matmuls: `jax.checkpoint_policies.
                dots_with_no_batch_dims_saveable`), recompute the rest: norms, activations
                and attention (whose score matmuls have batch dims)
    attention   save only each block's attention output (`checkpoint_name` "attention"),
                recompute the projections and the MLP: the attention, quadratic in the
                length, never runs twice

Gradients equal those without remat (the same computation, recomputed). `wrap` applies the
named policy to a pure block function; the Python loop and the scan call it alike (in a
scan with `prevent_cse=False`, as `jax.checkpoint` advises inside loops).

Measured with XLA's compiled memory analysis (tests/model/test_remat.py; XLA:CPU, 6 scanned
layers, E 32, B 2, L 256): temporaries none 46.7 MB, block 10.4, dots 15.3, attention 10.8;
at E 128 with blockwise attention: 71.6, 22.8, 39.3, 24.4. On XLA:CPU only the scan shows the
saving: with the unrolled loop its schedule runs the recomputed forwards early and the
estimate barely moves (39.8 -> 38.5 MB), so measure remat on CPU with `scan_layers=True`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from jax.ad_checkpoint import checkpoint_name

from posenc_jax.checks import one_of

__all__ = ["ATTENTION_NAME", "POLICIES", "RematPolicy", "check_remat", "names",
           "tag_attention", "wrap"]

#: The `checkpoint_name` of each block's attention output (what "attention" saves).
ATTENTION_NAME = "attention"


@dataclasses.dataclass(frozen=True)
class RematPolicy:
    """name: the `remat=` value. policy: a `jax.checkpoint` policy (None: save nothing).
    checkpoint: False for "none" (no `jax.checkpoint` at all). summary: one line."""

    name: str
    policy: Any
    checkpoint: bool
    summary: str


POLICIES = {p.name: p for p in (
    RematPolicy("none", None, False, "no rematerialisation: every activation kept"),
    RematPolicy("block", jax.checkpoint_policies.nothing_saveable, True,
                "recompute each whole block in the backward pass"),
    RematPolicy("dots", jax.checkpoint_policies.dots_with_no_batch_dims_saveable, True,
                "save the projections' and the MLP's matmul outputs, recompute the rest"),
    RematPolicy("attention", jax.checkpoint_policies.save_only_these_names(ATTENTION_NAME),
                True, "save each block's attention output, recompute the rest"),
)}


def names() -> tuple[str, ...]:
    """The valid `remat=` values."""
    return tuple(POLICIES)


def check_remat(value: Any) -> str:
    """`value` if it names a policy; else ValueError listing them (TypeError for a non-str)."""
    if not isinstance(value, str):
        raise TypeError(f"remat must be a str naming a policy ({', '.join(map(repr, names()))})"
                        f", got remat={value!r}")
    return one_of("remat", value, names())


def tag_attention(x: jax.Array) -> jax.Array:
    """x named `ATTENTION_NAME` for the "attention" policy (the identity otherwise)."""
    return checkpoint_name(x, ATTENTION_NAME)


def wrap(fn: Callable, remat: str, *, in_scan: bool) -> Callable:
    """`fn` under `jax.checkpoint` with the named policy (`fn` itself for "none"). `fn` must be
    pure (its array arguments explicit, e.g. a block's split state)."""
    record = POLICIES[check_remat(remat)]
    if not record.checkpoint:
        return fn
    return jax.checkpoint(fn, policy=record.policy, prevent_cse=not in_scan)
