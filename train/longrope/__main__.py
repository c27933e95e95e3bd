"""`python -m train.longrope --checkpoint=PATH --target_length=N --text=FILE_OR_DIR
--workdir=DIR [...]`: see `train.longrope.cli`."""

import sys

from train.longrope import cli

if __name__ == "__main__":
    sys.exit(cli.main())
