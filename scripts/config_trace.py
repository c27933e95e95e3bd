"""Follows the study's config from `train.study.runner.run` through the calls, up to the
first job: the stops (calls of this repository's functions that receive the config, one of
its blocks, or an object holding it: the plan, a context), the files they are in, and the
returns to a file already left.

    python scripts/config_trace.py [--repo=DIR]     # DIR: a checkout (default: this one)

Trainings are stubbed to stop the run at the first job; the tiny study (configs/study_tiny.py)
builds its corpus in a temporary folder. Prints one JSON line: stops, files, returns and the
stops in order (file:function). Used for issue 29's before / after figures.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
import tempfile


class _First(Exception):
    """Raised by the stubbed training: the first job was reached."""


def _blocks(config) -> set[int]:
    out, todo = set(), [config]
    while todo:
        node = todo.pop()
        out.add(id(node))
        todo += [v for v in (node.values() if hasattr(node, "values") else ())
                 if hasattr(v, "to_dict")]
    return out


def _holds(value, ids: set[int]) -> bool:
    """The value is the config or a block of it, or holds one as `.config` / `.plan.config`."""
    if id(value) in ids:
        return True
    try:
        inner = getattr(value, "config", None)
        outer = getattr(getattr(value, "plan", None), "config", None)
    except Exception:  # noqa: BLE001 -- a property that cannot be read holds nothing
        return False
    return id(inner) in ids or id(outer) in ids


def main(argv: list[str]) -> int:
    repo = next((a.split("=", 1)[1] for a in argv if a.startswith("--repo=")), os.getcwd())
    repo = os.path.abspath(repo)
    sys.path.insert(0, repo)
    spec = importlib.util.spec_from_file_location("study_tiny",
                                                  os.path.join(repo, "configs", "study_tiny.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # imported from --repo (sys.path above), so by name at run time
    trainer = importlib.import_module("train.trainer")
    runner = importlib.import_module("train.study.runner")

    def first(*args, **kwargs):
        raise _First

    trainer.train_and_evaluate = first
    config = module.get_config()
    config.train.dataset.data_dir = tempfile.mkdtemp()
    ids, stops = _blocks(config), []

    def profile(frame, event, arg):
        if event != "call":
            return
        path = frame.f_code.co_filename
        if not path.startswith(repo) or "/.venv/" in path or path.endswith("config_trace.py"):
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if any(_holds(frame.f_locals.get(n), ids) for n in names):
            stops.append(f"{os.path.relpath(path, repo)}:{code.co_name}")

    sys.setprofile(profile)
    try:
        runner.run(config, tempfile.mkdtemp(), progress=False)
    except _First:
        pass
    finally:
        sys.setprofile(None)
    files = [s.split(":")[0] for s in stops]
    left, returns = set(), 0
    for prev, here in itertools.pairwise(files):
        if here != prev:
            left.add(prev)
            returns += here in left
    print(json.dumps({"stops": len(stops), "files": len(set(files)), "returns": returns,
                      "path": stops}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
