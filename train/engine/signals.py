"""SIGTERM and Ctrl-C as a request to stop, honoured between jobs.

    with Stop() as stop:
        for job in jobs:
            run(job)
            if stop.asked:
                ...   # the job's result is stored: exit 0, a rerun continues

Inside `with`, SIGTERM and SIGINT set `stop.asked` instead of ending the process; the handlers
that were there before come back on exit. A job that installs its own handler (a training
saves a checkpoint on SIGTERM) keeps it while it runs.
"""

from __future__ import annotations

import signal
from typing import Self

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stop:
    """A context manager whose `asked` turns True at SIGTERM or SIGINT."""

    def __init__(self, signals=SIGNALS):
        self.asked = False
        self._signals = tuple(signals)
        self._old: dict = {}

    def __enter__(self) -> Self:
        for sig in self._signals:
            self._old[sig] = signal.signal(sig, self._ask)
        return self

    def _ask(self, signum, frame) -> None:
        del signum, frame
        self.asked = True

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
