"""`python -m train --config=configs/<name>.py --workdir=<dir> [--config.key=value ...]`.

Parses flags, starts the multi-host runtime when asked to (see `train.sharding` for launch
recipes), and calls `train.trainer.train_and_evaluate`. Exit status 0 also after a SIGTERM
(the run saved a checkpoint and can be resumed by rerunning the same command).
"""

import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from train import cli, sharding, trainer, xla_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config file (get_config()).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.jsonl.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-host).")
flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host).")
flags.DEFINE_integer("process_id", None, "This process's index (multi-host).")
flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() even when no "
                  "cluster is detected (it then autodetects TPU / SLURM / MPI settings).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not FLAGS["verbosity"].present:  # orbax logs every save at INFO
        logging.set_verbosity(logging.WARNING)
    sharding.initialize_distributed(
        coordinator_address=FLAGS.coordinator_address, num_processes=FLAGS.num_processes,
        process_id=FLAGS.process_id, force=FLAGS.distributed)
    logging.info("JAX process %d/%d, %d local / %d global devices", jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count())
    try:
        result = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    except trainer.USER_ERRORS as err:  # the message says it all: no traceback
        sys.exit(f"error: {type(err).__name__}: {err}")
    if jax.process_index() == 0:
        summary = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in result.items())
        print(f"done: {summary}", flush=True)


if __name__ == "__main__":
    xla_flags.apply_cpu_defaults()  # before JAX starts its backend; never over XLA_FLAGS
    app.run(main, flags_parser=cli.parse_flags)  # an unknown key: one line, no traceback
