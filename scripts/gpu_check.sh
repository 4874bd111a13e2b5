#!/usr/bin/env bash
# The GPU check of issue 24, in steps that each fit one command on the GPU machine (10 minutes):
#
#   bash scripts/gpu_check.sh list              # the steps and their time limits
#   bash scripts/gpu_check.sh STEP [OUTDIR]     # one step, under `timeout` (at most 540 s)
#   bash scripts/gpu_check.sh all [OUTDIR]      # every step in turn (far longer than 10 minutes)
#   GPU_CHECK_DRY=1 bash scripts/gpu_check.sh STEP   # print the step's commands, run nothing
#
# Prepare on the CPU machine, in the project's root (../shared travels to the GPU machine only as
# copied into the tree):
#   bash ../shared/gpu/wheels.sh                           # .whl/: mpi4py >= 4 and pytest-mpi
#   bash ../shared/gpu/build-cuda-openmpi.sh .ompi-cuda    # for the aware-* steps only (~10 min)
#   mkdir -p shared/gpu && cp ../shared/gpu/env.sh shared/gpu/
# Then with the run tool: command "bash scripts/gpu_check.sh STEP", carry [".whl", ".ompi-cuda"];
# the logs land in OUTDIR (default $OUT, else gpu-check/), one file per step and command.
#
# Steps (the README's test command is scripts/run_tests.py; the "cuda" parameters are active on
# a machine where CuPy sees a GPU):
#   info                   nvidia-smi, versions, `sbpmpi info` per transport
#   serial                 the serial tests
#   suite-nN-a, -b         the MPI tests at n = N (1..4), default transport (staged on an MPI
#                          that is not CUDA-aware), in two halves of the test files
#   ipc-nN                 the comm and GPU transport tests at n = N with SBPMPI_GPU_TRANSPORT=ipc
#   ipc-boxing-nN          boxing and ops at n = N (2, 4) over IPC
#   ipc-unit               the serial GPU transport and cost tests with the IPC transport
#   ipc-hier               n = 3 and 4 on pseudo-nodes of 2 ranks (SBPMPI_IPC_NODE_SIZE=2)
#   calibrate              `sbpmpi info --calibrate` per transport (staged, ipc) at n = 2
#   bench-T-nN             `python -m sbpmpi bench --device cuda` with transport T (staged, ipc)
#                          at n = N (2, 4): the staged mpi4py call and the device-copy proxy too
#   aware-check            the CUDA-aware Open MPI of .ompi-cuda: built with CUDA, what sbpmpi says
#   aware-nN               the comm and boxing tests at n = N (2, 4) with SBPMPI_GPU_TRANSPORT=mpi
#                          on it: device pointers straight into MPI
#   aware-bench-T-nN       the benchmark on it, T = mpi (Open MPI's own CUDA path) or ipc (ours)
# Environment: BENCH_SIZES (default 1M,16M,64M), OMPI_CUDA (default .ompi-cuda), LOGS (the
# run_tests.py logs, default /tmp/gpu-check-logs), PYTHON.
set -u
STEP=${1:-}
OUTDIR=${2:-${OUT:-gpu-check}}
BENCH_SIZES=${BENCH_SIZES:-1M,16M,64M}
OMPI_CUDA=${OMPI_CUDA:-.ompi-cuda}
LOGS=${LOGS:-/tmp/gpu-check-logs}  # rank logs and JUnit files (not in OUTDIR: few files come back)
PY=${PYTHON:-python3}
LIMIT=540  # seconds per step: the run tool allows 600 per command, with the start around it

COMM_TESTS="tests/comm/test_comm_collectives.py tests/comm/test_comm_vcollectives.py tests/comm/test_comm_p2p.py"
GPU_TESTS="tests/comm/gpu/test_gpu_transport_cuda.py tests/comm/gpu/test_gpu_transport_mpi.py"
BOXING_TESTS="tests/boxing/test_every_conversion.py tests/ops/test_every_op.py"

