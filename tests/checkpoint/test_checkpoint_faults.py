"""Checkpoints where jobs meet the world: I/O that fails on one rank, odd and damaged files.

Serial tests run the fault programs (tests/fault_programs/io_faults.py) under their own
mpiexec at n = 2 and 3, with a time limit and the default settings: a save or a load
failing on one rank after each I/O step and before each MPI-IO call (through file_io's
fault hook), a rank that cannot make its block's bytes (a MemoryError), a real fault
(RLIMIT_FSIZE: a write past the limit fails with EFBIG, as on a full disk), a FIFO at
the load path, and files of zero-size dtypes. MPI tests (n = 1..4) check the state directory's defences:
damaged indexes, permission bits, a failed index write, load errors that name the file,
and the CRC-32 of each tensor file.
"""

from __future__ import annotations

import json
import os
import stat
import zlib

import numpy as np
import pytest
from conftest import errors_of
from fault_programs.runner import mpiexec, run_mpi
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import checkpoint
from sbpmpi.checkpoint.atomic_write import TMP_TAG
from sbpmpi.comm import file_io

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec on PATH")
LIMIT = 5.0  # seconds: every rank raises within this of the call


def results(out: str) -> list[dict]:
    """Every RESULT record in the job's output (the ranks' lines may run together)."""
    decoder, found, at = json.JSONDecoder(), [], out.find("RESULT {")
    while at >= 0:
        obj, end = decoder.raw_decode(out, at + len("RESULT "))
        found.append(obj)
        at = out.find("RESULT {", end)
    return found


def one_error(res, n: int, call: str, step: str) -> dict:
    """The error every rank raised in ``call`` at ``step``: the same type and message on
    each of the ``n`` ranks, raised within LIMIT seconds."""
    rows = [r for r in results(res.out) if r["call"] == call and r["step"] == step]
    assert sorted(r["rank"] for r in rows) == list(range(n)), (call, step, res)
    assert len({(r["type"], r["message"]) for r in rows}) == 1, (call, step, rows)
    assert rows[0]["type"] != "no error", (call, step, rows)
    assert max(r["seconds"] for r in rows) < LIMIT, (call, step, rows)
    return rows[0]


def leftovers(root) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if TMP_TAG in f]


# -- one rank fails at each step, or before each call (fault hook) -------------------------------

