"""A study's command line: `python -m train.<study> --config=<file> --workdir=<dir>
[--config.key=value ...]`, written once for every study.

    if __name__ == "__main__":
        command.main(run, what="a study config (configs/study.py)")

`main` sets this machine's XLA defaults before JAX starts (`train.xla_flags`; never over
XLA_FLAGS), defines the two flags, and calls `run(config, workdir)`. A config key that does not
exist or a value of the wrong type is one line on stderr, no traceback (`train.cli`). Defining
the flags here, not at import, keeps importing a study's `__main__` free of side effects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags

from train import cli, xla_flags


def main(run: Callable[[Any, str], Any], *, what: str) -> None:
    """Parses the flags and calls `run(config, workdir)` (see the module docstring)."""
    xla_flags.apply_cpu_defaults()  # before JAX starts its backend; never over XLA_FLAGS
    config_flags.DEFINE_config_file("config", None, what, lock_config=True)
    flags.DEFINE_string("workdir", None, "where the results, the report and its files go")
    flags.mark_flags_as_required(["config", "workdir"])

    def start(argv: Sequence[str]) -> None:
        if not flags.FLAGS["verbosity"].present:
            logging.set_verbosity(logging.WARNING)  # orbax logs every save and restore at INFO
        if len(argv) > 1:
            raise ValueError(f"unexpected arguments {argv[1:]}")
        run(flags.FLAGS.config, flags.FLAGS.workdir)

    app.run(start, flags_parser=cli.parse_flags)
