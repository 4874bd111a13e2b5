"""One rank's checkpoint write fails at one I/O step, under the default settings.

    mpiexec -n N python io_faults.py inject DIR [STEP ...]   # the fault hook, each step
    mpiexec -n N python io_faults.py prepare DIR              # a rank's block copy fails
    mpiexec -n N python io_faults.py fsize DIR WHERE          # a real fault: RLIMIT_FSIZE
    mpiexec -n N python io_faults.py odd DIR CASE             # fifo, fifo-index, dtypes

``inject``: for each fault point (all of ``file_io.FAULT_POINTS`` by default: after each
step, and ``"before <step>"``, where a rank makes what the step's call needs) a previous
checkpoint is saved (``x.npy`` and a state directory of two tensors), then the fault hook
(``file_io.set_fault_hook``, the module's seam for tests) makes the step fail on one rank
(rank 0 for the steps only it performs: the header, the renames, the index; the last
rank otherwise), once in ``sm.save``, once in ``sm.save_state`` (at the second tensor,
so that the first one's file is already in place) and, for the steps of a read (open,
view, data, close), once in ``sm.load`` of ``x.npy``. Each rank prints one ``RESULT``
line (JSON: the call, the step, the error's type and message, the seconds from the call
to the raise); then the hook is removed and every rank checks that the directory holds
exactly the previous files, byte for byte, and that they load bit-identically
(``INTACT``).

``prepare``: the same three calls, with rank 1 failing (``MemoryError``) to make the
bytes of its block (``file_io.bytes_view``, the module's other seam: the contiguous copy
of a large shard that does not fit) while the others go on to the collective data call;
that left them inside ``Write_at_all`` / ``Read_at_all`` for ever.

``fsize``: the same save with no hook, rank 0 limited by ``RLIMIT_FSIZE`` (SIGXFSZ
ignored, so a write past the limit fails with EFBIG as on a full disk): ``header`` at 0
bytes (its header write fails), ``data`` at 200 (the collective data write fails on the
aggregator), ``index`` at 300 (a state of two one-element tensors: their files fit, the
new index does not).

``odd``: ``fifo``, a FIFO at the path of ``sm.load``, ``fifo-index``, at a state
directory's ``index.json`` (rank 0 would block opening it); ``dtypes``, ``.npy`` files of
zero-size dtypes (``V0``, ``<U0``) and of objects: each load raises on every rank, naming
the file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import checkpoint
from sbpmpi.comm import file_io

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
ONLY_ROOT = ("header", "rename", "index")  # steps only rank 0 performs
READ_STEPS = ("open", "view", "data", "close")  # the steps of a read (sm.load)


def values(salt: float) -> dict[str, np.ndarray]:
    return {"w": np.arange(6.0 * (size + 1)).reshape(size + 1, 6) + salt,
            "b": (np.arange(7) * 3 + int(salt)).astype(np.int32)}


def tensors(salt: float) -> dict[str, sm.GlobalTensor]:
    pl = sm.placement("cpu", list(range(size)))
    v = values(salt)
    return {"w": sm.tensor(v["w"], placement=pl, sbp=sm.sbp.split(1)),
            "b": sm.tensor(v["b"], placement=pl, sbp=sm.sbp.broadcast)}


def snapshot(d: str) -> dict[str, str]:
    """Every file under ``d`` (hidden ones too) -> the SHA-256 of its bytes."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def result(call: str, step: str, fn) -> None:
    """Run ``fn`` (which must raise) and print this rank's RESULT line."""
    comm.Barrier()
    t0 = time.monotonic()
    try:
        fn()
        kind, msg = "no error", ""
    except Exception as e:
        kind, msg = type(e).__name__, str(e)
    seconds = time.monotonic() - t0
    print("RESULT " + json.dumps({"rank": rank, "call": call, "step": step, "type": kind,
                                  "message": msg, "seconds": round(seconds, 3)}), flush=True)


