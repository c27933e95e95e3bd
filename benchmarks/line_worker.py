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

import json
import subprocess

TAG = "@@"  # protocol lines from a worker start with this; everything else is log


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
