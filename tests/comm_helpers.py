"""Helpers for the sbpmpi.comm tests: rank-dependent data, NumPy references, a checker.

A failed comparison on one rank must not make that rank skip the collectives the
others still run (they would hang), so comparisons are collected by ``chk`` and
raised on every rank when the test ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from mpi4py import MPI

from sbpmpi.comm import ReduceOp

world = MPI.COMM_WORLD

NUMERIC = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
           np.uint64, np.float16, np.float32, np.float64, np.longdouble, np.complex64,
           np.complex128, np.clongdouble]
OPAQUE = ["datetime64[s]", "U3", [("a", "i4"), ("b", "f8")], ">f8"]
UFUNC = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum,
         ReduceOp.MIN: np.minimum, ReduceOp.AVG: np.add}


def data(r: int, n: int, dtype, seed: int = 0) -> np.ndarray:
    """Rank ``r``'s input: small integer values, so sums and products are exact."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng([seed, r, n, 7])
    if dt.kind == "b":
        return rng.random(n) < 0.5
    if dt.kind == "u":
        return rng.integers(0, 4, n).astype(dt)
    if dt.kind in "if":
        return rng.integers(-3, 4, n).astype(dt)
    if dt.kind == "c":
        return (rng.integers(-3, 4, n) + 1j * rng.integers(-3, 4, n)).astype(dt)
    if dt.kind == "M":
        return rng.integers(0, 10**9, n).astype(dt)
    if dt.kind == "U":
        return np.array([f"{r}{v}" for v in rng.integers(0, 99, n)], dtype=dt)
    if dt.fields is not None:
        out = np.zeros(n, dtype=dt)
        out["a"] = rng.integers(-99, 99, n)
        out["b"] = rng.random(n) + r
        return out
    return rng.integers(-9, 9, n).astype(dt)


def reference(stack: np.ndarray, op: ReduceOp, p: int) -> np.ndarray:
    """The reduction of ``stack`` over axis 0, as NumPy computes it in the same dtype."""
    dt = stack.dtype
    out = UFUNC[op].reduce(stack, axis=0, dtype=dt)
    if op is ReduceOp.AVG:
        out = out / dt.type(p)
    return out


def reduction_ok(dt, op) -> bool:
    dt = np.dtype(dt)
    if op is ReduceOp.AVG and dt.kind in "biu":
        return False
    return not (op in (ReduceOp.MAX, ReduceOp.MIN) and dt.kind == "c")


def _native(dt: np.dtype) -> np.dtype:
    return dt.newbyteorder("=") if dt.fields is None else dt


def assert_same(got, want, msg: str = "") -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert _native(got.dtype) == _native(want.dtype), f"{msg}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{msg}: shape {got.shape} != {want.shape}"
    np.testing.assert_array_equal(got, want, err_msg=msg)


class Checker:
    """Collects failed comparisons; ``close()`` raises them on every rank."""

    def __init__(self) -> None:
        self.fails: list[str] = []

    def same(self, got, want, msg: str = "") -> None:
        try:
            assert_same(got, want, msg)
        except AssertionError as e:
            self.fails.append(f"rank {world.Get_rank()}: {e}")

    def true(self, cond: bool, msg: str) -> None:
        if not cond:
            self.fails.append(f"rank {world.Get_rank()}: {msg}")

    def close(self) -> None:
        every = world.allgather(self.fails)
        bad = [f for fails in every for f in fails]
        self.fails = []
        assert not bad, "\n".join(bad[:8])


def checker() -> Iterator[Checker]:
    """Body of the ``chk`` fixture: a Checker whose failures are raised at teardown."""
    c = Checker()
    yield c
    c.close()


# ----------------------------------------------------------------------------- every backend
# Every comm call on arrays made by ``mk`` (NumPy -> backend), read back by ``host``; ``aware``
# is the forced CUDA-awareness (None for NumPy arrays). The conftest ``array_backend`` fixture
# supplies (mk, host, aware) for NumPy, the fake CUDA array and CuPy.


