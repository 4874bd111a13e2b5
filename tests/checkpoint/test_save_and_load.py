"""Checkpoints: sm.save / sm.load / sm.save_state / sm.load_state against NumPy.

MPI tests (n = 1..4) round-trip every SBP and placement and check the files with
numpy.load; serial tests run the cross-size cases (save on 4 ranks, load on 2 and 1)
and the crash cases under their own mpiexec. Bad arguments are the bad input matrix's
rows for checkpoints (bad_input.py).
"""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest
from bad_input import Row, check_row
from conftest import errors_of
from fault_programs.runner import mpiexec, run_mpi
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import backend, checkpoint
from sbpmpi.comm import file_io
from sbpmpi.core.layout import Layout
from sbpmpi.errors import CheckpointError

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def placements(device_type):
    out = [sm.placement(device_type, list(range(size)))]
    if size > 1:
        out.append(sm.placement(device_type, list(range(1, size))[::-1]))
    if size == 4:
        out.append(sm.placement(device_type, [[0, 1], [2, 3]]))
        out.append(sm.placement(device_type, [[3, 1], [2, 0]]))
    return out


def all_sbps(pl, ndim, partial=True):
    one = [sm.sbp.broadcast] + [sm.sbp.split(d) for d in range(ndim)]
    if partial:
        one += [sm.sbp.partial_sum, sm.sbp.partial_max]
    return list(itertools.product(one, repeat=pl.ndim))


def on_root(fn, *args):
    """Run ``fn`` on rank 0 only (file surgery), then barrier."""
    if rank == 0:
        fn(*args)
    comm.Barrier()


# -- MPI round trips -----------------------------------------------------------------------------

def check_local(y, value, pl, nd):
    """This rank's shard of ``y`` is the right slice of ``value`` (or the partial identity)."""
    lay = Layout.make(value.shape, pl, nd)
    assert y.layout == lay and y.dtype == value.dtype
    local = y.to_local()
    assert tuple(local.shape) == lay.local_shape(rank) and local.flags.c_contiguous
    op = lay.identity_op(rank)
    if rank not in pl:
        assert local.size == 0
    elif op is None:
        np.testing.assert_array_equal(backend.asnumpy(local), value[lay.local_slice(rank)],
                                      err_msg=f"{pl} {nd}")
    else:  # partial non-holder: the reduction's identity
        ident = {"sum": 0.0, "max": -np.inf, "min": np.inf}[op]
        assert (backend.asnumpy(local) == ident).all(), f"{pl} {nd}"


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", [(5, 7), (3,), (), (0, 3), (2, 3, 4)])
def test_round_trip_every_sbp_and_placement(device_type, shared_dir, shape):
    """Save from every layout (numpy.load checks the file), load into every layout."""
    rng = np.random.default_rng(11)
    value = rng.integers(-50, 50, size=shape).astype(np.float64)
    path = os.path.join(shared_dir, "x.npy")
    pls = placements(device_type)
    if len(shape) != 2:  # fewer placements for the other shapes: keeps the test short
        pls = list(dict.fromkeys([pls[0], pls[-1]]))
    for pl in pls:
        for nd in all_sbps(pl, len(shape)):
            checkpoint.save(sm.tensor(value, placement=pl, sbp=nd), path)
            if rank == 0:
                np.testing.assert_array_equal(np.load(path), value, err_msg=f"{pl} {nd}")
            comm.Barrier()
    for pl in pls:
        for nd in all_sbps(pl, len(shape)):
            check_local(checkpoint.load(path, placement=pl, sbp=nd), value, pl, nd)
    # the whole value once per placement, through boxing
    y = checkpoint.load(path, placement=pls[-1], sbp=all_sbps(pls[-1], len(shape))[-1])
    np.testing.assert_array_equal(y.numpy(), value)


