"""Checkpoints: an orbax CheckpointManager that survives kills, preemption and corruption.

A checkpoint at step S holds the train state after S updates, as two named items:

    state   {"params", "opt_state", "step"}  arrays (sharded; restored onto the current mesh)
    meta    JSON: step, seed, data position (the next batch index), the config, and a
            fingerprint of `state` (a wrapping uint32 sum of every word) that is checked on
            restore, so silent corruption is caught as well as unreadable files.

Orbax writes each step into a temporary directory and renames it when complete, so a process
killed mid-save leaves no half-written step behind (the temporary directory is removed on the
next start). A newest step that fails to restore is moved to `<dir>/../corrupt_checkpoints/`
with a warning, and the previous one is tried.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

CHECKPOINT_DIR = "checkpoints"  # under the workdir


def _words(x: jax.Array) -> jax.Array:
    """The array's bit pattern as uint32 words (bool/8/16-bit types widened, 64-bit split)."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    size = x.dtype.itemsize
    if size == 8:
        return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[size]
    return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32).reshape(-1)


def _fingerprint(tree: Any) -> jax.Array:
    total = jnp.uint32(0)
    for i, leaf in enumerate(jax.tree.leaves(tree)):
        total = total + jnp.sum(_words(leaf), dtype=jnp.uint32) * jnp.uint32(2 * i + 1)
    return total


_FINGERPRINT = {
    "cpu": jax.jit(_fingerprint, compiler_options={"xla_backend_optimization_level": 0}),
    "other": jax.jit(_fingerprint)}


def fingerprint(tree: Any) -> jax.Array:
    """A uint32 checksum of every word of every leaf, independent of sharding and order of
    reduction (integer sums wrap exactly). Leaf order matters, so trees must match."""
    leaves = jax.tree.leaves(tree)
    cpu = bool(leaves) and all(d.platform == "cpu" for d in leaves[0].sharding.device_set)
    return _FINGERPRINT["cpu" if cpu else "other"](tree)


class _DropFutureNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "exception was never retrieved" not in record.getMessage()


_NOISE_FILTER = _DropFutureNoise()


def _drop_orphaned_futures() -> None:
    """A failed orbax restore leaves asyncio futures that hold the same error, and asyncio
    prints each one ("Future exception was never retrieved", kilobytes apiece) when they are
    collected, possibly at exit. We have reported the failure already, so from the first
    failure on, the 'asyncio' logger drops exactly that message."""
    logger = logging.getLogger("asyncio")
    if _NOISE_FILTER not in logger.filters:
        logger.addFilter(_NOISE_FILTER)
    gc.collect()


class CheckpointError(RuntimeError):
    """Raised when no checkpoint in a non-empty directory can be restored."""


class Checkpointer:
    """Save every N steps, keep the last K, restore the newest readable one."""

    def __init__(self, directory: str, *, max_to_keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        self._options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save)
        self._manager = ocp.CheckpointManager(self.directory, options=self._options)

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any], *, wait: bool = False) -> None:
        """Saves `state` at `step` (asynchronously unless `wait`); a step already on disk is
        left as it is."""
        if step in self._manager.all_steps():
            return
        meta = dict(meta, step=int(step), fingerprint=int(fingerprint(state)))
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
        if wait:
            self._manager.wait_until_finished()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """Restores one step onto the shardings in `abstract_state` (ShapeDtypeStructs)."""
        out = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        state, meta = out["state"], dict(out["meta"])
        if jax.tree.structure(state) != jax.tree.structure(abstract_state):
            raise ValueError(f"checkpoint structure {jax.tree.structure(state)} does not match "
                             f"the model's {jax.tree.structure(abstract_state)}")
        got = int(fingerprint(state))
        if "fingerprint" in meta and got != int(meta["fingerprint"]):
            raise ValueError(f"fingerprint mismatch: saved {meta['fingerprint']}, read {got}")
        return state, meta

    def restore_meta(self, step: int) -> dict[str, Any]:
        """Only the JSON metadata of one step (cheap: no arrays are read)."""
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"])

    def restore_latest(self, abstract_state: Any) -> tuple[Any, dict[str, Any]] | None:
        """The newest restorable (state, meta), or None for an empty directory.

        An unreadable step is moved aside with a warning and the previous one is tried; if
        none can be read, raises CheckpointError (never silently starts from scratch).
        """
        self.wait()
        steps = self.all_steps()
        if not steps:
            return None
        failures = []
        for step in reversed(steps):
            try:
                return self.restore(step, abstract_state)
            except Exception as err:  # noqa: BLE001 -- any failure means "unreadable"
                reason = f"{type(err).__name__}: {str(err)[:300]}"
            _drop_orphaned_futures()
            where = self._quarantine(step)
            warnings.warn(f"checkpoint at step {step} in {self.directory} could not be restored "
                          f"({reason}); moved it to {where} and falling back to an earlier "
                          f"checkpoint", RuntimeWarning, stacklevel=2)
            failures.append(f"step {step}: {reason.split(':')[0]}")
        raise CheckpointError(f"no checkpoint in {self.directory} could be restored "
                              f"({'; '.join(failures)}); move the directory away to start over")

    def _quarantine(self, step: int) -> str:
        src = os.path.join(self.directory, str(step))
        dst = os.path.join(os.path.dirname(self.directory), "corrupt_checkpoints",
                           f"{step}-{int(time.time())}")
        if jax.process_index() == 0 and os.path.exists(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.move(src, dst)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"quarantine checkpoint {step}")
        self._manager.close()
        self._manager = ocp.CheckpointManager(self.directory, options=self._options)
        return dst

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def to_numpy(tree: Any) -> Any:
    """Host copies of a (fully addressable or replicated) tree, for tests and comparisons."""
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)
