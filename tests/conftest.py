"""Shared fixtures: world info, device types (cuda skips without a GPU), reference helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# Tests never write the user's cost-table cache (~/.cache/sbpmpi); the tests of the cache
# point the setting cost_cache at a temporary file themselves. Set in the environment
# before sbpmpi is imported, so that the programs the tests start get it too.
os.environ.setdefault("SBPMPI_COST_CACHE", "off")

from sbpmpi import backend, config

DEVICE_TYPES = ["cpu", "cuda"]


@pytest.fixture(params=DEVICE_TYPES)
def device_type(request: pytest.FixtureRequest) -> str:
    """'cpu' always; 'cuda' only where CuPy sees a GPU."""
    if request.param == "cuda" and not backend.cupy_available():
        pytest.skip("no CuPy / no GPU")
    return request.param


@pytest.fixture
def shared_dir():
    """A fresh directory that every rank sees (rank 0 creates and removes it)."""
    import shutil
    import tempfile

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    d = tempfile.mkdtemp(prefix="sbpmpi-test-") if comm.Get_rank() == 0 else None
    d = comm.bcast(d, root=0)
    yield d
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD



def op_placements(world_size: int | None = None) -> list:
    """The placements the table-wide op tests try: the whole world, every rank but rank 0
    (a placement that is not the world's), and at 4 ranks a 2x2 mesh."""
    import sbpmpi as sm

    size = sm.env.get_world_size() if world_size is None else world_size
    out = [sm.placement("cpu", list(range(size)))]
    if size > 1:
        out.append(sm.placement("cpu", list(range(1, size))))
    if size == 4:
        out.append(sm.placement("cpu", [[0, 1], [2, 3]]))
    return out

def assert_same_on_all_ranks(value: object) -> None:
    """Fail unless every rank passes an equal ``value``."""
    from mpi4py import MPI

    vals = MPI.COMM_WORLD.allgather(value)
    assert all(v == vals[0] for v in vals), vals


def agree(check) -> None:
    """Run ``check()`` (assertions) on every rank; fail on every rank if one fails, with
    each failing rank's message."""
    from mpi4py import MPI

    try:
        check()
        err = None
    except AssertionError as e:
        err = f"rank {MPI.COMM_WORLD.Get_rank()}: {e}"
    errors = [e for e in MPI.COMM_WORLD.allgather(err) if e]
    assert not errors, "\n".join(errors)


def raised_by(fn) -> tuple[str, str]:
    """(type name, message) of what ``fn`` raised on this rank ("no error" if nothing)."""
    try:
        fn()
    except Exception as e:
        return type(e).__name__, str(e)
    return "no error", ""


def errors_of(fn) -> tuple[str, str]:
    """(type name, message) of what ``fn`` raised ("no error" if nothing), equal on every rank."""
    got = raised_by(fn)
    assert_same_on_all_ranks(got)
    return got


@pytest.fixture(scope="module")
def bad_input_ctx():
    """What the rows of the bad input matrix (bad_input.py) call on: a placement over all
    ranks, a tensor, local shards, checkpoint files."""
    from bad_input import context

    yield from context()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


# ----------------------------------------------------------------------------- comm tests
# One array-backend fixture for every comm test that runs over backends: NumPy, the fake
# CUDA array (host memory behind ``__cuda_array_interface__``; handed to MPI directly when
# the MPI is taken as CUDA-aware, staged through pinned buffers when not), and CuPy where
# CuPy sees a GPU (skipped with the reason otherwise).

ARRAY_BACKENDS = ["numpy", "fake_cuda-aware", "fake_cuda-staged", "cupy-aware", "cupy-staged"]


class ArrayBackend:
    """How a test makes arrays of one backend (``mk``: NumPy -> backend) and reads them back
    (``host``: backend -> NumPy). ``aware`` is the forced CUDA-awareness (None for NumPy)."""

    def __init__(self, name: str, aware: bool | None, mk, host) -> None:
        self.name, self.aware, self.mk, self.host = name, aware, mk, host

    @property
    def is_device(self) -> bool:
        return self.aware is not None

    def zeros(self, shape, dtype=np.float64):
        return self.mk(np.zeros(shape, dtype))

    def __repr__(self) -> str:
        return f"ArrayBackend({self.name})"


@pytest.fixture(params=ARRAY_BACKENDS)
def array_backend(request: pytest.FixtureRequest):
    """The comm tests' one array-backend fixture (see ARRAY_BACKENDS)."""

    kind, _, mode = request.param.partition("-")
    if kind == "numpy":
        yield ArrayBackend("numpy", None, lambda a: np.array(a, copy=True), np.asarray)
        return
    aware = mode == "aware"
    if kind == "fake_cuda":
        from fake_cuda import FakeCudaArray

        be = ArrayBackend(request.param, aware, FakeCudaArray.from_numpy, lambda a: a.get())
    else:
        if not backend.cupy_available():
            pytest.skip("no CuPy / no GPU")
        if aware:
            from sbpmpi.comm import cuda_aware

            # what the MPI library itself reports: SBPMPI_CUDA_AWARE=1 or
            # SBPMPI_GPU_TRANSPORT=mpi in the environment must not send device pointers
            # to an MPI that is not CUDA-aware
            lib = cuda_aware.detect_library()
            if not lib.aware:
                pytest.skip(f"the MPI library is not CUDA-aware ({lib.reason}): handing it "
                            "device pointers would crash; the staged case covers this MPI")
        import cupy as cp

        backend.bind_device()
        be = ArrayBackend(request.param, aware, cp.asarray, cp.asnumpy)
    with config.override(cuda_aware=aware):
        yield be


@pytest.fixture
def chk():
    """A comm_helpers.Checker: comparisons collected, raised on every rank at teardown."""
    from comm_helpers import checker

    yield from checker()


ROOT = Path(__file__).resolve().parent.parent


def run_program(n: int, *args, timeout: float = 240) -> str:
    """``python ARGS`` under ``mpiexec -n n`` (a job of its own, from the repository root);
    its standard output, asserting that it exited 0."""
    from sbpmpi.launch import find_mpiexec

    env = dict(os.environ, MPIEXEC_TIMEOUT=str(int(timeout) - 20), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    r = subprocess.run([find_mpiexec().path, "-n", str(n), sys.executable, *map(str, args)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout
