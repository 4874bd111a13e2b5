"""S11: launching, and the variables code from PyTorch / OneFlow reads.

Run it any of these ways; each rank prints RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE (and MASTER_ADDR / MASTER_PORT under the launcher):

    mpiexec -n 4 python examples/s11_launch_env.py
    python -m sbpmpi.launch -n 4 examples/s11_launch_env.py
    srun -n 4 python examples/s11_launch_env.py          # in a Slurm allocation

``python -m sbpmpi.launch`` sets the variables before the program starts; under plain
``mpiexec``/``srun`` the program calls ``sm.env.set_launcher_env()``. Two machines
with two ranks each give RANK 0,1,2,3 and LOCAL_RANK 0,1,0,1. With ``--device cuda``
each rank also shows the GPU it is bound to: ``LOCAL_RANK % (GPUs it sees)``.
"""

from __future__ import annotations

import argparse
import os
import socket

import sbpmpi as sm

NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def main() -> None:
    ap = argparse.ArgumentParser(description="S11: launcher variables")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    launched = "RANK" in os.environ and "LOCAL_RANK" in os.environ
    if not launched:
        sm.env.set_launcher_env()  # plain mpiexec / srun: set them from MPI now
    sm.launch.expect_world(4, what="S11")  # a note when run without mpiexec
    rank, world = sm.env.get_rank(), sm.env.get_world_size()
    gpu = ""
    if args.device == "cuda":
        dev = sm.backend.bind_device()
        gpu = (f" GPU {dev} of {sm.backend.cuda_device_count()} visible "
               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    host = socket.gethostname()
    row = {k: os.environ.get(k, "-") for k in NAMES}
    rows = sm.comm.all_gather_object((host, row, gpu))
    if rank == 0:
        print("started by", "sbpmpi.launch" if launched else "mpiexec/srun "
              "(variables set by sm.env.set_launcher_env())")
        table = [("host", *NAMES)] + [(h, *(r[k] for k in NAMES)) for h, r, _ in rows]
        widths = [max(len(str(row[i])) for row in table) for i in range(len(table[0]))]
        for i, row in enumerate(table):
            gpu = rows[i - 1][2] if i else ""
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() + gpu)

    # check against MPI: RANK and WORLD_SIZE are the world's; LOCAL_RANK counts the
    # lower ranks on the same host, LOCAL_WORLD_SIZE all ranks on it
    hosts = [h for h, _, _ in rows]
    assert int(os.environ["RANK"]) == rank
    assert int(os.environ["WORLD_SIZE"]) == world
    assert int(os.environ["LOCAL_RANK"]) == hosts[:rank].count(host), os.environ["LOCAL_RANK"]
    assert int(os.environ["LOCAL_WORLD_SIZE"]) == hosts.count(host)
    assert sm.env.get_local_rank() == int(os.environ["LOCAL_RANK"])
    if launched:
        assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for _, r, _ in rows}) == 1
    if rank == 0:
        print("S11 OK")


if __name__ == "__main__":
    main()
