"""``python -m sbpmpi.launch`` and ``sm.launch``: the launcher, which lives in
:mod:`sbpmpi.tools.launch` (a tool: the library never imports it)."""

import sys

from .tools.launch import *  # noqa: F403
from .tools.launch import __all__, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
