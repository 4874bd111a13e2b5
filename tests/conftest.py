"""Shared fixtures: world info, device types (cuda skips without a GPU), reference helpers."""

from __future__ import annotations

import os

import numpy as np
import pytest

# Tests never write the user's cost-table cache (~/.cache/sbpmpi); the tests of the cache
# point SBPMPI_COST_CACHE at a temporary file themselves.
os.environ.setdefault("SBPMPI_COST_CACHE", "off")

from sbpmpi import backend

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


def assert_same_on_all_ranks(value: object) -> None:
    """Fail unless every rank passes an equal ``value``."""
    from mpi4py import MPI

    vals = MPI.COMM_WORLD.allgather(value)
    assert all(v == vals[0] for v in vals), vals


def errors_of(fn) -> tuple[str, str]:
    """(type name, message) of what ``fn`` raised ("no error" if nothing), equal on every rank."""
    try:
        fn()
    except Exception as e:
        got = (type(e).__name__, str(e))
    else:
        got = ("no error", "")
    assert_same_on_all_ranks(got)
    return got


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
