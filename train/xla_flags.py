"""XLA flag defaults and CPU attention choices for our entry points (never set at import).

The library (`posenc_jax`) never changes global state. The entry points -- the training CLI
(`python -m train`), the study (`python -m train.study`) and the benchmarks -- call
`apply_cpu_defaults()` first thing, before JAX initialises its backend (XLA reads
`XLA_FLAGS` once, then). It sets `XLA_FLAGS` only when the user has not set it (an empty
`XLA_FLAGS=` counts as set: it means "no flags").

DEFAULT_CPU_FLAGS is empty: see `docs/performance.md`. On jaxlib 0.10.2 the oneDNN matmul
flags `--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=dot` abort the
process ("partition compile failed", SIGILL) for any dot whose operand is produced by an
elementwise op in the same program -- `jnp.dot(a * 2.0, b)` under `jax.jit` -- which every
transformer contains, so no config is safe under them; the other backend flags measured no
faster than XLA's default on the whole train step.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from posenc_jax.model import backends

__all__ = ["DEFAULT_CPU_FLAGS", "apply_cpu_defaults", "cpu_attention"]

#: Flags our entry points set when `XLA_FLAGS` is unset (see the module docstring).
DEFAULT_CPU_FLAGS = ""


def apply_cpu_defaults(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Sets `XLA_FLAGS` to `DEFAULT_CPU_FLAGS` unless the user set it; returns what it set.

    Returns None (and changes nothing) when `XLA_FLAGS` is already in `environ` (default
    `os.environ`) or when there is nothing to set. Call it before the first JAX computation.
    """
    environ = os.environ if environ is None else environ
    if "XLA_FLAGS" in environ or not DEFAULT_CPU_FLAGS:
        return None
    environ["XLA_FLAGS"] = DEFAULT_CPU_FLAGS
    return DEFAULT_CPU_FLAGS


def cpu_attention(seq_len: int) -> dict[str, object]:
    """Model overrides (`attention`, `block_size`) measured fastest for training on CPU at
    this length: dense up to 512 tokens, blockwise with 128-token blocks above (at L=1024:
    1.1x blocks of 256, 1.4x blocks of 512, 1.6x dense; see `docs/performance.md`)."""
    if seq_len <= 512:
        return {"attention": backends.DENSE}
    return {"attention": backends.BLOCKWISE, "block_size": 128}