FILE_STEPS = ("open", "header", "view", "data", "sync", "close")  # a write's MPI-IO steps
READ_STEPS = ("open", "view", "data", "close")  # those of sm.load
BEFORE = tuple(f"before {step}" for step in FILE_STEPS)  # the points before each call


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("points", ["after", "before"])
def test_a_rank_failing_at_any_step_fails_on_every_rank(tmp_path, n, points):
    """``after``: a step fails on one rank once done (the I/O itself completed).
    ``before``: a rank fails before a collective call (making its buffer, its view's
    datatypes; before the sync and the close: just before their agreement): the others
    went on into the call and waited there for ever (the hook had no such point; the
    job hung with the failure while making the buffer of ``Write_at_all``)."""
    group = file_io.STEPS if points == "after" else BEFORE
    res = run_mpi(n, "io_faults.py", "inject", str(tmp_path), *group, timeout=240)
    assert res.rc == 0, res
    for step in group:
        base = step.removeprefix("before ")
        who = 0 if base in ("header", "rename", "index") else n - 1
        calls = [c for c, skip in (("sm.save", base == "index"), ("sm.save_state", False),
                                   ("sm.load", base not in READ_STEPS)) if not skip]
        for call in calls:
            err = one_error(res, n, call, step)
            assert err["type"] == "OSError", err  # ENOSPC: the same subclass everywhere
            name = {"sm.save": "x.npy", "sm.load": "x.npy"}.get(call, "state")
            target = tmp_path / step.replace(" ", "-") / name
            assert err["message"].startswith(f"{call} '{target}"), err
            assert f"rank {who}: " in err["message"], err
            if base in FILE_STEPS:
                assert f": MPI-IO {base} (" in err["message"], err
            assert f"injected at {step}: No space left on device" in err["message"], err
        for r in range(n):  # the previous files, byte for byte, and they load
            assert f"INTACT rank {r} step {step}" in res.out, res
    assert leftovers(tmp_path) == []


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_that_cannot_make_its_block_fails_on_every_rank(tmp_path, n):
    """Rank 1 cannot make the bytes of its block (``MemoryError``: the contiguous copy of
    a large shard, the buffer a load reads into) while the others can: they went on
    into Write_at_all / Read_at_all and the job hung (at n = 3 for ever; here until the
    time limit), leaving the temporary file behind."""
    res = run_mpi(n, "io_faults.py", "prepare", str(tmp_path), timeout=90)
    assert res.rc == 0, res
    d = tmp_path / "prepare"
    for call, target, verb in (("sm.save", d / "x.npy", "write"),
                               ("sm.save_state", d / "state", "write"),
                               ("sm.load", d / "x.npy", "read")):
        err = one_error(res, n, call, "prepare")
        assert err["type"] == "MemoryError", err
        assert err["message"].startswith(f"{call} '{target}"), err
        assert f"rank 1: MPI-IO data (preparing to {verb} '" in err["message"], err
        nbytes = (n + 1) * (6 // n) * 8  # rank 1's columns of the (n + 1, 6) float64 "w"
        assert err["message"].endswith(f"simulated: cannot allocate {nbytes} bytes for the "
                                       f"block"), err
    assert all(f"INTACT rank {r} step prepare" in res.out for r in range(n)), res
    assert leftovers(tmp_path) == []


# -- a real fault: the file size limit (EFBIG, as a full disk) -------------------------------------

@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("where", ["header", "data"])
def test_a_real_write_error_on_rank_0_fails_on_every_rank(tmp_path, n, where):
    """Rank 0 cannot write past RLIMIT_FSIZE: 0 bytes (its header write fails: the job
    hung, leaving a 0-byte temporary file), or 200 bytes (the collective data write)."""
    res = run_mpi(n, "io_faults.py", "fsize", str(tmp_path), where, timeout=120)
    assert res.rc == 0, res
    err = one_error(res, n, "sm.save", f"fsize-{where}")
    assert err["type"] == "OSError" and "File too large" in err["message"], err
    assert err["message"].startswith(f"sm.save '{tmp_path / 'x.npy'}'"), err
    assert f"rank 0: MPI-IO {where} (" in err["message"] and "[Errno 27]" in err["message"]
    assert all(f"INTACT rank {r} step fsize-{where}" in res.out for r in range(n)), res
    assert sorted(os.listdir(tmp_path)) == ["x.npy"]


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_a_real_index_write_error_leaves_nothing_and_names_the_index(tmp_path, n):
    """The new index does not fit under rank 0's RLIMIT_FSIZE (its tensor files do): the
    temporary index and the new tensor files stayed behind, and the message named no
    path."""
    res = run_mpi(n, "io_faults.py", "fsize", str(tmp_path), "index", timeout=120)
    assert res.rc == 0, res
    err = one_error(res, n, "sm.save_state", "fsize-index")
    index = tmp_path / "state" / "index.json"
    assert err["type"] == "OSError", err
    assert err["message"] == (f"sm.save_state '{tmp_path / 'state'}': rank 0: [Errno 27] "
                              f"cannot write '{index}': File too large"), err
    assert all(f"INTACT rank {r} step fsize-index" in res.out for r in range(n)), res
    assert leftovers(tmp_path) == []


# -- odd files: FIFOs, zero-size and object dtypes -------------------------------------------------

@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_a_fifo_at_the_load_path_raises_instead_of_hanging(tmp_path, n):
    res = run_mpi(n, "io_faults.py", "odd", str(tmp_path), "fifo", timeout=60)
    assert res.rc == 0 and res.seconds < 30, res
    err = one_error(res, n, "sm.load", "fifo.npy")
    assert err["type"] == "CheckpointError", err
    assert f"'{tmp_path / 'fifo.npy'}' is a FIFO (named pipe), not a regular file" \
        in err["message"], err


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_a_fifo_as_the_state_index_raises_instead_of_hanging(tmp_path, n):
    res = run_mpi(n, "io_faults.py", "odd", str(tmp_path), "fifo-index", timeout=60)
    assert res.rc == 0 and res.seconds < 30, res
    err = one_error(res, n, "sm.load_state", "fifo-index")
    assert err["type"] == "CheckpointError", err
    assert f"'{tmp_path / 'state' / 'index.json'}' is a FIFO" in err["message"], err


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_zero_size_and_object_dtypes_are_refused_naming_the_file(tmp_path, n):
    """A V0 or <U0 header ended the job with SIGFPE inside MPI_File_set_view."""
    res = run_mpi(n, "io_faults.py", "odd", str(tmp_path), "dtypes", timeout=60)
    assert res.rc == 0 and res.seconds < 30, res
    for name, dt, why in (("v0.npy", "|V0", "zero-size elements"),
                          ("u0.npy", "<U0", "zero-size elements"),
                          ("obj.npy", "object", "holds pickled Python objects")):
        err = one_error(res, n, "sm.load", name)
        assert err["type"] == "CheckpointError", err
        assert f"'{tmp_path / name}': dtype {dt} " in err["message"] and why in err["message"]


# -- state directories that cannot eat themselves (MPI, n = 1..4) ----------------------------------

def state_of(salt: float = 0.0) -> dict[str, np.ndarray]:
    return {"w": np.arange(3.0 * (size + 2)).reshape(size + 2, 3) + salt,
            "b": np.arange(5, dtype=np.int64) + int(salt)}


def save_state(d, salt: float = 0.0) -> None:
    pl = sm.placement("cpu", list(range(size)))
    checkpoint.save_state({k: sm.tensor(v, placement=pl, sbp=sm.sbp.split(0))
                           for k, v in state_of(salt).items()}, d)


def assert_state(d, salt: float = 0.0) -> None:
    got = checkpoint.load_state(d)
    for k, v in state_of(salt).items():
        np.testing.assert_array_equal(got[k].numpy(), v)
        assert got[k].dtype == v.dtype


def edit_index(d, fn) -> None:
    """Rank 0 rewrites ``d``'s index with ``fn(index)``; then every rank goes on."""
    if rank == 0:
        path = os.path.join(d, checkpoint.INDEX_NAME)
        with open(path) as f:
            index = json.load(f)
        fn(index)
        with open(path, "w") as f:
            json.dump(index, f)
    comm.Barrier()


@pytest.mark.mpi(min_size=1)
def test_a_damaged_old_index_cannot_make_a_save_remove_the_index_or_other_files(shared_dir):
    """An old entry naming index.json passed the checks, and the next save deleted the
    index it had just written (and any user file the old index named), returning success.
    Now a save removes only the files the old index names that carry our naming."""
    d = os.path.join(shared_dir, "state")
    save_state(d)
    notes = os.path.join(d, "notes.txt")
    outside = os.path.join(shared_dir, "outside.npy")
    if rank == 0:
        for p in (notes, outside):
            with open(p, "w") as f:
                f.write("the user's\n")
    comm.Barrier()

    orphans = []  # the files the edits below unlink from the index: never removed

    def rename(name, file):
        def edit(index):
            orphans.append(index["tensors"][name]["file"])
            index["tensors"][name]["file"] = file
        return edit

    edit_index(d, rename("w", checkpoint.INDEX_NAME))
    got = errors_of(lambda: checkpoint.load_state(d))
    assert got[0] == "CheckpointError" and "tensor 'w': file 'index.json' is the index " \
        "index.json itself" in got[1] and os.path.join(d, "index.json") in got[1], got
    save_state(d, 1.0)
    assert_state(d, 1.0)
    # an old index naming a user file (a valid name, not ours) and one outside: kept
    edit_index(d, rename("b", "notes.txt"))
    save_state(d, 2.0)
    assert_state(d, 2.0)
    edit_index(d, rename("b", "../outside.npy"))
    got = errors_of(lambda: checkpoint.load_state(d))
    assert got[0] == "CheckpointError" and "'../outside.npy' is not a plain file name " \
        "inside the state directory" in got[1], got
    save_state(d, 3.0)
    assert_state(d, 3.0)
    assert os.path.exists(notes) and os.path.exists(outside)
    index = json.load(open(os.path.join(d, checkpoint.INDEX_NAME)))
    ours = sorted(e["file"] for e in index["tensors"].values())
    comm.Barrier()
    # every other file the old indexes named went; those their damaged entries no longer
    # named stay (rank 0 knows the orphans)
    orphans = comm.bcast(orphans, root=0)
    assert len(orphans) == 3
    assert sorted(os.listdir(d)) == sorted([checkpoint.INDEX_NAME, "notes.txt", *ours,
                                            *orphans])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", [0o600, 0o640, 0o400])
def test_overwrites_keep_the_permission_bits(shared_dir, mode):
    pl = sm.placement("cpu", list(range(size)))
    x = sm.tensor(np.arange(2.0 * size), placement=pl, sbp=sm.sbp.split(0))
    path = os.path.join(shared_dir, "x.npy")
    checkpoint.save(x, path)
    d = os.path.join(shared_dir, "state")
    save_state(d)
    if rank == 0:
        os.chmod(path, mode)
        for f in os.listdir(d):
            os.chmod(os.path.join(d, f), mode)
    comm.Barrier()
    checkpoint.save(x * 2, path)
    save_state(d, 1.0)
    comm.Barrier()
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
    for f in os.listdir(d):
        assert stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode) == mode, f
    assert_state(d, 1.0)


