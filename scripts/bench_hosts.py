"""Benchmark across hosts: boxing conversions and a data-parallel step on 2 hosts x 2 ranks.

    python scripts/bench_hosts.py [--runs 3] [--rate 10gbit --delay 20us] [--json out.json]

Root, Linux: the driver makes a cluster of hosts on this machine (tests/tools/hosts_cluster.py:
network namespaces joined by a bridge, MPI started across them with the library's
defaults), shapes each host's link (``tc netem``: ``--rate`` and ``--delay``, 10 Gbit/s
and 20 us by default) so that the network, not shared memory, is the slow link, and
starts the MPI run ``--runs`` times. Each run, at ``--hosts`` x ``--ppn`` ranks:

* the conversions P->B, S(0)->B, P->S(0), S(0)->S(1) of a float32 tensor at
  ``--sizes-mib`` (1, 16, 64): ``sm.boxing.box`` (sbpmpi's plan, hierarchical where the
  planner finds it cheaper), the flat plan (the same conversion planned as if on one host,
  its program run directly), the raw mpi4py call (the MPI library's own algorithm), and
  torch.distributed on gloo across the same hosts (all_reduce for P->B, all_gather for
  S(0)->B; gloo has neither reduce-scatter nor all-to-all on CPU). Interleaved after a
  warm-up; each repeat's time is the slowest rank's; a run reports medians;
* a data-parallel training step (scripts/bench_train.py's MLPs: ``sm.nn.DataParallel``
  against torch ``DistributedDataParallel`` on gloo), one run of bench_train per run.

The driver prints, per row, the median over the runs of the runs' medians (the machine is
shared: quote medians, and the spread the JSON holds), and writes everything with
``--json``. ``--worker`` is the MPI program itself (not for direct use).
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, NamedTuple  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONVERSIONS = ("P->B", "S(0)->B", "P->S(0)", "S(0)->S(1)")
METHODS = ("sbpmpi", "flat", "mpi4py", "gloo")
TRAIN_MODELS = "compute-bound,deep"


class Row(NamedTuple):
    """One conversion at one size in one run: milliseconds per method (None: not measured)
    and the plans sbpmpi and the flat planning chose."""

    conversion: str
    mib: float
    ms: dict[str, float | None]
    plan: str
    flat_plan: str


# -- the MPI program ------------------------------------------------------------------------

def _gloo(rank: int, size: int) -> Any:
    """torch.distributed on gloo across the hosts, or None where torch is not importable."""
    try:
        import torch
        import torch.distributed as dist
    except Exception:  # noqa: BLE001 - any import failure: not available here
        return None
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=size)
    return torch


def worker(a: argparse.Namespace) -> int:
    from mpi4py import MPI

    import sbpmpi as sm
    from sbpmpi.boxing.cost import Topology
    from sbpmpi.runtime import cost_table
    from sbpmpi.runtime.execute import compile_plan

    world = MPI.COMM_WORLD
    me, p = world.Get_rank(), world.Get_size()
    torch = _gloo(me, p)
    # the flat plans: planned as if every rank were on one host
    one_host = cost_table.get_cost_table().with_topology(Topology((0,) * p))
    sbps = {"P->B": sm.sbp.broadcast, "S(0)->B": sm.sbp.broadcast,
            "P->S(0)": sm.sbp.split(0), "S(0)->S(1)": sm.sbp.split(1)}
    rows: list[Row] = []
    for mib in a.sizes_mib:
        for name in CONVERSIONS:
            src = _source(sm, name, mib, p, me)
            to = sbps[name]
            plan = sm.boxing.plan_for(src, None, to)
            prev = cost_table.set_cost_table(one_host)
            try:
                flat_plan = sm.boxing.plan_for(src, None, to)
            finally:
                cost_table.set_cost_table(prev)
            flat_prog = compile_plan(flat_plan, me)
            local = src.to_local()
            fns: dict[str, Callable[[], Any] | None] = {
                "sbpmpi": lambda s=src, t=to: sm.boxing.box(s, None, t),
                "flat": lambda prog=flat_prog, lc=local: prog(lc),
                "mpi4py": _raw_call(world, name, local, p),
                "gloo": _gloo_call(torch, name, local, p)}
            ms = _time(fns, a.repeats, a.warmup, world)
            rows.append(Row(name, mib, ms, plan.summary(), flat_plan.summary()))
            if me == 0:
                print(_row_text(rows[-1]), flush=True)
    if me == 0:
        Path(a.json).write_text(json.dumps([r._asdict() for r in rows]))
    if torch is not None:
        torch.distributed.destroy_process_group()
    return 0


def _raw_call(world: Any, name: str, local: Any, p: int) -> Callable[[], Any]:
    """The mpi4py call a user would write for ``name`` (a fresh output, as sbpmpi's)."""
    import numpy as np
    from mpi4py import MPI

    if name == "P->B":
        def all_reduce() -> Any:
            o = np.empty_like(local)
            world.Allreduce(local, o, op=MPI.SUM)
            return o
        return all_reduce
    if name == "P->S(0)":
        def reduce_scatter() -> Any:
            o = np.empty((local.shape[0] // p, *local.shape[1:]), local.dtype)
            world.Reduce_scatter_block(local, o, op=MPI.SUM)
            return o
        return reduce_scatter
    if name == "S(0)->B":
        def all_gather() -> Any:
            o = np.empty((local.shape[0] * p, *local.shape[1:]), local.dtype)
            world.Allgather(local, o)
            return o
        return all_gather
    r, cols = local.shape
    c = cols // p

    def all_to_all() -> Any:  # S(0) -> S(1): pack the column blocks
        send = np.ascontiguousarray(local.reshape(r, p, c).transpose(1, 0, 2))
        o = np.empty((r * p, c), local.dtype)
        world.Alltoall(send, o)
        return o
    return all_to_all


def _source(sm: Any, name: str, mib: float, p: int, me: int) -> Any:
    """The conversion's input: a float32 ``(rows, 240)`` global tensor of about ``mib`` MiB,
    P (every rank a whole addend) or S(0) (rows divisible by 2p, as bench's)."""
    import numpy as np

    cols = 240
    rows = max(p, int(mib * (1 << 20)) // (cols * 4) // (2 * p) * (2 * p))
    pl = sm.placement("cpu", list(range(p)))
    rng = np.random.default_rng(me)
    if name.startswith("P"):
        return sm.to_global(rng.standard_normal((rows, cols)).astype(np.float32),
                            placement=pl, sbp=sm.sbp.partial_sum)
    return sm.to_global(rng.standard_normal((rows // p, cols)).astype(np.float32),
                        placement=pl, sbp=sm.sbp.split(0))


def _gloo_call(torch: Any, name: str, local: Any, p: int) -> Callable[[], Any] | None:
    """torch.distributed's call for ``name`` on gloo (a fresh output, as the others)."""
    if torch is None:
        return None
    dist = torch.distributed
    t = torch.from_numpy(local.copy())
    if name == "P->B":
        def all_reduce() -> Any:
            o = t.clone()
            dist.all_reduce(o)
            return o
        return all_reduce
    if name == "S(0)->B":
        def all_gather() -> Any:
            parts = [torch.empty_like(t) for _ in range(p)]
            dist.all_gather(parts, t)
            return torch.cat(parts)
        return all_gather
    return None  # gloo on CPU: no reduce_scatter, no all_to_all


def _time(fns: dict[str, Callable[[], Any] | None], repeats: int, warmup: int,
          world: Any) -> dict[str, float | None]:
    """Median milliseconds of the slowest rank, the methods interleaved."""
    import numpy as np
    from mpi4py import MPI

    live = {k: f for k, f in fns.items() if f is not None}
    for _ in range(warmup):
        for f in live.values():
            f()
    times: dict[str, list[float]] = {k: [] for k in live}
    for _ in range(repeats):
        for k, f in live.items():
            world.Barrier()
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    out: dict[str, float | None] = {k: None for k in fns}
    for k, ts in times.items():
        slowest = np.array(ts)
        world.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
        out[k] = float(np.median(slowest)) * 1e3
    return out


def _row_text(r: Row) -> str:
    cells = "".join(f"{r.ms[m]:>10.2f}" if r.ms.get(m) is not None else f"{'-':>10}"
                    for m in METHODS)
    return f"{r.conversion:<12}{r.mib:>5g}{cells}  {r.plan}"


# -- the driver -----------------------------------------------------------------------------

def _hosts_cluster() -> Any:
    """tests/tools/hosts_cluster.py, loaded by path."""
    spec = importlib.util.spec_from_file_location("_sbpmpi_hosts_cluster",
                                                  ROOT / "tests" / "tools" / "hosts_cluster.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _job(c: Any, a: argparse.Namespace, cmd: list[str]) -> None:
    env = c.env(a.ppn)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # torch.distributed's rendezvous on the first host; gloo on the hosts' interface
    env.update(MASTER_ADDR=c.hosts[0].address, MASTER_PORT=str(29500 + os.getpid() % 1000),
               GLOO_SOCKET_IFNAME="eth0", MPIEXEC_TIMEOUT=str(a.timeout))
    subprocess.run(c.mpiexec(a.hosts * a.ppn, a.ppn) + cmd, env=env, cwd=ROOT, check=True,
                   timeout=a.timeout + 30)


def _median(xs: list[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return statistics.median(got) if got else None


def driver(a: argparse.Namespace) -> int:
    hc = _hosts_cluster()
    why = hc.unavailable()
    if why:
        print(f"bench_hosts: no cluster of hosts here: {why}", file=sys.stderr)
        return 2
    exe = os.environ.get("SBPMPI_MPIEXEC") or shutil.which("mpiexec")
    # a SIGTERM ends through the ``with`` below: the hosts go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: list[list[dict[str, Any]]] = []
    trains: list[list[dict[str, Any]]] = []
    with hc.start(a.hosts, mpiexec=exe) as c, tempfile.TemporaryDirectory() as tmp:
        links = c.shape(a.rate, a.delay) if a.rate or a.delay else "unshaped"
        print(f"{a.hosts} hosts x {a.ppn} ranks, links: {links}", flush=True)
        me = [sys.executable, str(Path(__file__).resolve()), "--worker",
              "--sizes-mib", ",".join(f"{s:g}" for s in a.sizes_mib),
              "--repeats", str(a.repeats), "--warmup", str(a.warmup)]
        for i in range(a.runs):
            out = Path(tmp) / f"boxing-{i}.json"
            print(f"-- run {i + 1}/{a.runs}: conversions (ms)\n{'':<12}{'MiB':>5}"
                  + "".join(f"{m:>10}" for m in METHODS) + "  sbpmpi's plan", flush=True)
            _job(c, a, [*me, "--json", str(out)])
            runs.append(json.loads(out.read_text()))
            if a.train:
                tout = Path(tmp) / f"train-{i}.json"
                print(f"-- run {i + 1}/{a.runs}: data-parallel step", flush=True)
                _job(c, a, [sys.executable, str(ROOT / "scripts" / "bench_train.py"),
                            "--models", a.train, "--reps", str(a.train_reps),
                            "--json", str(tout)])
                trains.append(json.loads(tout.read_text())["results"])
    table = summarize(runs)
    train = summarize_train(trains)
    print(format_table(table, a, links, len(runs)))
    if train:
        print(format_train(train, len(trains)))
    if a.json:
        Path(a.json).write_text(json.dumps({
            "hosts": a.hosts, "ppn": a.ppn, "links": links, "runs": len(runs),
            "conversions": table, "train": train, "raw_runs": runs, "raw_train": trains},
            indent=1))
    return 0


def summarize(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per conversion and size: the median over runs of each method's ms, and the ratios."""
    out = []
    for i, first in enumerate(runs[0]):
        rows = [r[i] for r in runs]
        ms = {m: _median([r["ms"].get(m) for r in rows]) for m in METHODS}
        ours = ms["sbpmpi"]
        out.append({
            "conversion": first["conversion"], "mib": first["mib"], "ms": ms,
            "per_run_sbpmpi_ms": [r["ms"]["sbpmpi"] for r in rows],
            "plan": first["plan"], "flat_plan": first["flat_plan"],
            "vs_mpi4py": ours / ms["mpi4py"] if ours and ms["mpi4py"] else None,
            "flat_over_sbpmpi": ms["flat"] / ours if ours and ms["flat"] else None,
            "vs_gloo": ours / ms["gloo"] if ours and ms["gloo"] else None})
    return out


def summarize_train(trains: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per model: the median over runs of each variant's step (bench_train's rows)."""
    if not trains:
        return []
    out: dict[str, dict[str, Any]] = {}
    for run in trains:
        for r in run:
            row = out.setdefault(r["model"], {"model": r["model"], "shape": r["shape"],
                                              "runs_ms": {}})
            row["runs_ms"].setdefault(r["variant"], []).append(r["step_ms"])
    for row in out.values():
        row["ms"] = {k: statistics.median(v) for k, v in row["runs_ms"].items()}
        dp, ddp = row["ms"].get("DP buckets"), row["ms"].get("torch DDP")
        row["dp_over_ddp"] = dp / ddp if dp and ddp else None
    return list(out.values())


def _cell(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def format_table(table: list[dict[str, Any]], a: argparse.Namespace, links: str,
                 runs: int) -> str:
    lines = [f"\nconversions, {a.hosts} hosts x {a.ppn} ranks, float32, links {links}; "
             f"medians over {runs} run(s) of each run's median of {a.repeats} (slowest rank)",
             "| conversion | MiB | sbpmpi ms | flat plan ms | mpi4py ms | gloo ms "
             "| sbpmpi / mpi4py | flat / sbpmpi | sbpmpi's plan |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in table:
        ms = r["ms"]
        lines.append(f"| {r['conversion']} | {r['mib']:g} | {_cell(ms['sbpmpi'])} | "
                     f"{_cell(ms['flat'])} | {_cell(ms['mpi4py'])} | {_cell(ms['gloo'])} | "
                     f"{_cell(r['vs_mpi4py'])} | {_cell(r['flat_over_sbpmpi'])} | "
                     f"{r['plan']} |")
    return "\n".join(lines)


def format_train(train: list[dict[str, Any]], runs: int) -> str:
    lines = [f"\ndata-parallel step across hosts (scripts/bench_train.py, float64 MLPs), "
             f"medians over {runs} run(s) of medians (ms)",
             "| model | sbpmpi DP (buckets) | sbpmpi DP plain | mpi4py by hand | torch DDP "
             "| DP / DDP |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in train:
        ms = r["ms"]
        lines.append(f"| {r['model']} | {_cell(ms.get('DP buckets'))} | "
                     f"{_cell(ms.get('DP plain'))} | {_cell(ms.get('mpi4py by hand'))} | "
                     f"{_cell(ms.get('torch DDP'))} | {_cell(r['dp_over_ddp'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ppn", type=int, default=2, help="ranks per host")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes-mib", default="1,16,64")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rate", default="10gbit", help="each host's link rate (tc netem)")
    ap.add_argument("--delay", default="20us", help="each host's link delay (tc netem)")
    ap.add_argument("--train", default=TRAIN_MODELS,
                    help="bench_train.py models for the DP step ('' skips it)")
    ap.add_argument("--train-reps", type=int, default=11)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per MPI run")
    ap.add_argument("--json", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.sizes_mib = [float(x) for x in a.sizes_mib.split(",") if x]
    if a.hosts < 2 or a.ppn < 1 or a.runs < 1 or a.repeats < 1:
        ap.error(f"--hosts must be >= 2 and --ppn, --runs, --repeats >= 1, got "
                 f"{a.hosts}, {a.ppn}, {a.runs}, {a.repeats}")
    return worker(a) if a.worker else driver(a)


if __name__ == "__main__":
    sys.exit(main())