@pytest.mark.mpi(min_size=1)
def test_save_partial_0d(shared_dir):
    """A 0-d partial tensor is reduced by boxing before the write (P -> B)."""
    pl = sm.placement("cpu", list(range(size)))
    for op in ("sum", "max", "min"):
        x = sm.tensor(np.array(-2.5), placement=pl, sbp=sm.sbp.Partial(op))
        path = os.path.join(shared_dir, f"{op}.npy")
        checkpoint.save(x, path)
        if rank == 0:
            np.testing.assert_array_equal(np.load(path), np.array(-2.5))
        y = checkpoint.load(path, placement=pl, sbp=sm.sbp.Partial(op))
        np.testing.assert_array_equal(y.numpy(), np.array(-2.5))


@pytest.mark.mpi(min_size=1)
def test_dtypes_and_foreign_npy_files(shared_dir):
    pl = sm.placement("cpu", list(range(size)))
    rng = np.random.default_rng(5)
    values = {
        "f32": rng.standard_normal((4, 3)).astype(np.float32),
        "i8": rng.integers(-100, 100, (7,)).astype(np.int8),
        "bool": rng.integers(0, 2, (3, 5)).astype(bool),
        "c64": (rng.standard_normal((3, 2)) + 1j * rng.standard_normal((3, 2))).astype(np.complex64),
        "u64": np.array([0, 2**64 - 1, 17], dtype=np.uint64),
        "f16": rng.standard_normal((2, 2, 2)).astype(np.float16),
    }
    for name, v in values.items():
        path = os.path.join(shared_dir, f"{name}.npy")
        checkpoint.save(sm.tensor(v, placement=pl, sbp=sm.sbp.split(0)), path)
        if rank == 0:
            got = np.load(path)
            assert got.dtype == v.dtype
            np.testing.assert_array_equal(got, v)
        y = checkpoint.load(path, placement=pl, sbp=sm.sbp.split(v.ndim - 1))
        assert y.dtype == v.dtype
        np.testing.assert_array_equal(y.numpy(), v, err_msg=name)
    # files written by numpy itself: Fortran order, big-endian, format 2.0
    v = np.arange(30, dtype=np.int32).reshape(5, 6)
    on_root(np.save, os.path.join(shared_dir, "fortran.npy"), np.asfortranarray(v))
    on_root(np.save, os.path.join(shared_dir, "big.npy"), v.astype(">i4"))

    def save_v2():
        with open(os.path.join(shared_dir, "v2.npy"), "wb") as f:
            np.lib.format.write_array(f, v, version=(2, 0))

    on_root(save_v2)
    for name in ("fortran", "big", "v2"):
        for nd in (sm.sbp.split(0), sm.sbp.split(1), sm.sbp.broadcast, sm.sbp.partial_min):
            y = checkpoint.load(os.path.join(shared_dir, f"{name}.npy"), placement=pl, sbp=nd)
            assert y.dtype == np.int32 and y.dtype.isnative
            np.testing.assert_array_equal(y.numpy(), v, err_msg=f"{name} {nd}")


@pytest.mark.mpi(min_size=1)
def test_save_replaces_atomically_and_leaves_no_temporary(shared_dir):
    pl = sm.placement("cpu", list(range(size)))
    path = os.path.join(shared_dir, "w.npy")
    for k in range(3):
        v = np.full((size + 2, 3), float(k))
        checkpoint.save(sm.tensor(v, placement=pl, sbp=sm.sbp.split(0)), path)
        if rank == 0:
            np.testing.assert_array_equal(np.load(path), v)
    comm.Barrier()
    assert sorted(os.listdir(shared_dir)) == ["w.npy"]