@pytest.mark.mpi(min_size=1)
def test_a_failed_index_write_leaves_nothing_and_names_the_index(shared_dir):
    """The temporary index and the new tensor files stayed behind (keeping the disk
    full), and the message named no path."""
    d = os.path.join(shared_dir, "state")
    save_state(d)
    before = sorted(os.listdir(d))

    def full(step, path):
        if step == "index":
            raise OSError(28, "No space left on device")

    previous = file_io.set_fault_hook(full)
    try:
        got = errors_of(lambda: save_state(d, 1.0))
    finally:
        file_io.set_fault_hook(previous)
    index = os.path.join(d, checkpoint.INDEX_NAME)
    assert got == ("OSError", f"sm.save_state {d!r}: rank 0: [Errno 28] cannot write "
                              f"{index!r}: No space left on device"), got
    comm.Barrier()
    assert sorted(os.listdir(d)) == before
    assert_state(d)


def write_raw(path, data: bytes) -> None:
    if rank == 0:
        with open(path, "wb") as f:
            f.write(data)
    comm.Barrier()


@pytest.mark.mpi(min_size=1)
def test_every_load_error_names_the_file(shared_dir):
    pl = sm.placement("cpu", list(range(size)))

    def header(shape_text: str, descr: str = "|u1") -> bytes:
        d = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}"
        d += " " * (118 - len(d)) + "\n" if len(d) < 118 else "\n"
        raw = d.encode("latin1")
        return b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little") + raw

    for name, shape_text, data in (("huge.npy", f"({10**100},)", b""),
                                   ("wrap.npy", f"({2**62 + 750}, 4)", b"\0" * 3000)):
        path = os.path.join(shared_dir, name)
        write_raw(path, header(shape_text) + data)
        got = errors_of(lambda p=path: checkpoint.load(p, placement=pl, sbp=sm.sbp.split(0)))
        assert got[0] == "CheckpointError" and f"{path!r} has a malformed .npy header" in got[1]
        assert "more elements than an array can hold" in got[1], got
    # the state index
    d = os.path.join(shared_dir, "state")
    save_state(d)
    index = os.path.join(d, checkpoint.INDEX_NAME)
    cases = [
        (lambda i: i["tensors"]["w"].update(shape=5), "shape 5 is not a sequence"),
        (lambda i: i["tensors"]["w"].update(sbp=["split(99999999999999999999)"]),
         "sbp entry 'split(99999999999999999999)' splits a dimension the 2-d tensor does "
         "not have"),
        (lambda i: i["tensors"]["w"]["placement"].update(ranks=[0, 0]),
         "placement ranks [0, 0] hold duplicate ranks [0]"),
        (lambda i: i["tensors"]["b"].update(dtype="|V0"), "zero-size elements"),
        (lambda i: i["tensors"]["b"].update(crc32=-1), "crc32 -1 is not a CRC-32 value"),
    ]
    good = open(index).read()
    for edit, why in cases:
        edit_index(d, edit)
        got = errors_of(lambda: checkpoint.load_state(d))
        assert got[0] == "CheckpointError" and f"sm.load_state: {index!r}, tensor " in got[1]
        assert why in got[1], (why, got)
        write_raw(index, good.encode())
    write_raw(index, b"[" * 100000 + b"]" * 100000)  # deeper than the JSON reader goes
    got = errors_of(lambda: checkpoint.load_state(d))
    assert got == ("CheckpointError", f"sm.load_state: {index!r} is not an sbpmpi state "
                                      f"index: its JSON is nested too deeply to read"), got
    write_raw(index, good.encode())
    assert_state(d)


