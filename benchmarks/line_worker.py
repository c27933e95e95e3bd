"""A benchmark's worker process in another interpreter (PyTorch, transformers: the bench extra
or a throwaway venv), spoken to one line at a time.

    worker = LineWorker([python, script, "--torch_worker", ...], name="torch worker")
    worker.info                  # the worker's first JSON line (its versions)
    worker.ask("8192 0")         # one request line in, one JSON answer out
    worker.close()

The worker prints `TAG + json.dumps(...)` for each answer; any other line it prints is its log,
echoed here with the worker's name. The worker side imports nothing from here but `TAG`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

TAG = "@@"  # protocol lines from a worker start with this; everything else is log


def add_worker_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every benchmark with a torch worker takes: --torch_threads, --torch_python,
    --json, and the hidden --torch_worker (the same file started as the worker)."""
    parser.add_argument("--torch_threads", type=int, default=os.cpu_count())
    parser.add_argument("--torch_python", default=sys.executable)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--torch_worker", action="store_true", help=argparse.SUPPRESS)


class LineWorker:
    """A started worker: `info` (its first answer), `ask(line)`, `close()`."""

    def __init__(self, cmd: list[str], *, name: str = "torch worker", env: dict | None = None):
        self.name = name
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1, env=env)
        self.info = self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(TAG):
                return json.loads(line[len(TAG):])
            print(f"  {self.name}:", line.rstrip(), flush=True)
        raise RuntimeError(f"the {self.name} exited (code {self.proc.wait()})")

    def ask(self, line: str) -> dict:
        """Sends one request line; returns the worker's JSON answer."""
        self.proc.stdin.write(line.rstrip("\n") + "\n")
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