def ipc_calls() -> int:
    """The calls the CUDA IPC transport has carried in this process, over every group."""
    from sbpmpi.comm.gpu import route

    return sum(t.stats["calls"] for t in route.transports().values() if not isinstance(t, str))


def run_collectives(chk, mk, host, aware: bool | None, n: int = 5, ipc: bool = False) -> None:
    """The fixed-size collectives. Whether a call went over CUDA IPC (never staged) or MPI
    is asked of the transport (with ``SBPMPI_GPU_TRANSPORT=ipc`` it carries the device
    cases); ``ipc``: it must have."""
    import sbpmpi as sm
    from sbpmpi import comm as C

    rank = world.Get_rank()
    p = world.Get_size()
    allx = [data(r, n, np.float32, 1) for r in range(p)]
    before = ipc_calls()
    with sm.trace() as t:
        x = mk(allx[rank])
        C.all_reduce(x)
    carried = ipc_calls() > before
    chk.same(host(x), sum(allx), "all_reduce")
    dev = "cpu" if aware is None else "cuda"
    chk.true(t[0].device == dev and t[0].staged == (aware is False and not carried),
             f"trace {t[0]} (carried by CUDA IPC: {carried})")
    chk.true(carried or not ipc, "CUDA IPC carried the all_reduce")
    for op in ReduceOp:
        x = mk(allx[rank])
        C.all_reduce(x, op=op)
        want = {ReduceOp.SUM: sum(allx), ReduceOp.PROD: np.prod(allx, axis=0),
                ReduceOp.MAX: np.max(allx, axis=0), ReduceOp.MIN: np.min(allx, axis=0),
                ReduceOp.AVG: np.add.reduce(np.stack(allx), axis=0) / np.float32(p)}[op]
        chk.same(host(x), want, f"all_reduce {op}")
    h16 = [data(r, n, np.float16, 2) for r in range(p)]
    before = ipc_calls()
    with sm.trace() as t:
        x = mk(h16[rank])
        C.all_reduce(x)  # a user-defined MPI op: staged even when aware
    carried = ipc_calls() > before
    chk.same(host(x), np.add.reduce(np.stack(h16), axis=0, dtype=np.float16), "float16 sum")
    chk.true(carried or not ipc, "CUDA IPC carried the float16 all_reduce")
    chk.true(t[0].staged == (aware is not None and not carried),
             "float16 reductions: host memory on MPI, device on IPC")
    x = mk(allx[rank])
    C.broadcast(x, src=p - 1)
    chk.same(host(x), allx[p - 1], "broadcast")
    x = mk(allx[rank])
    C.reduce(x, dst=0, op=ReduceOp.MAX)
    chk.same(host(x), np.max(allx, axis=0) if rank == 0 else allx[rank], "reduce")
    out = mk(np.zeros((p, n), np.float32))
    C.all_gather(out, mk(allx[rank]))
    chk.same(host(out), np.stack(allx), "all_gather")
    outl = [mk(np.zeros(n, np.float32)) for _ in range(p)]
    C.all_gather(outl, mk(allx[rank]))
    chk.same(np.stack([host(o) for o in outl]), np.stack(allx), "all_gather list")
    out = mk(np.zeros((p, n), np.float32)) if rank == 0 else None
    C.gather(mk(allx[rank]), out, dst=0)
    if rank == 0:
        chk.same(host(out), np.stack(allx), "gather")
    big = [data(r, p * n, np.float32, 3) for r in range(p)]
    x = mk(np.zeros(n, np.float32))
    C.scatter(x, mk(big[0]) if rank == 0 else None, src=0)
    chk.same(host(x), big[0][rank * n:(rank + 1) * n], "scatter")
    C.scatter(x, [mk(big[0][i * n:(i + 1) * n]) for i in range(p)] if rank == 0 else None)
    chk.same(host(x), big[0][rank * n:(rank + 1) * n], "scatter list")
    C.reduce_scatter(x, mk(big[rank]), op=ReduceOp.AVG)
    chk.same(host(x), (np.add.reduce(np.stack(big), axis=0) / np.float32(p))[rank * n:(rank + 1) * n],
             "reduce_scatter avg")
    out = mk(np.zeros(p * n, np.float32))
    C.all_to_all(out, mk(big[rank]))
    chk.same(host(out), np.concatenate([b[rank * n:(rank + 1) * n] for b in big]), "all_to_all")