@pytest.mark.mpi(min_size=1)
def test_mpi_io_errors_reach_users_as_os_errors(shared_dir):
    """An MPI-IO error was re-raised as RuntimeError("Exception: ...")."""
    path = os.path.join(shared_dir, "no", "such", "dir", "x.bin")
    got = errors_of(lambda: file_io.write_blocks(path, b"", np.zeros(3), (3 * size,),
                                                 (3 * rank,), np.float64, what="test"))
    assert got[0] == "FileNotFoundError", got
    assert got[1].startswith(f"test: rank 0: MPI-IO open (open for writing {path!r}): "), got
    assert "(MPI error class" in got[1], got


@pytest.mark.mpi(min_size=1)
def test_a_flipped_byte_raises_naming_the_tensor_and_the_file(shared_dir):
    d = os.path.join(shared_dir, "state")
    save_state(d)
    index = json.load(open(os.path.join(d, checkpoint.INDEX_NAME)))
    for e in index["tensors"].values():  # the recorded CRC is the file's zlib.crc32
        assert e["crc32"] == zlib.crc32(open(os.path.join(d, e["file"]), "rb").read())
    path = os.path.join(d, index["tensors"]["w"]["file"])
    raw = bytearray(open(path, "rb").read())
    raw[-5] ^= 0x10  # a data byte of the last element: same size, a valid float64
    comm.Barrier()
    write_raw(path, bytes(raw))
    got = errors_of(lambda: checkpoint.load_state(d))
    assert got[0] == "CheckpointError", got
    assert got[1].startswith(f"sm.load_state: tensor 'w' (file {path!r}): the file is "
                             f"damaged: its CRC-32 is "), got
    assert "verify=False" in got[1], got
    out = checkpoint.load_state(d, verify=False)  # read anyway: the damaged value
    want = state_of()["w"]
    diff = out["w"].numpy() != want
    assert diff.sum() == 1 and diff.reshape(-1)[-1], out["w"].numpy()
    got = errors_of(lambda: checkpoint.load_state(d, verify=1))
    assert got == ("TypeError", "sm.load_state: verify must be True or False, got 1"), got


def test_crc32_combine_matches_zlib():
    from sbpmpi.checkpoint import checksum

    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    for cut in (0, 1, 7, 4096, 65_537, len(data)):
        a, b = data[:cut], data[cut:]
        assert checksum.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(data)
    parts = [data[i:i + 9999] for i in range(0, len(data), 9999)]
    crc = 0
    for p in parts:
        crc = checksum.crc32_combine(crc, zlib.crc32(p), len(p))
    assert crc == zlib.crc32(data)