def check_intact(d: str, before: dict[str, str], step: str) -> None:
    comm.Barrier()
    after = snapshot(d) if rank == 0 else None
    after = comm.bcast(after, root=0)
    assert after == before, f"step {step}: the directory changed: {before} -> {after}"
    old = values(0.0)
    x = checkpoint.load(os.path.join(d, "x.npy"), placement=sm.placement("cpu", [0]),
                        sbp=sm.sbp.broadcast)
    got = x.numpy()
    assert got.dtype == old["w"].dtype and np.array_equal(got, old["w"]), step
    state = checkpoint.load_state(os.path.join(d, "state"))
    for k, v in old.items():
        got = state[k].numpy()
        assert got.dtype == v.dtype and np.array_equal(got, v), (step, k)
    print(f"INTACT rank {rank} step {step}", flush=True)


def failing(step: str, who: int, nth: int):
    """A fault hook: ``step`` fails on rank ``who`` the ``nth`` time this rank does it."""
    seen = [0]

    def hook(s: str, path: str) -> None:
        if s == step and rank == who:
            seen[0] += 1
            if seen[0] == nth:
                raise OSError(errno.ENOSPC, f"injected at {step}: No space left on device")
    return hook


def inject(d0: str, steps: list[str]) -> None:
    for step in steps:
        inject_one(os.path.join(d0, step.replace(" ", "-")), step)


def previous(d: str) -> dict[str, str]:
    """Save the previous checkpoint in the new directory ``d``; its files' digests."""
    if rank == 0:
        os.makedirs(d)
    comm.Barrier()
    checkpoint.save(tensors(0.0)["w"], os.path.join(d, "x.npy"))
    checkpoint.save_state(tensors(0.0), os.path.join(d, "state"))
    comm.Barrier()
    before = snapshot(d) if rank == 0 else None
    return comm.bcast(before, root=0)  # type: ignore[no-any-return]


def load_x(d: str) -> sm.GlobalTensor:
    """``x.npy`` read by every rank: each its own columns."""
    return checkpoint.load(os.path.join(d, "x.npy"),
                           placement=sm.placement("cpu", list(range(size))), sbp=sm.sbp.split(1))


def inject_one(d: str, step: str) -> None:
    """Save a previous checkpoint in ``d``, fail ``step`` on one rank, check it is intact."""
    before = previous(d)
    base = step.removeprefix("before ")
    who = 0 if base in ONLY_ROOT else size - 1
    new = tensors(100.0)
    if base != "index":
        file_io.set_fault_hook(failing(step, who, 1))
        result("sm.save", step, lambda: checkpoint.save(new["w"], os.path.join(d, "x.npy")))
    file_io.set_fault_hook(failing(step, who, 1 if base == "index" else 2))
    result("sm.save_state", step,
           lambda: checkpoint.save_state(new, os.path.join(d, "state")))
    if base in READ_STEPS:
        file_io.set_fault_hook(failing(step, who, 1))
        result("sm.load", step, lambda: load_x(d))
    file_io.set_fault_hook(None)
    check_intact(d, before, step)


def prepare(d: str) -> None:
    """Rank 1 cannot make the bytes of its block (the copy of a large shard, say) in each
    of sm.save, sm.save_state and sm.load; the others could."""
    d = os.path.join(d, "prepare")
    before = previous(d)
    orig = file_io.bytes_view

    def short_of_memory(a: np.ndarray) -> np.ndarray:
        if rank == 1:
            raise MemoryError(f"simulated: cannot allocate {a.nbytes} bytes for the block")
        return orig(a)

    new = tensors(100.0)
    file_io.bytes_view = short_of_memory  # type: ignore[assignment]
    result("sm.save", "prepare", lambda: checkpoint.save(new["w"], os.path.join(d, "x.npy")))
    result("sm.save_state", "prepare",
           lambda: checkpoint.save_state(new, os.path.join(d, "state")))
    result("sm.load", "prepare", lambda: load_x(d))
    file_io.bytes_view = orig  # type: ignore[assignment]
    check_intact(d, before, "prepare")


