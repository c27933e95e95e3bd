"""One run per workdir: an advisory lock that a crash cannot leave stuck.

A run takes `<workdir>/.lock` with `fcntl.flock` before it touches anything in the workdir
(checkpoints, metrics.jsonl) and keeps it until it returns. The kernel drops a flock when its
holder exits, however it exits (SIGKILL and out-of-memory included), so a crashed run never
leaves the workdir locked: there is no stale-lock cleanup to get wrong. The file itself stays
and names the last holder (host, pid, start time, command line), which is what a second run
quotes when it refuses:

    WorkdirBusyError: workdir /x is in use by another run: pid 4242 on host h1 since
    2026-12-01T10:00:00Z (python -m train ...); wait for it to finish or stop it, or use
    another --workdir

Multi-host: every process of a job shares one workdir, so only process 0 takes the lock (on
the shared filesystem) and broadcasts the outcome; every process of a refused job then raises
the same error, and none of them touches the workdir. flock works on local disks and NFS
(Linux emulates it with POSIX byte-range locks there); object stores (gs://, s3://) and some
FUSE mounts have no locks at all: give each job its own workdir there.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

LOCK_FILE = ".lock"


class WorkdirBusyError(RuntimeError):
    """Another run holds the workdir."""


class WorkdirError(ValueError):
    """The workdir is no usable directory path: empty, a file, or under a file."""


def checked_workdir(workdir) -> str:
    """The absolute path of `workdir`, or WorkdirError before anything is written: an empty
    path (`--workdir=` would be the current directory), a file, a path under a file."""
    if not isinstance(workdir, (str, os.PathLike)):
        raise TypeError(f"workdir must be a path (str), got {type(workdir).__name__} "
                        f"{workdir!r}")
    text = os.fspath(workdir)
    if not text.strip():
        raise WorkdirError(f"workdir must be a non-empty path, got workdir={text!r} (it would "
                           "be the current directory)")
    path = probe = os.path.abspath(text)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        where = "is a file" if probe == path else f"is under {probe}, which is a file"
        raise WorkdirError(f"workdir {path} {where}, not a directory; pass a directory (it is "
                           "created if missing)")
    return path


def _holder(path: str) -> str:
    try:
        with open(path) as f:
            info = json.load(f)
        return (f"pid {info['pid']} on host {info['host']} since {info['since']} "
                f"({info['command']})")
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


class WorkdirLock:
    """`with WorkdirLock(workdir):` holds the workdir for the run (see the module docstring)."""

    def __init__(self, workdir: str):
        self.workdir = checked_workdir(workdir)
        self.path = os.path.join(self.workdir, LOCK_FILE)
        self._fd: int | None = None

    def _try_lock(self) -> str | None:
        """Takes the lock; None on success, else a message naming the holder."""
        os.makedirs(self.workdir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return (f"workdir {self.workdir} is in use by another run: {_holder(self.path)}; "
                    "wait for it to finish or stop it, or use another --workdir")
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": datetime.datetime.now(datetime.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"),
                "command": " ".join(sys.argv)[:500]}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode())
        os.fsync(fd)
        self._fd = fd
        return None

    def acquire(self) -> WorkdirLock:
        refusal = self._try_lock() if jax.process_index() == 0 else None
        if jax.process_count() > 1:  # every process learns process 0's outcome
            ok = multihost_utils.broadcast_one_to_all(np.int32(refusal is None))
            if not int(ok) and refusal is None:
                refusal = (f"workdir {self.workdir} is in use by another run (process 0 could "
                           f"not lock {self.path})")
        if refusal is not None:
            raise WorkdirBusyError(refusal)
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
