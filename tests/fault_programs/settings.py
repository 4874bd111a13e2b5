"""Settings that differ between ranks, or that one rank cannot read, at ``import sbpmpi``.

    mpiexec -n N python settings.py MODE

The variables are set from the rank (read through mpi4py) before sbpmpi is imported:
``bad_on_last``: ``SBPMPI_TIMEOUT=soon`` on the last rank only (it stopped at import,
the others waited in their first collective); ``check_differs``: ``SBPMPI_CHECK=0`` on
rank 1 only; ``huge_timeout``: ``SBPMPI_TIMEOUT=1e10`` on every rank (accepted, then
the watchdog thread died with OverflowError); ``same``: every rank alike (the job runs).
After the import every rank takes part in a collective, where a hang would show.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

mode = sys.argv[1]
rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
if mode == "bad_on_last" and rank == size - 1:
    os.environ["SBPMPI_TIMEOUT"] = "soon"
elif mode == "check_differs" and rank == 1:
    os.environ["SBPMPI_CHECK"] = "0"
elif mode == "huge_timeout":
    os.environ["SBPMPI_TIMEOUT"] = "1e10"
elif mode == "same":
    os.environ["SBPMPI_CHECK"] = "1"
else:
    assert mode in ("bad_on_last", "check_differs"), mode

try:
    import sbpmpi as sm
except Exception:
    if os.environ.get("SBPMPI_ABORT_ON_ERROR") != "0":
        raise
    # Every rank raises (what the tests count): each prints its traceback, then the ranks
    # meet before exiting, since mpiexec ends the job when the first rank exits with an
    # error, possibly before another rank's traceback is written.
    import traceback

    traceback.print_exc()
    sys.stderr.flush()
    MPI.COMM_WORLD.Barrier()
    sys.exit(1)

x = sm.tensor(np.arange(3.0 * size), placement=sm.placement("cpu", list(range(size))),
              sbp=sm.sbp.split(0))
total = float(x.sum().numpy())
print(f"rank {rank}: imported and reduced {total}" + ("" if mode == "same" else
                                                       " (should not happen)"), flush=True)
