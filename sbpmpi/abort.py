"""``python -m sbpmpi.abort prog.py ARGS``: run a program so that an uncaught exception or
``sys.exit(n != 0)`` on one rank ends the job. The mechanism is :mod:`sbpmpi.comm.lifecycle.abort`."""

from .comm.lifecycle.abort import *  # noqa: F403
from .comm.lifecycle.abort import __all__, main  # noqa: F401

if __name__ == "__main__":
    main()
