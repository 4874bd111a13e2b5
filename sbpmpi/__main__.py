"""``python -m sbpmpi {info,bench,plot}`` and ``--version``: see :mod:`sbpmpi.tools.cli`."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
