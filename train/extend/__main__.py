"""`python -m train.extend --config=configs/extend_smollm2.py --workdir=<dir> [--config.k=v]`.

Calls `train.extend.runner.run` with `posenc_jax.pretrained.load` through the engine's
command line (`train.engine.command`).
"""

import functools

from posenc_jax import pretrained
from train.engine import command
from train.extend import runner

if __name__ == "__main__":
    command.main(functools.partial(runner.run, load=pretrained.load),
                 what="an extension config (configs/extend_*.py)")
