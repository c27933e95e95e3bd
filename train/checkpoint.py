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

import contextlib
import gc
import logging
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable
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


def _ignore_closed_loop_coroutines(unraisable) -> bool:
    """True for the noise of a failed orbax restore: a coroutine or callback of tensorstore
    that is collected after its event loop closed ("Exception ignored in: <coroutine ...>")."""
    obj = repr(getattr(unraisable, "object", ""))
    err = unraisable.exc_value
    return ("coroutine" in obj or isinstance(err, RuntimeError) and "Event loop is closed"
            in str(err))


@contextlib.contextmanager
def quiet_failed_restores():
    """Scoped: while a run is in progress, drop the noise that orbax leaves behind a restore
    that failed (and that `Checkpointer.restore_latest` has already reported with a warning).

    A failed orbax restore leaves asyncio futures and coroutines that hold the same error;
    when they are garbage-collected asyncio logs "Future exception was never retrieved" and
    Python prints "Exception ignored in: <coroutine ...>" tracebacks, kilobytes apiece. Inside
    this context the 'asyncio' logger drops exactly that message and `sys.unraisablehook`
    ignores exactly those objects; on exit the garbage is collected and both are restored, so
    nothing global outlives the run.
    """
    logger = logging.getLogger("asyncio")
    noise = _DropFutureNoise()
    logger.addFilter(noise)
    previous = sys.unraisablehook

    def hook(unraisable):
        if not _ignore_closed_loop_coroutines(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        gc.collect()
        sys.unraisablehook = previous
        logger.removeFilter(noise)


class CheckpointError(RuntimeError):
    """Raised when no checkpoint in a non-empty directory can be restored."""


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (names the step, the directory and the cause)."""


class Checkpointer:
    """Save every N steps, keep the last K, restore the newest readable one."""

    def __init__(self, directory: str, *, max_to_keep: int = 3, async_save: bool = True,
                 read_only: bool = False):
        """`read_only`: a reader beside a run that may be writing (an evaluation, the study's
        parent asking whether a training finished, a fine-tune reading its base): it creates
        nothing and never removes a `*.orbax-checkpoint-tmp` folder, which a writer's
        CheckpointManager does when it opens (it would delete a save in flight). Orbax's own
        `read_only` option is not used: it logs warnings on every open."""
        self.directory = os.path.abspath(directory)
        self._pending: int | None = None  # the step of an asynchronous save in flight
        # Directories are created in the calling thread: a directory that cannot be created
        # (permissions, a full disk) then raises here, at once. Created asynchronously, the
        # failure left orbax's writer threads waiting for a "directory ready" signal that never
        # came, and the process hung at exit (issue 15).
        self._options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=not read_only, cleanup_tmp_directories=not read_only,
            enable_async_checkpointing=async_save and not read_only,
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False))
        self._manager = ocp.CheckpointManager(self.directory, options=self._options)

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any], *, wait: bool = False) -> None:
        """Saves `state` at `step` (asynchronously unless `wait`); a step already on disk is
        left as it is."""
        self.wait()  # raises for a failed earlier save before anything else is written
        if step in self._manager.all_steps():
            return
        meta = dict(meta, step=int(step), fingerprint=int(fingerprint(state)))
        try:
            self._manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
        except Exception as err:
            raise self._save_error(step, err) from err
        self._pending = int(step)
        if wait:
            self.wait()

    def _save_error(self, step: int, err: BaseException) -> CheckpointSaveError:
        return CheckpointSaveError(
            f"could not save the checkpoint of step {step} in {self.directory}: "
            f"{type(err).__name__}: {err}")

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

    def restore_latest(self, abstract_state: Any, *, check_meta: Callable[[int, dict], None]
                       | None = None) -> tuple[Any, dict[str, Any]] | None:
        """The newest restorable (state, meta), or None for an empty directory.

        `check_meta(step, meta)` sees each step's metadata before its arrays are read, and
        raises (e.g. for a checkpoint of another model): that error propagates and nothing
        in the directory is touched. An unreadable step (metadata or arrays that cannot be
        read, a fingerprint that does not match) is moved aside with a warning and the
        previous one is tried; if none can be read, raises CheckpointError (never silently
        starts from scratch).
        """
        self.wait()
        steps = self.all_steps()
        if not steps:
            return None
        failures = []
        for step in reversed(steps):
            try:
                meta = self.restore_meta(step)
            except Exception as err:  # noqa: BLE001 -- any failure means "unreadable"
                meta, reason = None, f"{type(err).__name__}: {str(err)[:300]}"
            if meta is not None:
                if check_meta is not None:
                    check_meta(step, meta)  # a mismatch is the caller's error: touch nothing
                try:
                    return self.restore(step, abstract_state)
                except Exception as err:  # noqa: BLE001 -- any failure means "unreadable"
                    reason = f"{type(err).__name__}: {str(err)[:300]}"
            gc.collect()  # its orphaned futures, while the caller's filter is on
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
        """Blocks until an asynchronous save is on disk; CheckpointSaveError if it failed."""
        step, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
        except Exception as err:
            raise self._save_error(step, err) from err

    def close(self) -> None:
        """Waits for a pending save (raising CheckpointSaveError if it failed) and closes."""
        try:
            self.wait()
        finally:
            self._manager.close()


def to_numpy(tree: Any) -> Any:
    """Host copies of a (fully addressable or replicated) tree, for tests and comparisons."""
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)