def run_vcollectives(chk, mk, host) -> None:
    """The v-collectives with uneven counts (some zero) and with gaps between blocks."""
    from sbpmpi import comm as C

    rank, p = world.Get_rank(), world.Get_size()
    counts = [r % 3 for r in range(p)]
    v = [data(r, counts[r], np.float64, 4) for r in range(p)]
    out = mk(np.zeros(sum(counts)))
    C.all_gather_v(out, mk(v[rank]), counts)
    chk.same(host(out), np.concatenate(v), "all_gather_v")
    # with gaps between the blocks: the gaps keep their values
    gd = [sum(counts[:r]) + 2 * r + 1 for r in range(p)]
    filler = np.full(sum(counts) + 2 * p + 1, -7.0)
    out = mk(filler)
    C.all_gather_v(out, mk(v[rank]), counts, gd)
    want = filler.copy()
    for r in range(p):
        want[gd[r]:gd[r] + counts[r]] = v[r]
    chk.same(host(out), want, "all_gather_v with gaps")
    out = mk(filler) if rank == 0 else None
    C.gather_v(mk(v[rank]), out, counts, gd, dst=0)
    if rank == 0:
        chk.same(host(out), want, "gather_v with gaps")
    out = mk(np.zeros(sum(counts))) if rank == 0 else None
    C.gather_v(mk(v[rank]), out, counts, dst=0)
    if rank == 0:
        chk.same(host(out), np.concatenate(v), "gather_v")
    x = mk(np.zeros(counts[rank]))
    C.scatter_v(x, mk(np.concatenate(v)) if rank == 0 else None, counts, src=0)
    chk.same(host(x), v[rank], "scatter_v")
    tot = [data(r, sum(counts), np.float64, 5) for r in range(p)]
    x = mk(np.zeros(counts[rank]))
    C.reduce_scatter_v(x, mk(tot[rank]), counts)
    off = sum(counts[:rank])
    chk.same(host(x), sum(tot)[off:off + counts[rank]], "reduce_scatter_v")
    sc = [[(i + j) % 2 + 1 for j in range(p)] for i in range(p)]
    ins = [data(i, sum(sc[i]), np.int16, 6) for i in range(p)]
    oc = [sc[i][rank] for i in range(p)]
    out = mk(np.zeros(sum(oc), np.int16))
    C.all_to_all_v(out, oc, mk(ins[rank]), sc[rank])
    chk.same(host(out), np.concatenate([ins[i][sum(sc[i][:rank]):sum(sc[i][:rank + 1])]
                                        for i in range(p)]), "all_to_all_v")


def run_p2p(chk, mk, host, n: int = 5) -> None:
    """A ring of isend/irecv, and of blocking send/recv where there are two ranks or more."""
    from sbpmpi import comm as C

    rank, p = world.Get_rank(), world.Get_size()
    allx = [data(r, n, np.float32, 1) for r in range(p)]
    # point to point ring
    nxt, prv = (rank + 1) % p, (rank - 1) % p
    got = mk(np.zeros(n, np.float32))
    w = C.irecv(got, src=prv, tag=4)
    C.isend(mk(allx[rank]), dst=nxt, tag=4).wait()
    w.wait()
    chk.same(host(got), allx[prv], "isend/irecv")
    if p > 1:
        got = mk(np.zeros(n, np.float32))
        if rank % 2 == 0:
            C.send(mk(allx[rank]), dst=nxt)
            C.recv(got, src=prv)
        else:
            C.recv(got, src=prv)
            C.send(mk(allx[rank]), dst=nxt)
        chk.same(host(got), allx[prv], "send/recv")


def run_all(chk, mk, host, aware: bool | None, n: int = 5, ipc: bool = False) -> None:
    """Every call: collectives, v-collectives, point-to-point."""
    run_collectives(chk, mk, host, aware, n, ipc)
    run_vcollectives(chk, mk, host)
    run_p2p(chk, mk, host, n)
