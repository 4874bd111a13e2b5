"""Boxing benchmark: sbpmpi conversions vs the raw mpi4py call, in one run.

    mpiexec -n 4 python scripts/bench_boxing.py [--sizes-mib 1,16,64] [--json out.json]

The benchmark lives in ``sbpmpi.tools.bench`` (also reachable from ``python -m sbpmpi``).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from sbpmpi.tools.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
