"""`python -m train.extend --config=configs/extend_smollm2.py --workdir=<dir> [--config.k=v]`.

Parses flags and calls `train.extend.runner.run` with `posenc_jax.pretrained.load`.
"""

from collections.abc import Sequence

from absl import app, flags, logging
from ml_collections import config_flags

from posenc_jax import pretrained
from train import cli, xla_flags
from train.extend import runner

config_flags.DEFINE_config_file("config", None, "an extension config (configs/extend_*.py)",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "where results, report.md, CSVs and figures go")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: Sequence[str]) -> None:
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments {argv[1:]}")
    runner.run(flags.FLAGS.config, flags.FLAGS.workdir, load=pretrained.load)


if __name__ == "__main__":
    xla_flags.apply_cpu_defaults()  # before JAX starts its backend; never over XLA_FLAGS
    app.run(main, flags_parser=cli.parse_flags)  # an unknown key: one line, no traceback
