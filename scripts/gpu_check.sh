#!/usr/bin/env bash
# The whole GPU check of issue 13 in one go, for a session that has a GPU machine.
#
# Here (a machine with a package index):   bash ../shared/gpu/wheels.sh     # fills .whl/
# There (run tool, carry [".whl"]):        bash scripts/gpu_check.sh [OUTDIR]
#
# OUTDIR defaults to $OUT (the run tool's folder that comes back) or gpu-check/. Steps, each
# logged to OUTDIR/NN-name.txt, all run even when one fails; the exit status is the number
# of failed steps:
#   1. info per transport (which transport and why, IPC counters)
#   2. the README's test command at n = 1..4 (the "cuda" parameters are active there), with
#      the default transport (staged on a non-CUDA-aware MPI)
#   3. the CUDA IPC suites at n = 1..4 with SBPMPI_GPU_TRANSPORT=ipc, and the GPU parts of
#      the boxing and comm tests over IPC; then at n = 4 as two pseudo-nodes of two ranks
#      (SBPMPI_IPC_NODE_SIZE=2: hierarchical, the inter-node leg staged through MPI)
#   4. calibration per transport (refreshes the cache file; prints the tables)
#   5. the GPU benchmark (staged mpi4py and the device-copy proxy in the same run) at 2 and
#      4 ranks, per transport, as tables and JSON
# Environment: SIZES (default 1,2,3,4), BENCH_SIZES (default 1M,16M,64M), TRANSPORTS
# (default "staged ipc"), SKIP (steps to leave out, e.g. "2 4").
set -u
OUTDIR=${1:-${OUT:-gpu-check}}
mkdir -p "$OUTDIR"
SIZES=${SIZES:-1,2,3,4}
BENCH_SIZES=${BENCH_SIZES:-1M,16M,64M}
TRANSPORTS=${TRANSPORTS:-staged ipc}
SKIP=${SKIP:-}
PY=${PYTHON:-python3}

# The machine's Python has no package index: install the carried wheels (mpi4py >= 4,
# pytest-mpi) into a private site, as ../shared/gpu/wheels.sh explains.
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
# Open MPI 4.1 as root, oversubscribed, shared memory inside a VM (../shared/gpu/env.sh).
if [ -f ../shared/gpu/env.sh ]; then
  . ../shared/gpu/env.sh
else
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  export PYTHONUNBUFFERED=1
fi
export SBPMPI_COST_CACHE=${SBPMPI_COST_CACHE:-$OUTDIR/cost-tables.json}
MPIEXEC=${MPIEXEC:-mpiexec}
failed=0

step() {  # step NN name command...
  local nn=$1 name=$2
  shift 2
  case " $SKIP " in *" ${nn#0} "*) echo "== $nn $name: skipped"; return;; esac
  echo "== $nn $name: $*"
  local t0=$SECONDS
  "$@" >"$OUTDIR/$nn-$name.txt" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0)) s; last lines:"
  tail -n 4 "$OUTDIR/$nn-$name.txt" | sed 's/^/   | /'
  [ $rc -eq 0 ] || failed=$((failed + 1))
}

nvidia-smi >"$OUTDIR/00-nvidia-smi.txt" 2>&1 || true
"$PY" -c "import cupy, mpi4py, numpy; print('cupy', cupy.__version__, 'mpi4py', \
mpi4py.__version__, 'numpy', numpy.__version__)" >"$OUTDIR/00-versions.txt" 2>&1 || true

for t in $TRANSPORTS; do
  step 01 "info-$t" env SBPMPI_GPU_TRANSPORT="$t" "$MPIEXEC" -n 2 "$PY" -m sbpmpi info
done

step 02 tests-default "$PY" scripts/run_tests.py --sizes "$SIZES"

IPC_TESTS="tests/test_gpu_transport_cuda.py tests/test_gpu_transport_mpi.py tests/test_comm_cuda.py tests/test_comm.py tests/test_boxing.py tests/test_ops.py"
ipc_suite() {
  local n rc=0
  for n in ${SIZES//,/ }; do
    echo "---- n=$n"
    SBPMPI_GPU_TRANSPORT=ipc SBPMPI_TEST_LOGDIR="$OUTDIR/ipc-logs" timeout 1200 \
      "$MPIEXEC" -n "$n" "$PY" scripts/mpi_pytest.py -q --with-mpi -m mpi $IPC_TESTS || rc=1
  done
  SBPMPI_GPU_TRANSPORT=ipc "$PY" -m pytest -q tests/test_gpu_transport_unit.py \
    tests/test_gpu_costs.py tests/test_comm_unit.py || rc=1
  return $rc
}
step 03 tests-ipc ipc_suite

hier_suite() {  # two pseudo-nodes of two ranks: IPC on each, staged MPI between them
  SBPMPI_GPU_TRANSPORT=ipc SBPMPI_IPC_NODE_SIZE=2 SBPMPI_TEST_LOGDIR="$OUTDIR/hier-logs" \
    timeout 1200 "$MPIEXEC" -n 4 "$PY" scripts/mpi_pytest.py -q --with-mpi -m mpi \
    tests/test_gpu_transport_cuda.py tests/test_comm_cuda.py tests/test_boxing.py
}
step 03 tests-ipc-hierarchical hier_suite

for t in $TRANSPORTS; do
  step 04 "calibrate-$t" env SBPMPI_GPU_TRANSPORT="$t" "$MPIEXEC" -n 2 "$PY" -m sbpmpi info --calibrate
done

for t in $TRANSPORTS; do
  for n in 2 4; do
    step 05 "bench-$t-n$n" env SBPMPI_GPU_TRANSPORT="$t" "$MPIEXEC" -n "$n" "$PY" -m sbpmpi \
      bench --device cuda --sizes "$BENCH_SIZES" --json "$OUTDIR/bench-$t-n$n.json" \
      --out "$OUTDIR/bench-$t-n$n.png"
  done
done

echo "== $failed step(s) failed; logs in $OUTDIR"
exit $failed