def fsize(d: str, where: str) -> None:
    limit = {"header": 0, "data": 200, "index": 300}[where]
    if where == "index":
        fsize_index(d, limit)
        return
    checkpoint.save(tensors(0.0)["w"], os.path.join(d, "x.npy"))
    comm.Barrier()
    before = snapshot(d) if rank == 0 else None
    before = comm.bcast(before, root=0)
    if rank == 0:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    new = sm.tensor(np.ones((1000, size)), placement=sm.placement("cpu", list(range(size))),
                    sbp=sm.sbp.split(1))
    result("sm.save", f"fsize-{where}", lambda: checkpoint.save(new, os.path.join(d, "x.npy")))
    if rank == 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
    comm.Barrier()
    after = snapshot(d) if rank == 0 else None
    after = comm.bcast(after, root=0)
    assert after == before, f"the directory changed: {before} -> {after}"
    got = checkpoint.load(os.path.join(d, "x.npy"), placement=sm.placement("cpu", [0]),
                          sbp=sm.sbp.broadcast).numpy()
    assert np.array_equal(got, values(0.0)["w"])
    print(f"INTACT rank {rank} step fsize-{where}", flush=True)


def fsize_index(d: str, limit: int) -> None:
    pl = sm.placement("cpu", list(range(size)))
    small = {"a": np.array([1.5]), "b": np.array([7], dtype=np.int64)}
    state = os.path.join(d, "state")
    checkpoint.save_state({k: sm.tensor(v, placement=pl, sbp=sm.sbp.broadcast)
                           for k, v in small.items()}, state)
    comm.Barrier()
    before = snapshot(d) if rank == 0 else None
    before = comm.bcast(before, root=0)
    if rank == 0:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    new = {k: sm.tensor(v * 2, placement=pl, sbp=sm.sbp.broadcast) for k, v in small.items()}
    result("sm.save_state", "fsize-index", lambda: checkpoint.save_state(new, state))
    if rank == 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
    comm.Barrier()
    after = snapshot(d) if rank == 0 else None
    after = comm.bcast(after, root=0)
    assert after == before, f"the directory changed: {before} -> {after}"
    got = checkpoint.load_state(state)
    assert all(np.array_equal(got[k].numpy(), v) for k, v in small.items())
    print(f"INTACT rank {rank} step fsize-index", flush=True)


def odd(d: str, case: str) -> None:
    pl = sm.placement("cpu", list(range(size)))
    state = os.path.join(d, "state")
    if case == "fifo-index":
        if rank == 0:
            os.makedirs(state)
            os.mkfifo(os.path.join(state, checkpoint.INDEX_NAME))
        comm.Barrier()
        result("sm.load_state", case, lambda: checkpoint.load_state(state))
        return
    names = ["fifo.npy"] if case == "fifo" else ["v0.npy", "u0.npy", "obj.npy"]
    if rank == 0 and case == "fifo":
        os.mkfifo(os.path.join(d, "fifo.npy"))
    elif rank == 0:
        np.save(os.path.join(d, "v0.npy"), np.zeros((10, 4), dtype="V0"))
        with open(os.path.join(d, "u0.npy"), "wb") as f:
            np.save(f, np.zeros((3,), dtype="<U1"))
        with open(os.path.join(d, "u0.npy"), "r+b") as f:  # the header of <U1 made <U0
            raw = f.read()
            f.seek(0)
            f.write(raw.replace(b"'<U1'", b"'<U0'"))
        np.save(os.path.join(d, "obj.npy"), np.array([{"a": 1}], dtype=object))
    comm.Barrier()
    for name in names:
        result("sm.load", name, lambda n=name: checkpoint.load(os.path.join(d, n), placement=pl,
                                                                sbp=sm.sbp.split(0)))


def main() -> None:
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "inject":
        inject(d, sys.argv[3:] or list(file_io.FAULT_POINTS))
    elif mode == "prepare":
        prepare(d)
    elif mode == "fsize":
        fsize(d, sys.argv[3])
    elif mode == "odd":
        odd(d, sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {mode}")
    comm.Barrier()
    print(f"DONE rank {rank}", flush=True)


main()
