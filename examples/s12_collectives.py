"""S12: collective communication with ``sm.comm``, the standard tutorial's values.

``sm.comm`` works in place on NumPy (CPU) or CuPy (GPU) arrays, with the names of
``torch.distributed``. Every step below is checked against the value NumPy computes.

    mpiexec -n 2 python examples/s12_collectives.py [--device cuda]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm
from sbpmpi.comm import ReduceOp


def main() -> None:
    ap = argparse.ArgumentParser(description="S12: collective communication")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    xp = sm.backend.get_xp(args.device)  # numpy, or cupy for --device cuda
    sm.launch.expect_world(2, what="S12")  # a note when run without mpiexec
    rank, p = sm.env.get_rank(), sm.env.get_world_size()
    comm = sm.comm
    log: list[str] = []

    def check(name: str, got: object, expected: object) -> None:
        got_np = sm.backend.asnumpy(got)
        np.testing.assert_array_equal(got_np, np.asarray(expected), err_msg=name)
        log.append(f"{name:<28} rank {rank}: {got_np.tolist()}")

    if p >= 2:
        # blocking point to point: rank 0 sends [1.], rank 1 receives into zeros
        t = xp.zeros(1)
        if rank == 0:
            t += 1
            comm.send(t, dst=1)
        elif rank == 1:
            comm.recv(t, src=0)
        check("send/recv", t, [1.0] if rank in (0, 1) else [0.0])
        # non-blocking: the buffer is not to be touched until wait()
        t = xp.zeros(1)
        req = None
        if rank == 0:
            t += 1
            req = comm.isend(t, dst=1)
        elif rank == 1:
            req = comm.irecv(t, src=0)
        if req is not None:
            req.wait()
        check("isend/irecv", t, [1.0] if rank in (0, 1) else [0.0])

    # broadcast from rank 0: rank 0 holds [1.], the others [0.]; all end with [1.]
    t = xp.ones(1) if rank == 0 else xp.zeros(1)
    comm.broadcast(t, src=0)
    check("broadcast src=0", t, [1.0])

    # reduce SUM to dst 1 (dst 0 with one rank): every rank holds [1.]; dst gets [p]
    dst = min(1, p - 1)
    t = xp.ones(1)
    comm.reduce(t, dst=dst, op=ReduceOp.SUM)
    if rank == dst:
        check(f"reduce SUM dst={dst}", t, [float(p)])

    # all_reduce SUM: ranks hold 1, 2, ..., and with 3 ranks [1.], [2.], [-3.] -> [0.]
    values = [float(r + 1) for r in range(p)]
    if p == 3:
        values = [1.0, 2.0, -3.0]
    t = xp.asarray([values[rank]])
    comm.all_reduce(t, op=ReduceOp.SUM)
    check("all_reduce SUM", t, [sum(values)])

    # gather to dst 1 and all_gather: rank r sends [r]; the list is [0.], [1.], ...
    t = xp.asarray([float(rank)])
    gather_list = [xp.zeros(1) for _ in range(p)] if rank == dst else None
    comm.gather(t, gather_list=gather_list, dst=dst)
    if rank == dst:
        assert gather_list is not None
        check(f"gather dst={dst}", xp.stack(gather_list), [[float(r)] for r in range(p)])
    out = [xp.zeros(1) for _ in range(p)]
    comm.all_gather(out, t)
    check("all_gather", xp.stack(out), [[float(r)] for r in range(p)])

    # scatter from rank 0 of the list [1.], [2.], ...: rank r receives [r + 1]
    t = xp.zeros(1)
    scatter_list = [xp.asarray([float(r + 1)]) for r in range(p)] if rank == 0 else None
    comm.scatter(t, scatter_list=scatter_list, src=0)
    check("scatter src=0", t, [float(rank + 1)])

    # reduce_scatter SUM: every rank holds the list [0.], [1.], ...; rank r gets [p * r]
    t = xp.zeros(1)
    comm.reduce_scatter(t, [xp.asarray([float(r)]) for r in range(p)], op=ReduceOp.SUM)
    check("reduce_scatter SUM", t, [float(p * rank)])

    lines = comm.all_gather_object(log)
    if rank == 0:
        for step in range(len(lines[0])):
            for r in range(p):
                if step < len(lines[r]):
                    print(lines[r][step])
        print("S12 OK")


if __name__ == "__main__":
    main()
