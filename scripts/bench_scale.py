"""Planning at scale: what one rank pays to plan and compile a conversion, against N.

    python scripts/bench_scale.py [--ranks 64,256,1024,4096,16384] [--limit 10]
        [--old PATH] [--json out.json]

One process per world size and code version simulates a virtual world of N ranks
(``sm.placement(..., world_size=N)``, no MPI): for each conversion (1-D, 2-D and 3-D
meshes, uneven splits, one move between placements) it times the first
``plan_conversion`` and the compilation of rank 0's program (``compile_plan``; the
communicators are stand-ins, a virtual world has none), then, in a second process,
the tracemalloc peak of the same work. ``--old PATH``: a checkout of the code to
compare with (a scratch worktree of 63f6f55), run through PYTHONPATH; a case over
``--limit`` seconds is reported as "> limit" and not tried at larger N. Times are the
process's CPU time (the machine may be shared), limits too.

Last, the cost table's predicted communication time of one GPT-2-small training step
per layout at 1,024 ranks (the sum of the chosen plans' modelled seconds; the default
cost table, one host's parameters: a model, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# -- one process: the cases of one world size ---------------------------------------------------

def _meshes(n: int) -> dict[str, Any]:
    import numpy as np

    import sbpmpi as sm

    rows = 1 << ((n.bit_length() - 1) // 2)
    a = 1 << ((n.bit_length() - 1) // 3)
    b = 1 << ((n // a).bit_length() - 1) // 2
    return {
        "1-D": sm.placement("cpu", list(range(n)), world_size=n),
        "2-D": sm.placement("cpu", np.arange(n).reshape(rows, n // rows).tolist(), world_size=n),
        "3-D": sm.placement("cpu", np.arange(n).reshape(a, b, n // (a * b)).tolist(),
                            world_size=n),
        "halves": (sm.placement("cpu", list(range(n // 2)), world_size=n),
                   sm.placement("cpu", list(range(n // 2, n)), world_size=n)),
    }


def _cases(n: int) -> list[tuple[str, str, Any, Any]]:
    """(mesh, conversion, source layout, destination layout)."""
    from sbpmpi.core.layout import Layout
    from sbpmpi.core.sbp import broadcast as B
    from sbpmpi.core.sbp import partial_sum as P
    from sbpmpi.core.sbp import split as S

    m = _meshes(n)
    one, two, three = m["1-D"], m["2-D"], m["3-D"]
    first, second = m["halves"]

    def L(shape: tuple[int, ...], pl: Any, sbp: Any) -> Any:
        return Layout.make(shape, pl, sbp)

    return [
        ("1-D", "S(0)->B", L((8 * n, 1024), one, S(0)), L((8 * n, 1024), one, B)),
        ("1-D", "P->S(1)", L((2, 256 * n + 3), one, P), L((2, 256 * n + 3), one, S(1))),
        ("1-D", "S(0)->S(1) uneven", L((16 * n + 3, 4101), one, S(0)),
         L((16 * n + 3, 4101), one, S(1))),
        ("2-D", "(S(0), P)->(B, S(1))", L((8 * n + 1, 3), two, (S(0), P)),
         L((8 * n + 1, 3), two, (B, S(1)))),
        ("2-D", "(S(0), S(1))->(S(1), S(0)) uneven", L((4 * n + 3, 4 * n + 5), two, (S(0), S(1))),
         L((4 * n + 3, 4 * n + 5), two, (S(1), S(0)))),
        ("3-D", "(S(0), B, P)->(B, S(1), B)", L((8 * n + 1, 64 * n), three, (S(0), B, P)),
         L((8 * n + 1, 64 * n), three, (B, S(1), B))),
        ("halves", "S(0)->S(0) between placements", L((8 * n + 3, 512), first, S(0)),
         L((8 * n + 3, 512), second, S(0))),
    ]


class _Group:
    """A stand-in communicator: what compiling a step reads of one (a virtual world has
    no MPI)."""

    def __init__(self, ranks: Any) -> None:
        self.ranks = tuple(int(r) for r in ranks)
        self.size = len(self.ranks)


class _Limit(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Limit


def worker(n: int, mode: str, limit: float, skip: set[str]) -> None:
    """Print one JSON line per case: milliseconds (mode "time") or MiB (mode "mem")."""
    import sbpmpi.comm as comm
    from sbpmpi.boxing.planner import plan_conversion
    from sbpmpi.runtime.execute import compile_plan

    comm.get_group = _Group  # type: ignore[assignment]
    signal.signal(signal.SIGPROF, _on_alarm)
    for mesh, name, src, dst in _cases(n):
        key = f"{mesh} {name}"
        if key in skip:
            continue
        row: dict[str, Any] = {"mesh": mesh, "conversion": name, "N": n}
        if mode == "mem":
            tracemalloc.start()
        t0 = time.process_time()
        signal.setitimer(signal.ITIMER_PROF, limit)
        try:
            plan = plan_conversion(src, dst, 4)
            t1 = time.process_time()
            compile_plan(plan, 0)
            t2 = time.process_time()
            signal.setitimer(signal.ITIMER_PROF, 0)
            if mode == "time":
                row.update(plan_ms=(t1 - t0) * 1e3, compile_ms=(t2 - t1) * 1e3,
                           steps=[s.kind for s in plan.steps])
            else:
                row["mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        except _Limit:
            row["over_limit"] = True
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            if mode == "mem":
                tracemalloc.stop()
        print(json.dumps(row), flush=True)


# -- the GPT step's predicted communication ------------------------------------------------------

def gpt_prediction(n: int = 1024) -> list[dict[str, Any]]:
    """Modelled communication seconds of one GPT-2-small step (12 layers, d 768, vocab
    50257, 1024 tokens, 8 sequences per data-parallel rank, float32) per layout on ``n``
    ranks: the chosen plans' seconds, one per conversion the step makes."""
    import numpy as np

    import sbpmpi as sm
    from sbpmpi.boxing.planner import plan_conversion
    from sbpmpi.core.layout import Layout
    from sbpmpi.core.sbp import broadcast as B
    from sbpmpi.core.sbp import partial_sum as P
    from sbpmpi.core.sbp import split as S

    layers, d, vocab, seq, batch = 12, 768, 50257, 1024, 8
    per_layer = [(d, 3 * d), (3 * d,), (d, d), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,),
                 (d,), (d,), (d,), (d,)]
    params = [(vocab, d), (seq, d)] + per_layer * layers + [(d,), (d,)]
    item = 4

    def cost(shape: tuple[int, ...], pl: Any, s1: Any, s2: Any) -> float:
        return plan_conversion(Layout.make(shape, pl, s1), Layout.make(shape, pl, s2),
                               item).seconds

    line = sm.placement("cpu", list(range(n)), world_size=n)
    tp = 8
    grid = sm.placement("cpu", np.arange(n).reshape(n // tp, tp).tolist(), world_size=n)
    out = []
    # data parallel: every gradient all-reduced
    dp = sum(cost(s, line, P, B) for s in params)
    out.append({"layout": f"data parallel ({n})", "seconds": dp,
                "what": "each gradient P -> B over all ranks"})
    # ZeRO-3 / FSDP: parameters gathered forward and backward, gradients reduce-scattered
    z3 = sum(2 * cost(s, line, S(0), B) + cost(s, line, P, S(0)) for s in params if s[0] >= n)
    z3 += sum(cost(s, line, P, B) for s in params if s[0] < n)
    out.append({"layout": f"ZeRO-3 ({n})", "seconds": z3,
                "what": "S(0) -> B twice and P -> S(0) per parameter (small ones P -> B)"})
    # data x tensor parallel (Megatron): 4 activation all-reduces per layer over the
    # tensor axis, gradients of the tensor-split parameters all-reduced over the data axis
    act = (n // tp * batch * seq, d)  # each data-parallel group's own batch
    mt = layers * 4 * cost(act, grid, (S(0), P), (S(0), B))
    mt += sum(cost(s, grid, (P, S(len(s) - 1)), (B, S(len(s) - 1))) for s in params)
    out.append({"layout": f"data {n // tp} x tensor {tp} (Megatron)", "seconds": mt,
                "what": "4 activation P -> B per layer on the tensor axis; gradients P -> B "
                        "on the data axis"})
    return out


# -- the driver ------------------------------------------------------------------------------------

def _run(path: str, n: int, mode: str, limit: float, skip: set[str]) -> list[dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=path)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(n), mode, str(limit),
           json.dumps(sorted(skip))]
    try:  # CPU limits per case; the wall clock only guards against a stuck process
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    if r.returncode:
        raise SystemExit(f"bench_scale: {' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]


def measure(path: str, ranks: list[int], limit: float) -> dict[str, dict[int, dict[str, Any]]]:
    """case -> N -> {plan_ms, compile_ms, steps, mib} or {over_limit}, from the code at ``path``."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    over: set[str] = set()
    for n in ranks:
        for row in _run(path, n, "time", limit, over):
            key = f"{row['mesh']} {row['conversion']}"
            out.setdefault(key, {})[n] = row
            if row.get("over_limit"):
                over.add(key)
        done = {k for k in out if n in out[k] and not out[k][n].get("over_limit")}
        for row in _run(path, n, "mem", limit, over | (set(out) - done)):
            key = f"{row['mesh']} {row['conversion']}"
            if "mib" in row:
                out[key][n]["mib"] = row["mib"]
    return out


def _cell(row: dict[str, Any] | None, limit: float) -> tuple[str, str]:
    if row is None or row.get("over_limit"):
        return f"> {limit:g} s", "-"
    ms = row["plan_ms"] + row["compile_ms"]
    mib = row.get("mib")
    return f"{ms:.1f}", "-" if mib is None else f"{mib:.2f}"


def table(new: dict, old: dict | None, ranks: list[int], limit: float) -> str:
    head = ["conversion", "N", "ms (new)", "MiB (new)"]
    if old is not None:
        head += ["ms (63f6f55)", "MiB (63f6f55)"]
    head.append("steps")
    if old is not None:
        head.append("same steps")
    rows = [head]
    for key, by_n in new.items():
        for n in ranks:
            row = by_n.get(n)
            cells = [key, str(n), *_cell(row, limit)]
            if old is not None:
                cells += list(_cell(old.get(key, {}).get(n), limit))
            cells.append(" ".join(row.get("steps", [])) if row else "")
            if old is not None:
                o = old.get(key, {}).get(n)
                cells.append("-" if not o or o.get("over_limit") or not row
                             else "yes" if o.get("steps") == row.get("steps") else "NO")
            rows.append(cells)
    widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
    return "\n".join("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
                     for r in rows[:1] + [["-" * w for w in widths]] + rows[1:])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="64,256,1024,4096,16384")
    ap.add_argument("--limit", type=float, default=10.0, help="seconds per case")
    ap.add_argument("--old", help="a checkout of the code to compare with")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    ranks = [int(x) for x in a.ranks.split(",")]
    new = measure(ROOT, ranks, a.limit)
    old = measure(os.path.abspath(a.old), ranks, a.limit) if a.old else None
    print(f"bench_scale: first plan + rank 0's compile of one conversion (CPU ms), one "
          f"process, virtual worlds; {os.cpu_count()} CPUs; limit {a.limit:g} s per case")
    print(table(new, old, ranks, a.limit))
    gpt = gpt_prediction(1024)
    print("\npredicted communication of one GPT-2-small step at 1,024 ranks "
          "(default cost table):")
    for g in gpt:
        print(f"  {g['layout']:<36} {g['seconds'] * 1e3:9.1f} ms   ({g['what']})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ranks": ranks, "limit_s": a.limit, "new": new, "old": old,
                       "gpt_step_1024": gpt, "date": time.strftime("%Y-%m-%d")}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.path.insert(0, os.environ.get("PYTHONPATH", ROOT))
        worker(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), set(json.loads(sys.argv[5])))
    else:
        sys.path.insert(0, ROOT)  # the GPT prediction: this checkout's planner
        main()