@pytest.mark.mpi(min_size=1)
def test_bad_files_give_the_same_clear_error_everywhere(shared_dir):
    pl = sm.placement("cpu", list(range(size)))
    v = np.arange(24, dtype=np.float64).reshape(4, 6)
    good = os.path.join(shared_dir, "good.npy")
    checkpoint.save(sm.tensor(v, placement=pl, sbp=sm.sbp.broadcast), good)
    raw = open(good, "rb").read()
    cases = {
        "truncated.npy": (raw[:-9], "CheckpointError", "is truncated: the header says shape (4, 6) "
                          "float64 = 192 data bytes after a 128-byte header, 320 bytes in all, "
                          "but the file has 311 bytes"),
        "header_cut.npy": (raw[:40], "CheckpointError", "is truncated inside its .npy header"),
        "empty.npy": (b"", "CheckpointError", "is not a .npy file"),
        "magic.npy": (b"PK\x03\x04" + raw[4:], "CheckpointError", "is not a .npy file"),
        "version.npy": (raw[:6] + b"\x07\x00" + raw[8:], "CheckpointError",
                        "has .npy format version 7.0"),
        "trailing.npy": (raw + b"\0" * 8, "CheckpointError", "longer than its header says"),
        "header.npy": (raw.replace(b"'shape': (4, 6)", b"'shape': [4, 6]"), "CheckpointError",
                       "is not a tuple of non-negative ints"),
        "descr.npy": (raw.replace(b"'<f8'", b"'<q9'"), "CheckpointError", "is not a dtype"),
        "garbage.npy": (raw.replace(b"'descr'", b"'descr("), "CheckpointError",
                        "malformed .npy header"),
    }

    def write_all():
        for name, (data, _, _) in cases.items():
            with open(os.path.join(shared_dir, name), "wb") as f:
                f.write(data)

    on_root(write_all)
    for name, (_, etype, frag) in cases.items():
        path = os.path.join(shared_dir, name)
        got = errors_of(lambda p=path: checkpoint.load(p, placement=pl, sbp=sm.sbp.split(0)))
        assert got[0] == etype and frag in got[1] and got[1].startswith("sm.load: "), (name, got)
        assert isinstance(CheckpointError("x"), ValueError)
    got = errors_of(lambda: checkpoint.load(os.path.join(shared_dir, "nope.npy"), placement=pl,
                                            sbp=sm.sbp.split(0)))
    assert got[0] == "FileNotFoundError" and "no such file" in got[1], got
    got = errors_of(lambda: checkpoint.load(shared_dir, placement=pl, sbp=sm.sbp.split(0)))
    assert got[0] == "IsADirectoryError", got
    # the good file still loads after all that
    np.testing.assert_array_equal(
        checkpoint.load(good, placement=pl, sbp=sm.sbp.split(1)).numpy(), v)


@pytest.mark.mpi(min_size=1)
def test_state_round_trip_and_replacement(shared_dir):
    d = os.path.join(shared_dir, "state")
    pl = sm.placement("cpu", list(range(size)))
    rng = np.random.default_rng(2)
    vals = {"w 1/odd name": rng.standard_normal((5, 3)), "b": rng.integers(0, 9, (4,)),
            "W 1.odd_name": rng.standard_normal((2, 2)).astype(np.float32)}
    sbps = {"w 1/odd name": sm.sbp.split(1), "b": sm.sbp.partial_sum,
            "W 1.odd_name": sm.sbp.broadcast}
    state = {k: sm.tensor(v, placement=pl, sbp=sbps[k]) for k, v in vals.items()}
    checkpoint.save_state(state, d)
    out = checkpoint.load_state(d)  # placement and SBP as saved
    assert list(out) == list(vals)
    for k, v in vals.items():
        assert out[k].dtype == v.dtype and out[k].placement == pl
        assert out[k].sbp == Layout.make(v.shape, pl, sbps[k]).sbp
        np.testing.assert_array_equal(out[k].numpy(), v, err_msg=k)
    # the index and the files are plain JSON and .npy
    index = json.load(open(os.path.join(d, checkpoint.INDEX_NAME)))
    assert index["format"] == "sbpmpi.state" and list(index["tensors"]) == list(vals)
    if rank == 0:
        for k, v in vals.items():
            np.testing.assert_array_equal(np.load(os.path.join(d, index["tensors"][k]["file"])), v)
    assert len({e["file"] for e in index["tensors"].values()}) == 3
    # other placement / SBP per name
    one = sm.placement("cpu", [size - 1])
    out = checkpoint.load_state(d, placement=one, sbp={"b": sm.sbp.split(0)})
    for k, v in vals.items():
        assert out[k].placement == one
        np.testing.assert_array_equal(out[k].numpy(), v, err_msg=k)
    # replace with a smaller state: old files go, the index names only the new ones
    checkpoint.save_state({"b": state["b"]}, d)
    comm.Barrier()
    files = sorted(f for f in os.listdir(d) if f != checkpoint.INDEX_NAME)
    index = json.load(open(os.path.join(d, checkpoint.INDEX_NAME)))
    assert files == [index["tensors"]["b"]["file"]]
    np.testing.assert_array_equal(checkpoint.load_state(d)["b"].numpy(), vals["b"])
    got = errors_of(lambda: checkpoint.load_state(d, sbp={"nope": sm.sbp.broadcast}))
    assert got[0] == "KeyError" and "not in the checkpoint" in got[1], got
    got = errors_of(lambda: checkpoint.load_state(os.path.join(shared_dir, "none")))
    assert got[0] == "FileNotFoundError" and "sm.load_state: no such state directory" in got[1]
    # a missing tensor file is reported before anything is read
    on_root(os.remove, os.path.join(d, index["tensors"]["b"]["file"]))
    got = errors_of(lambda: checkpoint.load_state(d))
    assert got[0] == "CheckpointError" and "is missing" in got[1], got


