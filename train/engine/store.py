"""The result store: one atomic JSON file per finished job, and `timings.json`.

    store = Store(workdir, folder)      <workdir>/<folder>/<job name>.json
    store.get(job)                      the stored result if it has job.fingerprint, else None
    store.put(job, result)              writes it (with the fingerprint), atomically
    fingerprint(value)                  a short hash of a JSON-able value: what a job depends on
    read_json(path), write_json(path, value), write_text(path, text)
    read_timings(path), append_timing(path, record) -> every invocation's record

Every write goes to a temporary file first, then `os.replace`: a killed run never leaves a
half-written file that a rerun would trust. A result whose fingerprint differs from its job's
(the config changed what the job depends on) is not a result: the job runs again.

timings.json is {"version": 2, "invocations": [...]}; a bare list of records (what the
extension study wrote before the engine) is read as the invocations it holds.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from typing import Any

TIMINGS = "timings.json"
TIMINGS_VERSION = 2


def fingerprint(value: Any) -> str:
    """A short hash of a JSON-able value (keys sorted)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_json(path: str) -> Any:
    """The JSON value in `path`, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_text(path: str, text: str) -> None:
    """Writes `text` to `path` atomically (a temporary file, then `os.replace`)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path: str, value: Any) -> None:
    write_text(path, json.dumps(value, indent=1, sort_keys=True, default=str))


class Store:
    """The finished jobs of one workdir, one file each under <root>/<folder>/."""

    def __init__(self, root: str, folder: str):
        self.root, self.folder = root, os.path.join(root, folder)

    def path(self, job) -> str:
        return os.path.join(self.folder, f"{job.name}.json")

    def get(self, job) -> dict | None:
        row = read_json(self.path(job))
        return row if isinstance(row, dict) and row.get("fingerprint") == job.fingerprint \
            else None

    def put(self, job, result: dict) -> dict:
        os.makedirs(self.folder, exist_ok=True)
        row = {**result, "fingerprint": job.fingerprint}
        write_json(self.path(job), row)
        return row

    def found(self, jobs: Iterable) -> dict:
        """{job: result} of the jobs that have a stored result with their fingerprint."""
        found = {job: self.get(job) for job in jobs}
        return {job: row for job, row in found.items() if row is not None}


def read_timings(path: str) -> list[dict]:
    """The invocation records of a timings.json (either format; [] when there is none)."""
    value = read_json(path)
    if isinstance(value, list):
        return value
    return list(value.get("invocations", [])) if isinstance(value, dict) else []


def append_timing(path: str, record: dict) -> list[dict]:
    """Appends one invocation's record to timings.json; returns all of them."""
    timings = read_timings(path) + [dict(record)]
    write_json(path, {"version": TIMINGS_VERSION, "invocations": timings})
    return timings
