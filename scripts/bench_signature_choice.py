"""First-call cost of choosing an op's signature: exhaustive search vs the pruned one.

    python scripts/bench_signature_choice.py [--json out.json]

Pure metadata (no MPI traffic): each case builds an op call on fake tensors of a 3-D or
2-D mesh, clears the caches (boxing plans and inferences) and times ``infer`` once with
the exhaustive search (``PRUNE_ABOVE`` raised) and once as shipped. It also prints the
exact modelled cost of the pruned choice against the exhaustive optimum.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))


from sbpmpi.boxing import planner  # noqa: E402
from sbpmpi.ops import inference  # noqa: E402
from sbpmpi.testing import signature_search_cases  # noqa: E402


def _clear():
    inference.clear_cache()
    for f in (planner._choice, planner._side_graph, planner._axis_step, planner.send_recv_step,
              planner._broadcast_step):
        f.cache_clear()


def _time(call, exhaustive: bool):
    saved = inference.PRUNE_ABOVE
    if exhaustive:
        inference.PRUNE_ABOVE = 10**9
    try:
        _clear()
        t = time.perf_counter()
        inf = inference.infer(call)
        return time.perf_counter() - t, inf
    finally:
        inference.PRUNE_ABOVE = saved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    print(f"{'case':24s} {'exhaustive ms':>14s} {'pruned ms':>10s} {'speed-up':>9s} "
          f"{'best us':>8s} {'pruned choice us':>17s}")
    for name, mk in signature_search_cases().items():
        call = mk()
        t_full, full = _time(call, True)
        t_pr, pr = _time(call, False)
        exact = {c.signature: c.total for c in full.candidates}
        rows.append({"case": name, "exhaustive_ms": t_full * 1e3, "pruned_ms": t_pr * 1e3,
                     "best_us": full.best.total * 1e6,
                     "pruned_choice_us": exact[pr.best.signature] * 1e6,
                     "pruned": pr.estimated})
        r = rows[-1]
        print(f"{name:24s} {r['exhaustive_ms']:14.1f} {r['pruned_ms']:10.1f} "
              f"{r['exhaustive_ms'] / r['pruned_ms']:9.1f} {r['best_us']:8.2f} "
              f"{r['pruned_choice_us']:17.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