@pytest.mark.mpi(min_size=1)
def test_save_errors_before_any_write(shared_dir):
    pl = sm.placement("cpu", list(range(size)))
    x = sm.tensor(np.zeros((2, 2)), placement=pl, sbp=sm.sbp.broadcast)
    got = errors_of(lambda: checkpoint.save(x, os.path.join(shared_dir, "no", "such", "x.npy")))
    assert got[0] == "FileNotFoundError" and "does not exist" in got[1], got
    got = errors_of(lambda: checkpoint.save(x, shared_dir))
    assert got[0] == "IsADirectoryError", got
    assert os.listdir(shared_dir) == []


@pytest.mark.mpi(min_size=2)
def test_a_write_failing_on_one_rank_fails_everywhere_and_keeps_the_old_file(shared_dir,
                                                                              monkeypatch):
    pl = sm.placement("cpu", list(range(size)))
    path = os.path.join(shared_dir, "w.npy")
    old = np.arange(2.0 * size).reshape(size, 2)
    checkpoint.save(sm.tensor(old, placement=pl, sbp=sm.sbp.split(0)), path)
    monkeypatch.setattr(file_io, "write_blocks", failing_on_rank_1(file_io.write_blocks))
    x = sm.tensor(old + 1, placement=pl, sbp=sm.sbp.split(0))
    got = errors_of(lambda: checkpoint.save(x, path))
    assert got == ("OSError", f"sm.save {path!r}: rank 1: simulated: disk full"), got
    comm.Barrier()
    assert os.listdir(shared_dir) == ["w.npy"]  # the temporary file is gone
    np.testing.assert_array_equal(np.load(path), old)


def failing_on_rank_1(write_blocks):
    """``file_io.write_blocks`` that writes (the collective completes), then fails on rank 1."""
    def write(*args, **kwargs):
        write_blocks(*args, **kwargs)
        if rank == 1:
            raise OSError("simulated: disk full")
    return write


def exchange_log(monkeypatch) -> list[str]:
    """The labels of the metadata exchanges from now on (each one runs under watchdog.watch;
    the MPI-IO calls' own watches are left out, the agreements that end their steps are
    in, as file_io.STEP_LABEL)."""
    from sbpmpi.comm.agreement import exchange as agreement
    from sbpmpi.comm.lifecycle import watchdog

    labels: list[str] = []
    watch = watchdog.watch

    def counting(op, *args, **kwargs):
        if not op.startswith("MPI-IO") or op == file_io.STEP_LABEL:
            labels.append(op)
        return watch(op, *args, **kwargs)

    monkeypatch.setattr(watchdog, "watch", counting)
    monkeypatch.setattr(agreement, "watch", counting)  # the agreement exchanges
    return labels


@pytest.fixture
def checked_and_watched():
    """The consistency check on, and a timeout, so that every exchange runs under a watch."""
    with sm.config.override(check=True, timeout=600.0):
        yield


