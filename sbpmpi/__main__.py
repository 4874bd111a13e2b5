"""``python -m sbpmpi {info,bench,plot}`` and ``--version``: see :mod:`sbpmpi.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
