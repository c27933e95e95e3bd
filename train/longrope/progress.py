"""A search's workdir: one atomic JSON state per generation, log.jsonl and TensorBoard events.

    DIR/generations/gen_0000.json ...   the whole state after each generation: the generator's
                                        state, the population, every evaluation, the records
    DIR/log.jsonl                       one record per generation (rewritten from the state)
    DIR/tensorboard/                    longrope/best_ppl, longrope/generation_best_ppl,
                                        longrope/evaluations, longrope/seconds per generation

Each state file is written to a temporary name and renamed (`os.replace`), so a killed search
leaves either the previous generation's file or the new one, never half of one. A resumed
search reads the newest readable file; it must have been made with the same space and the same
hyperparameters (the count of generations may grow), else a ValueError names what differs.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from train.longrope.space import Candidate, Space
from train.tensorboard_log import EventLog

__all__ = ["Store", "read_json", "write_json"]

VERSION = 1


def write_json(path: str, value: Any) -> None:
    """`value` as JSON at `path`, atomically (a temporary file, fsync, then os.replace)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


class Store:
    """The files of one search's workdir (module doc)."""

    def __init__(self, workdir: str, *, space: Space, config):
        self.workdir = workdir
        self.identity = {"version": VERSION, "space": _plain(space.to_json()),
                         "config": config.identity()}
        os.makedirs(os.path.join(workdir, "generations"), exist_ok=True)
        self._events: EventLog | None = None

    def _path(self, generation: int) -> str:
        return os.path.join(self.workdir, "generations", f"gen_{generation:04d}.json")

    def latest(self) -> dict[str, Any] | None:
        """The newest readable state, or None (a fresh workdir)."""
        for path in sorted(glob.glob(os.path.join(self.workdir, "generations", "gen_*.json")),
                           reverse=True):
            try:
                return read_json(path)
            except (OSError, ValueError):
                continue
        return None

    def resume(self, run) -> bool:
        """Fills `run` from the newest state; False for a fresh workdir."""
        state = self.latest()
        if state is None:
            self._open(-1)
            return False
        for key, value in self.identity.items():
            if state.get(key) != value:
                raise ValueError(f"workdir {self.workdir} holds a search with {key}="
                                 f"{state.get(key)!r}; this one has {key}={value!r}: use "
                                 "another workdir or the same settings")
        run.rng.bit_generator.state = state["rng"]
        run.values = {Candidate.from_json(c): float(v) for c, v in state["values"]}
        run.population = [Candidate.from_json(c) for c in state["population"]]
        run.records = list(state["records"])
        run.generation = int(state["generation"])
        run.seconds = float(state["seconds"])
        self._open(run.generation - 1)  # its own events may not have reached the disk: again
        self._write(run.records[-1])
        return True

    def _open(self, generation: int) -> None:
        self._events = EventLog(os.path.join(self.workdir, "tensorboard"),
                                start_step=generation)

    def save(self, run) -> None:
        """The state after `run.generation`, then log.jsonl and the generation's events."""
        state = dict(self.identity, generation=run.generation, seconds=run.seconds,
                     rng=run.rng.bit_generator.state,
                     population=[c.to_json() for c in run.population],
                     values=[[c.to_json(), v] for c, v in run.values.items()],
                     records=run.records)
        write_json(self._path(run.generation), state)
        tmp = os.path.join(self.workdir, "log.jsonl.tmp")
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in run.records)
        os.replace(tmp, os.path.join(self.workdir, "log.jsonl"))
        self._write(run.records[-1])

    def _write(self, record: dict[str, Any]) -> None:
        self._events.write({"step": record["generation"],
                            **{f"longrope/{k}": record[k] for k in (
                                "best_ppl", "generation_best_ppl", "evaluations", "seconds")}})
        self._events.flush()

    def close(self) -> None:
        if self._events is not None:
            self._events.close()


def _plain(value: Any) -> Any:
    """Tuples as lists, as JSON reads them back (so a state compares equal to a fresh one)."""
    return json.loads(json.dumps(value))