@pytest.mark.mpi(min_size=2)
def test_one_exchange_per_decision(shared_dir, monkeypatch, checked_and_watched):
    """Metadata exchanges per call, the same at any n >= 2. sm.save: 4 (the arguments agree,
    rank 0's temporary name, every rank wrote, rank 0's rename), also when a write fails on
    one rank (there were 5: all_ok then raise_if_any's own all-reduce for the same decision);
    sm.load: 3 (the arguments, rank 0's header, every rank read). A state of two tensors:
    save_state 3 + 4 per tensor (the fourth: the CRC-32 of its file) and load_state 2 + 3
    per tensor (the third: verifying the CRC-32; there were 11 and 8: each tensor checked
    the arguments the state call had checked already).

    Besides these, every MPI-IO call is preceded by one 16-byte all-reduce on whether
    everything since the previous one succeeded everywhere (file_io.STEP_LABEL), and one
    follows the close, so that a rank whose part failed never leaves the others in the
    next collective: 6 per file written (before the open: every rank's block, view and
    header made; before the view: the open and the header; before the data, the sync and
    the close; after the close), 5 per file read (before the open: every rank's buffer
    and view made; before the view, the data, the close; after the close; there were 4:
    nothing before the open, and a rank that could not make its buffer hung the
    others)."""
    pl = sm.placement("cpu", list(range(size)))
    x = sm.tensor(np.arange(4.0 * size).reshape(2 * size, 2), placement=pl, sbp=sm.sbp.split(0))
    b = sm.tensor(np.arange(5), placement=pl, sbp=sm.sbp.broadcast)
    path = os.path.join(shared_dir, "x.npy")
    log = exchange_log(monkeypatch)

    def count(fn, steps):
        log.clear()
        errors_of(fn)
        got = [label for label in log if label != file_io.STEP_LABEL]
        assert len(log) - len(got) == steps, log
        return len(got), got

    assert count(lambda: checkpoint.save(x, path), 6)[0] == 4
    assert count(lambda: checkpoint.load(path, placement=pl, sbp=sm.sbp.broadcast), 5)[0] == 3
    state = os.path.join(shared_dir, "state")
    n, labels = count(lambda: checkpoint.save_state({"x": x, "b": b}, state), 6 * 2)
    assert n == 3 + 4 * 2 and labels.count("consistency check before sm.save_state") == 1, labels
    assert "consistency check before sm.save" not in labels, labels
    n, labels = count(lambda: checkpoint.load_state(state), 5 * 2)
    assert n == 2 + 3 * 2 and "consistency check before sm.load" not in labels, labels
    with monkeypatch.context() as m:
        m.setattr(file_io, "write_blocks", failing_on_rank_1(file_io.write_blocks))
        n, labels = count(lambda: checkpoint.save(x, path), 6)
    assert n == 4 and labels.count("collective decision") == 1, labels


# -- across world sizes and crashes (serial tests, own mpiexec) ----------------------------------

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec on PATH")


def reference(shape, salt):
    """Same values as fault_programs/ckpt.py value()."""
    n = int(np.prod(shape))
    return ((np.arange(n, dtype=np.float64) * 1.5 + salt) % 97 - 40).reshape(shape)


@needs_mpiexec
def test_save_on_4_ranks_2x2_mesh_load_on_2_and_1(tmp_path):
    res = run_mpi(4, "ckpt.py", "save", str(tmp_path))
    assert res.rc == 0, res
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), reference((5, 7), 0))
    index = json.loads((tmp_path / "state" / "index.json").read_text())
    w = index["tensors"]["layer.w"]
    assert w["sbp"] == ["partial_sum", "split(2)"] and w["placement"]["ranks"] == [[0, 1], [2, 3]]
    np.testing.assert_array_equal(np.load(tmp_path / "state" / w["file"]),
                                  reference((3, 4, 2), 1).astype(np.float32))
    for n in (2, 1):
        res = run_mpi(n, "ckpt.py", "load", str(tmp_path))
        assert res.rc == 0 and f"LOADED-OK n={n}" in res.out, res


