"""sm.save_state / sm.load_state with verbose=True: rank 0 reports each tensor on stderr
(a line each here: stderr is not a terminal), the other ranks stay quiet, and the state
round-trips as without it."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import checkpoint
from sbpmpi.checkpoint.progress import Progress

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


@pytest.fixture
def shared_dir(tmp_path):
    """Rank 0's tmp_path, which every rank of this one-host job sees."""
    return comm.bcast(str(tmp_path), root=0)


def state():
    pl = sm.placement("cpu", list(range(size)))
    a = np.arange(6 * 5, dtype=np.float32).reshape(6, 5)
    b = np.arange(7, dtype=np.int64)
    return ({"w.a": sm.tensor(a, placement=pl, sbp=sm.sbp.split(0)),
             "b": sm.tensor(b, placement=pl, sbp=sm.sbp.broadcast)}, {"w.a": a, "b": b})


@pytest.mark.mpi(min_size=1)
def test_verbose_reports_each_tensor_on_rank_0(shared_dir, capfd):
    tensors, ref = state()
    checkpoint.save_state(tensors, shared_dir, verbose=True)
    loaded = checkpoint.load_state(shared_dir, verbose=True)
    sys.stderr.flush()
    err = capfd.readouterr().err
    for name, value in ref.items():
        np.testing.assert_array_equal(loaded[name].numpy(), value)
    lines = [ln for ln in err.splitlines() if ln.startswith("sm.")]
    if rank != 0:
        assert lines == []
        return
    saves = [ln for ln in lines if ln.startswith("sm.save_state")]
    loads = [ln for ln in lines if ln.startswith("sm.load_state")]
    assert saves[0].endswith("2 tensor(s), 176 B")  # 6*5*4 + 7*8 bytes
    assert "[1/2] 'w.a' (6, 5) float32 120 B in " in saves[1]
    assert "[2/2] 'b' (7,) int64 56 B in " in saves[2]
    assert saves[3].startswith(f"sm.save_state {shared_dir}: done in ")
    assert len(saves) == 4 and len(loads) == 4
    assert "[1/2] 'w.a' (6, 5) float32" in loads[1] and "[2/2] 'b' (7,) int64" in loads[2]


@pytest.mark.mpi(min_size=1)
def test_quiet_by_default_and_verbose_is_checked(shared_dir, capfd):
    tensors, _ = state()
    checkpoint.save_state(tensors, shared_dir)
    checkpoint.load_state(shared_dir)
    assert "sm.save_state" not in capfd.readouterr().err
    with pytest.raises(TypeError, match="verbose must be True or False, got 'yes'"):
        checkpoint.save_state(tensors, shared_dir, verbose="yes")
    with pytest.raises(TypeError, match="verbose must be True or False, got 1"):
        checkpoint.load_state(shared_dir, verbose=1)


def test_progress_bar_when_stderr_is_a_terminal(monkeypatch):
    """With tqdm and a terminal, one bar counts the bytes and names the tensor."""
    tqdm = pytest.importorskip("tqdm")
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True
    out = Tty()
    monkeypatch.setattr(sys, "stderr", out)
    p = Progress("sm.save_state d", 1000, 2, True)
    assert isinstance(p.bar, tqdm.tqdm)
    p.tensor("a", (100,), np.dtype(np.float32), 0.1)
    p.tensor("b", (150,), np.dtype(np.float32), 0.1)
    assert p.bar.n == 1000
    p.close()
    assert "sm.save_state d" in out.getvalue()


@pytest.mark.mpi(min_size=1)
def test_a_closed_stderr_on_rank_0_does_not_fail_the_save(shared_dir, monkeypatch):
    """Rank 0 alone writes the report: a write that fails there (stderr closed) must not
    fail rank 0 alone inside a collective save, where the other ranks would wait for it.
    The save and the load go on, quietly, and the state round-trips."""
    import io

    tensors, ref = state()
    if rank == 0:
        closed = io.StringIO()
        closed.close()
        monkeypatch.setattr(sys, "stderr", closed)
    checkpoint.save_state(tensors, shared_dir, verbose=True)
    loaded = checkpoint.load_state(shared_dir, verbose=True)
    monkeypatch.undo()
    for name, value in ref.items():
        np.testing.assert_array_equal(loaded[name].numpy(), value)
