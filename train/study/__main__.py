"""`python -m train.study --config=configs/study.py --workdir=<dir> [--config.key=value ...]`.

Calls `train.study.runner.run` (see `train.study` for what it does) through the engine's
command line (`train.engine.command`).
"""

from train.engine import command
from train.study import runner

if __name__ == "__main__":
    command.main(runner.run, what="a study config (configs/study.py)")