@needs_mpiexec
def test_rank_killed_mid_write_leaves_no_file(tmp_path):
    res = run_mpi(2, "ckpt.py", "crash-during", str(tmp_path))
    assert res.rc != 0, res
    assert not (tmp_path / "x.npy").exists(), os.listdir(tmp_path)
    leftovers = os.listdir(tmp_path)
    assert all(f.startswith(".x.npy.sbpmpi-tmp-") for f in leftovers), leftovers


@needs_mpiexec
def test_crash_before_rename_keeps_the_old_file(tmp_path):
    old = reference((5, 7), 0)
    np.save(tmp_path / "x.npy", old)
    res = run_mpi(2, "ckpt.py", "crash-commit", str(tmp_path))
    assert res.rc != 0 and "temporary file complete" in res.out, res
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), old)
    tmps = [f for f in os.listdir(tmp_path) if f != "x.npy"]
    assert len(tmps) == 1 and tmps[0].startswith(".x.npy.sbpmpi-tmp-"), tmps
    np.testing.assert_array_equal(np.load(tmp_path / tmps[0]), reference((5, 7), 5))


# -- bad arguments: the rows of the bad input matrix (bad_input.py) ---------------------------

S, B = sm.sbp.split, sm.sbp.broadcast

BAD_INPUTS = [
    Row("save-not-global", lambda c: sm.save(np.zeros(3), c.path("a.npy")), TypeError,
        "sm.save needs a GlobalTensor, got ndarray"),
    Row("save-path-int", lambda c: sm.save(c.x, 123), TypeError,
        "path must be a str or os.PathLike, got int 123"),
    Row("save-missing-directory", lambda c: sm.save(c.x, c.path("no/such/dir/a.npy")),
        FileNotFoundError, "does not exist"),
    Row("tensor-object-dtype",
        lambda c: sm.save(sm.tensor(np.array([None, 1], dtype=object), placement=c.pl, sbp=B),
                          c.path("o.npy")),
        TypeError, "data must be numeric"),
    Row("load-missing-file", lambda c: sm.load(c.path("nope.npy"), placement=c.pl, sbp=B),
        FileNotFoundError, "sm.load: no such file"),
    Row("load-truncated", lambda c: sm.load(c.truncated, placement=c.pl, sbp=S(0)),
        CheckpointError, "is truncated: the header says shape (4, 6) float64"),
    Row("load-no-placement", lambda c: sm.load(c.good, sbp=B), TypeError,
        "sm.load: placement= is required"),
    Row("load-no-sbp", lambda c: sm.load(c.good, placement=c.pl), TypeError,
        "sm.load: sbp= is required"),
    Row("load-split-dim", lambda c: sm.load(c.good, placement=c.pl, sbp=S(3)), ValueError,
        "split dim 3 is out of range for a tensor of 2 dims"),
    Row("load-partial-max-complex",
        lambda c: sm.load(c.complex, placement=c.pl, sbp=sm.sbp.partial_max), TypeError,
        "cannot lay out dtype complex128 as partial_max"),
    Row("save_state-not-dict", lambda c: sm.save_state([c.x], c.path("st")), TypeError,
        "sm.save_state needs a dict of name -> GlobalTensor, got list"),
    Row("save_state-int-name", lambda c: sm.save_state({1: c.x}, c.path("st")), TypeError,
        "tensor names must be non-empty str, got 1"),
    Row("save_state-local-value", lambda c: sm.save_state({"w": np.zeros(2)}, c.path("st")),
        TypeError, "sm.save_state: tensor 'w' needs a GlobalTensor"),
    Row("load_state-missing", lambda c: sm.load_state(c.path("none")), FileNotFoundError,
        "sm.load_state: no such state directory"),
]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("row", BAD_INPUTS, ids=[r.id for r in BAD_INPUTS])
def test_bad_checkpoint_input_raises_the_same_error_on_every_rank(bad_input_ctx, row, request):
    check_row(row, bad_input_ctx, request)
