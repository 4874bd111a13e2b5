"""The process environment: world rank and size, local rank, launcher variables.

``sm.env`` is the public face of :mod:`sbpmpi.comm.world`, which asks MPI; its functions
(:func:`get_rank`, :func:`get_world_size`, :func:`get_local_rank`,
:func:`get_local_world_size`, :func:`set_launcher_env`, :func:`lone_task_warning`,
:func:`expect_world`, :func:`ranks_hint`) are
looked up there on first use, so that this module imports nothing of ``comm`` at load
time (``comm`` reads :func:`switch` from here). A script run without ``mpiexec`` is a
world of size 1.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and readers; at run time __getattr__ looks them up
    from .comm.world import (
        expect_world,
        get_local_rank,
        get_local_world_size,
        get_rank,
        get_world_size,
        lone_task_warning,
        ranks_hint,
        set_launcher_env,
    )

__all__ = [
    "get_rank",
    "get_world_size",
    "get_local_rank",
    "get_local_world_size",
    "set_launcher_env",
    "lone_task_warning",
    "expect_world",
    "ranks_hint",
    "switch",
]

#: Public names of this module that live in :mod:`sbpmpi.comm.world`.
_FROM_WORLD = ("get_rank", "get_world_size", "get_local_rank", "get_local_world_size",
               "set_launcher_env", "lone_task_warning", "expect_world", "ranks_hint")

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def switch(value: str | None) -> bool | None:
    """An environment switch's value: True for 1/true/yes/on, False for 0/false/no/off
    (any case, surrounding spaces ignored), None when unset or anything else (each caller
    decides what that means: its default, an error, another reading)."""
    if value is None:
        return None
    value = value.strip().lower()
    return True if value in _ON else False if value in _OFF else None


def __getattr__(name: str) -> Any:
    if name in _FROM_WORLD:
        value = getattr(importlib.import_module("sbpmpi.comm.world"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sbpmpi.env' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
