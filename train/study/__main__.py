"""`python -m train.study --config=configs/study.py --workdir=<dir> [--config.key=value ...]`.

Parses flags and calls `train.study.runner.run` (see `train.study` for what it does).
"""

from collections.abc import Sequence

from absl import app, flags, logging
from ml_collections import config_flags

from train import cli, xla_flags
from train.study import runner

config_flags.DEFINE_config_file("config", None, "a study config (configs/study.py)",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "where models, evaluations and the report go")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: Sequence[str]) -> None:
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save and restore at INFO
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments {argv[1:]}")
    runner.run(flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == "__main__":
    xla_flags.apply_cpu_defaults()  # before JAX starts its backend; never over XLA_FLAGS
    app.run(main, flags_parser=cli.parse_flags)  # an unknown key: one line, no traceback
