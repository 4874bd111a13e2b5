"""Inside each rank the launcher starts: the launcher variables, then the program.

``python -m sbpmpi.launch --bootstrap prog.py ...`` is what :func:`sbpmpi.tools.command.build_command`
puts after ``python`` on every rank: :func:`bootstrap` sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, runs the program
as ``__main__`` and aborts the job when it fails on any rank.
"""

from __future__ import annotations

import os
import runpy
import traceback
from collections.abc import Sequence
from types import TracebackType

__all__ = ["bootstrap"]


def _set_rendezvous() -> dict[str, str]:
    """``MASTER_ADDR`` / ``MASTER_PORT`` from rank 0 unless already set (collective)."""
    import socket

    from .. import comm

    mine = None
    if comm.WORLD.rank == 0:
        addr = os.environ.get("MASTER_ADDR") or socket.gethostname()
        port = os.environ.get("MASTER_PORT")
        if not port:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))
                port = str(s.getsockname()[1])
        mine = (addr, port)
    addr, port = comm.broadcast_object(mine, src=0)
    values = {"MASTER_ADDR": str(addr), "MASTER_PORT": str(port)}
    os.environ.update(values)
    return values


def bootstrap(argv: Sequence[str]) -> None:
    """Set the launcher variables from MPI, then run ``argv`` (``prog.py args``,
    ``-m module args`` or ``-c code args``) as ``__main__``; abort the job if it fails on
    any rank.

    The program runs through ``mpi4py.run.run_command_line``, the runner behind
    ``python -m mpi4py``; this adds the launcher variables and the per-rank report.
    """
    from mpi4py.run import run_command_line

    from ..comm.lifecycle import world

    argv = list(argv)
    if not argv or (argv[0] in ("-m", "-c") and len(argv) < 2):
        raise SystemExit("sbpmpi.launch --bootstrap: no program given")
    world.set_launcher_env()
    _set_rendezvous()
    try:
        run_command_line(argv)
    except SystemExit as e:
        if e.code in (None, 0):
            raise
        code = e.code if isinstance(e.code, int) else 1
        _fail(f"exited with sys.exit({e.code!r})", None, code)
        raise
    except BaseException as e:
        _fail("uncaught", e, 130 if isinstance(e, KeyboardInterrupt) else 1)
        raise


def _user_traceback(e: BaseException) -> TracebackType | None:
    """``e``'s traceback without the launcher's and runpy's own frames."""
    tb = e.__traceback__
    skip = (os.path.abspath(__file__), "<frozen runpy>", os.path.abspath(runpy.__file__ or ""))
    while tb is not None and (tb.tb_frame.f_code.co_filename in skip
                              or tb.tb_frame.f_code.co_filename.endswith(
                                  ("runpy.py", os.path.join("mpi4py", "run.py")))):
        tb = tb.tb_next
    return tb


def _fail(kind: str, e: BaseException | None, code: int) -> None:
    """Report a failed rank and abort the job (unless ``SBPMPI_ABORT_ON_ERROR=0``)."""
    from mpi4py import MPI

    up = MPI.Is_initialized() and not MPI.Is_finalized()
    rank, size = (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()) if up else (0, 1)
    if size <= 1:
        return  # nobody to wait for: Python reports the error and exits
    from ..comm.lifecycle import abort as _abort

    if not _abort.enabled(size):
        return
    if e is None:
        msg = f"sbpmpi: rank {rank}: {kind}\n"
    else:
        msg = (f"sbpmpi: rank {rank}: {kind} {type(e).__qualname__}: {e}\n"
               + "".join(traceback.format_exception(type(e), e, _user_traceback(e))))
    msg += f"sbpmpi: rank {rank}: aborting all {size} ranks (MPI_Abort)\n"
    _abort.abort(msg, code)