# name|seconds|commands: one line per step; each step runs under `timeout seconds`
steps() {
  echo "info|300|nvidia-smi; versions; for t in staged ipc; do SBPMPI_GPU_TRANSPORT=\$t mpiexec -n 2 \$PY -m sbpmpi info; done"
  echo "serial|$LIMIT|\$PY scripts/run_tests.py --sizes '' --timeout 500 --logs \$LOGS/serial"
  for n in 1 2 3 4; do
    for half in a b; do
      echo "suite-n$n-$half|$LIMIT|\$PY scripts/run_tests.py --no-serial --sizes $n --timeout 500 --logs \$LOGS/suite-n$n-$half -- \$(half $half)"
    done
  done
  for n in 1 2 3 4; do
    echo "ipc-n$n|$LIMIT|SBPMPI_GPU_TRANSPORT=ipc \$PY scripts/run_tests.py --no-serial --sizes $n --timeout 500 --logs \$LOGS/ipc-n$n -- $GPU_TESTS $COMM_TESTS"
  done
  for n in 2 4; do
    echo "ipc-boxing-n$n|$LIMIT|SBPMPI_GPU_TRANSPORT=ipc \$PY scripts/run_tests.py --no-serial --sizes $n --timeout 500 --logs \$LOGS/ipc-boxing-n$n -- $BOXING_TESTS"
  done
  echo "ipc-unit|$LIMIT|SBPMPI_GPU_TRANSPORT=ipc \$PY -m pytest -q -m 'not mpi' tests/comm/gpu/test_gpu_transport_unit.py tests/comm/gpu/test_gpu_costs.py tests/comm/test_comm_unit.py"
  echo "ipc-hier|$LIMIT|SBPMPI_GPU_TRANSPORT=ipc SBPMPI_IPC_NODE_SIZE=2 \$PY scripts/run_tests.py --no-serial --sizes 3,4 --timeout 250 --logs \$LOGS/ipc-hier -- $GPU_TESTS tests/comm/test_comm_collectives.py tests/boxing/test_every_conversion.py"
  echo "calibrate|$LIMIT|for t in staged ipc; do SBPMPI_GPU_TRANSPORT=\$t mpiexec -n 2 \$PY -m sbpmpi info --calibrate; done"
  for n in 2 4; do
    for t in staged ipc; do
      echo "bench-$t-n$n|$LIMIT|SBPMPI_GPU_TRANSPORT=$t mpiexec -n $n \$PY -m sbpmpi bench --device cuda --sizes \$BENCH_SIZES --out '' --json \$OUTDIR/bench-$t-n$n.json --csv \$OUTDIR/bench-$t-n$n.csv"
    done
  done
  echo "aware-check|300|aware; \$PY -c 'from mpi4py import MPI; print(MPI.Get_library_version())'; ompi_info --parsable --all | grep mpi_built_with_cuda_support:value; mpiexec -n 2 \$PY -m sbpmpi info"
  for n in 2 4; do
    echo "aware-n$n|$LIMIT|aware; SBPMPI_GPU_TRANSPORT=mpi \$PY scripts/run_tests.py --no-serial --sizes $n --timeout 500 --logs \$LOGS/aware-n$n -- $COMM_TESTS tests/boxing/test_every_conversion.py"
  done
  for n in 2 4; do
    for t in mpi ipc; do
      echo "aware-bench-$t-n$n|$LIMIT|aware; SBPMPI_GPU_TRANSPORT=$t mpiexec -n $n \$PY -m sbpmpi bench --device cuda --sizes \$BENCH_SIZES --out '' --json \$OUTDIR/aware-bench-$t-n$n.json --csv \$OUTDIR/aware-bench-$t-n$n.csv"
    done
  done
}

# -- what the step commands use ---------------------------------------------------------------

half() {  # the first (a) or second (b) half of the test files, in path order
  local files n
  mapfile -t files < <(find tests -name 'test_*.py' | LC_ALL=C sort)
  n=$(( (${#files[@]} + 1) / 2 ))
  if [ "$1" = a ]; then echo "${files[@]:0:$n}"; else echo "${files[@]:$n}"; fi
}

versions() {
  "$PY" -c "import cupy, mpi4py, numpy; print('cupy', cupy.__version__, 'mpi4py', \
mpi4py.__version__, 'numpy', numpy.__version__)"
}

aware() {  # the CUDA-aware Open MPI built by ../shared/gpu/build-cuda-openmpi.sh into OMPI_CUDA
  if [ ! -x "$OMPI_CUDA/bin/mpiexec" ]; then
    echo "no CUDA-aware Open MPI in $OMPI_CUDA: build it with ../shared/gpu/build-cuda-openmpi.sh" \
      "$OMPI_CUDA on the CPU machine and carry it" >&2
    return 1
  fi
  local prefix
  prefix=$(cd "$OMPI_CUDA" && pwd)
  export OPAL_PREFIX=$prefix PATH=$prefix/bin:$PATH
  export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OMPI_MCA_opal_cuda_support=true
}

setup() {
  # The machine's Python has no package index: install the carried wheels (mpi4py >= 4,
  # pytest-mpi) into a private site, as ../shared/gpu/wheels.sh explains.
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
  else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  fi
  # Open MPI 4.1 as root, oversubscribed, shared memory inside a VM (../shared/gpu/env.sh)
  if [ -f shared/gpu/env.sh ]; then
    . shared/gpu/env.sh
  elif [ -f ../shared/gpu/env.sh ]; then
    . ../shared/gpu/env.sh
  else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
    export PYTHONUNBUFFERED=1
  fi
  export SBPMPI_COST_CACHE=${SBPMPI_COST_CACHE:-$OUTDIR/cost-tables.json}
  export PY OUTDIR BENCH_SIZES OMPI_CUDA LOGS
  export -f half versions aware
}

run_step() {  # run_step NAME SECONDS COMMANDS
  local name=$1 secs=$2 cmds=$3 t0=$SECONDS rc
  echo "== $name (at most $secs s): $cmds"
  if [ -n "${GPU_CHECK_DRY:-}" ]; then
    return 0
  fi
  timeout -k 10 "$secs" bash -c "$cmds" </dev/null >"$OUTDIR/$name.txt" 2>&1
  rc=$?
  [ $rc -eq 124 ] && echo "   timed out after $secs s"
  echo "   rc=$rc in $((SECONDS - t0)) s; last lines of $OUTDIR/$name.txt:"
  tail -n 6 "$OUTDIR/$name.txt" | sed 's/^/   | /'
  return $rc
}

case "$STEP" in
  ""|-h|--help)
    sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0;;
  list)
    steps | while IFS='|' read -r name secs _; do printf '%-22s %4s s\n' "$name" "$secs"; done
    exit 0;;
esac
mkdir -p "$OUTDIR"
[ -n "${GPU_CHECK_DRY:-}" ] || setup
failed=0
found=0
while IFS='|' read -r name secs cmds; do
  if [ "$STEP" = all ] || [ "$STEP" = "$name" ]; then
    found=1
    run_step "$name" "$secs" "$cmds" || failed=$((failed + 1))
  fi
done < <(steps)
if [ $found -eq 0 ]; then
  echo "gpu_check.sh: no step named '$STEP' (see: bash scripts/gpu_check.sh list)" >&2
  exit 2
fi
echo "== $failed step(s) failed; logs in $OUTDIR"
exit $failed
