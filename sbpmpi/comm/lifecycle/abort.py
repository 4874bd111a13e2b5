"""Abort, not hang: an uncaught exception on any rank ends the whole MPI job.

Without this, a rank that dies leaves the others blocked in their next collective
until the allocation runs out. :func:`install` sets ``sys.excepthook`` and
``threading.excepthook`` so that an uncaught exception prints
``sbpmpi: rank R: uncaught <Type>: <message>`` and the traceback to stderr, then
calls ``MPI_Abort`` on the world, as ``python -m mpi4py`` does.

It is on by default when the world has more than one process and off for a
single process; the setting :data:`sbpmpi.config.abort_on_error`
(``SBPMPI_ABORT_ON_ERROR=0`` / ``1``) turns it off or forces it on.

Once a rank has decided to abort, it cannot exit 0: the abort pauses a quarter second
before ``MPI_Abort`` so that its message reaches the launcher, and meanwhile the main
thread may reach the end of the program. The exit path (:func:`wait_if_aborting`, an
``atexit`` handler and the first step of the exit-time agreement) waits for the abort
instead of finalizing, and ends the process with the abort's exit code if ``MPI_Abort``
does not.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, NoReturn

from ... import config

__all__ = ["enabled", "install", "uninstall", "installed", "abort", "aborting",
           "wait_if_aborting", "format_report", "main"]

_PAUSE = 0.25  # seconds the launcher's output forwarder gets before MPI_Abort


@dataclass
class AbortState:
    """This process's abort: whether a thread decided to abort and with which code, and the
    hooks :func:`install` replaced."""

    aborting: bool = False
    code: int = 1  # the exit code of the abort under way
    prev_sys_hook: Any = None
    prev_thread_hook: Any = None
    exit_hook: bool = False  # wait_if_aborting is registered with atexit
    lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self, code: int) -> bool:
        """True for the first thread to abort (which sets the code), False after."""
        with self.lock:
            first = not self.aborting
            if first:  # set before anything else: the exit path now waits for this abort
                self.aborting, self.code = True, code
        return first


STATE = AbortState()


def _world() -> tuple[int, int]:
    """(rank, size) of the world, or (0, 1) when MPI is not usable (finalized)."""
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized():
        return 0, 1
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def enabled(world_size: int | None = None) -> bool:
    """Whether uncaught exceptions should abort the job.

    The setting ``abort_on_error`` decides when set (``SBPMPI_ABORT_ON_ERROR=0``/``1``);
    otherwise on exactly when ``world_size`` (default: the world's) is more than 1.
    """
    on = config.abort_on_error.value
    if on is not None:
        return on
    if world_size is None:
        world_size = _world()[1]
    return world_size > 1


def format_report(kind: str, exc_type: type[BaseException] | None, exc: BaseException | None,
                  tb: TracebackType | None, rank: int, size: int) -> str:
    """The text printed before aborting: the rank, the cause, the traceback."""
    name = getattr(exc_type, "__qualname__", str(exc_type))
    text = str(exc)
    first = text.split("\n", 1)[0] + (" [...]" if "\n" in text else "")  # all of it is below
    head = f"sbpmpi: rank {rank}: {kind} {name}: {first}\n"
    body = "".join(traceback.format_exception(exc_type, exc, tb)) if exc_type else ""
    tail = (f"sbpmpi: rank {rank}: aborting all {size} ranks (MPI_Abort); set "
            f"{config.abort_on_error.env}=0 "
            f"to let ranks exit on their own\n")
    return head + body + tail


def abort(message: str, code: int = 1) -> NoReturn:
    """Write ``message`` to stderr and abort every rank of the job with exit ``code``.

    Falls back to ``os._exit(code)`` if ``MPI_Abort`` returns (MPI not usable), which the
    launcher also treats as a failed job.
    """
    if STATE.claim(code):
        try:
            sys.stderr.write(message if message.endswith("\n") else message + "\n")
            sys.stderr.flush()
            sys.stdout.flush()
        except Exception:
            pass
        _announce(message)
        # give the launcher's output forwarder a moment: MPI_Abort tears the job down at
        # once, and a message still in its pipe would be lost
        time.sleep(_PAUSE)
    try:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.COMM_WORLD.Abort(code)
    finally:
        os._exit(code)


#: Called with the cause before ``MPI_Abort`` (the exit agreement registers the notice
#: that tells the other ranks: :func:`.exit_agreement.announce_abort`).
ANNOUNCERS: list[Callable[[str], None]] = []


def _announce(message: str) -> None:
    """Hand the cause (the message's first line, without its ``sbpmpi: rank R:``) to the
    :data:`ANNOUNCERS`: ``MPI_Abort`` would otherwise end a rank blocked in a receive
    without a word."""
    first = message.split("\n", 1)[0]
    head = f"sbpmpi: rank {_world()[0]}: "
    cause = first[len(head):] if first.startswith(head) else first
    for announce in ANNOUNCERS:
        try:
            announce(cause)
        except Exception:  # noqa: BLE001 - the abort goes on whatever the notice does
            pass


def aborting() -> bool:
    """True once a thread of this process has decided to abort the job."""
    return STATE.aborting


def wait_if_aborting() -> None:
    """On the exit path: if a thread of this process is aborting the job, wait for it
    instead of going on to exit (with code 0, as a batch system would record it); if the
    abort has not ended the process a few seconds later, exit with its code."""
    if not STATE.aborting:
        return
    deadline = time.monotonic() + _PAUSE + 5.0
    while time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(STATE.code)


def _interactive() -> bool:
    return hasattr(sys, "ps1") or bool(sys.flags.interactive)


def _sys_hook(exc_type: type[BaseException], exc: BaseException,
              tb: TracebackType | None) -> None:
    if _interactive():
        (STATE.prev_sys_hook or sys.__excepthook__)(exc_type, exc, tb)
        return
    rank, size = _world()
    abort(format_report("uncaught", exc_type, exc, tb, rank, size), 1)


def _thread_hook(args: Any) -> None:
    if args.exc_type is SystemExit:
        (STATE.prev_thread_hook or threading.__excepthook__)(args)
        return
    rank, size = _world()
    name = getattr(args.thread, "name", "?")
    abort(format_report(f"uncaught in thread {name!r}:", args.exc_type, args.exc_value,
                        args.exc_traceback, rank, size), 1)


def install(force: bool | None = None) -> bool:
    """Install the abort hooks when :func:`enabled` (or ``force``) says so; return whether on.

    Idempotent. Called by ``import sbpmpi``.
    """
    on = enabled() if force is None else bool(force)
    if not on:
        return False
    if not STATE.exit_hook:  # atexit runs it before mpi4py finalizes MPI
        atexit.register(wait_if_aborting)
        STATE.exit_hook = True
    if sys.excepthook is not _sys_hook:
        STATE.prev_sys_hook = sys.excepthook
        sys.excepthook = _sys_hook
    if threading.excepthook is not _thread_hook:
        STATE.prev_thread_hook = threading.excepthook
        threading.excepthook = _thread_hook
    return True


def uninstall() -> None:
    """Restore the hooks that :func:`install` replaced."""
    if sys.excepthook is _sys_hook:
        sys.excepthook = STATE.prev_sys_hook or sys.__excepthook__
    if threading.excepthook is _thread_hook:
        threading.excepthook = STATE.prev_thread_hook or threading.__excepthook__
    STATE.prev_sys_hook = STATE.prev_thread_hook = None


def installed() -> bool:
    """True while the abort hooks are in place."""
    return sys.excepthook is _sys_hook


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m sbpmpi.abort (prog.py | -m module | -c code) ARGS``: run the program so
    that any failure on any rank aborts the job.

    Besides uncaught exceptions this also aborts on ``sys.exit(n)`` with ``n != 0``,
    which the hooks cannot see. The program runs through ``mpi4py.run.run_command_line``
    (the runner of ``python -m mpi4py``), so ``-m``, ``-c`` and ``-`` (stdin) work as
    there; this adds the ``sbpmpi: rank R: ...`` report before ``MPI_Abort``.
    """
    from mpi4py.run import run_command_line

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or (args[0] in ("-m", "-c") and len(args) < 2):
        print("usage: python -m sbpmpi.abort prog.py [args...]\n"
              "   or: python -m sbpmpi.abort -m module [args...]\n"
              "   or: python -m sbpmpi.abort -c code [args...]", file=sys.stderr)
        raise SystemExit(0 if args[:1] in (["-h"], ["--help"]) else 2)
    install(force=None if config.abort_on_error.value is not None else True)
    try:
        run_command_line(args)
    except SystemExit as e:
        code = e.code
        if code is None or code == 0:
            raise
        if not installed():
            raise
        rank, size = _world()
        abort(f"sbpmpi: rank {rank}: exited with sys.exit({code!r})\n"
              f"sbpmpi: rank {rank}: aborting all {size} ranks (MPI_Abort)",
              code if isinstance(code, int) else 1)
    except BaseException:
        if not installed():
            raise
        exc_type, exc, tb = sys.exc_info()
        rank, size = _world()
        assert exc_type is not None
        abort(format_report("uncaught", exc_type, exc, tb, rank, size), 1)


if __name__ == "__main__":
    main()
