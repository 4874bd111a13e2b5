#!/usr/bin/env bash
# The GPU check: one run of at most 8 minutes on a GPU machine (one `run` of the device tool),
# steps in priority order, each under its own time limit, with time kept back for the later
# ones. A summary and every step's log are written under OUTDIR after every step, so a run
# killed at any point still returns what it did.
#
#   bash scripts/gpu_check.sh                  # every step that fits the budget
#   bash scripts/gpu_check.sh STEP...          # only these steps (same budget rules)
#   bash scripts/gpu_check.sh list             # the steps: limit, time kept for each, needs
#   GPU_CHECK_DRY=1 bash scripts/gpu_check.sh  # print each step's commands, run nothing
#   GPU_CHECK_REHEARSE=1 bash scripts/gpu_check.sh STEP...  # without a GPU: run the GPU
#       steps anyway, on "cpu" placements (the tests skip their cuda cases), to try the
#       script's own plumbing before the device time is spent
#
# The setup (installing the carried wheels) comes first; when `import sbpmpi` then fails the
# script stops at once (exit 3) with the error's last line and what to check, in its output
# and in OUTDIR/summary.md.
#
# Where CuPy sees no GPU every GPU step reports SKIP (a CPU machine runs the whole script in
# well under 4 minutes: tests/tools/test_gpu_check_script.py). docs/gpu.md has the exact run command
# for the device tool, with the wheels that travel (../shared/gpu/wheels.sh pytest-timeout).
#
# Steps, in priority order (limit s / kept s / needs):
#   env             versions, nvidia-smi, `sbpmpi info` per transport at n = 2       (any)
#   gpu-n2-staged   the comm tests' CuPy cases at n = 2, default transport (staged
#                   on an MPI that is not CUDA-aware)                                  (gpu)
#   gpu-n2-ipc      the same with SBPMPI_GPU_TRANSPORT=ipc, and the IPC transport's
#                   own tests (CuPy, and the stand-in device under this MPI)           (gpu)
#   cuda-core-n2    core and boxing checks on "cuda" placements, serial and at n = 2
#                   (the cuda cases of the global-tensor, boxing, ops, plan and
#                   parallel-layout tests)                                             (gpu)
#   bench-n2        the timing table at n = 2 (staged, ipc): `sbpmpi bench --device
#                   cuda` against the device-to-device copy; OUTDIR/gpu-table.md       (gpu)
#   gpt-n2          a few GPT training steps per layout on cuda, each step's loss
#                   checked against the NumPy reference, and compared with cpu         (gpu)
#   gpu-n4-ipc      (if time remains) the IPC tests at n = 4                          (gpu)
#   pseudo-nodes    (if time remains) hierarchical IPC: n = 3, 4 on pseudo-nodes of 2  (gpu)
#   bench-n4        (if time remains) the timing table at n = 4                       (gpu)
#   aware-n2        (if time remains) CUDA-aware Open MPI from OMPI_CUDA (built by
#                   ../shared/gpu/build-cuda-openmpi.sh): tests and timing at n = 2   (ompi)
#
# Environment: OUTDIR (2nd way: $OUT, else gpu-check/), GPU_CHECK_BUDGET (seconds for all
# steps, default 460), GPU_CHECK_NO_GPU=1 (treat the machine as having no GPU), BENCH_SIZES
# (default 1M,16M,64M), GPT_LAYOUTS (default "dp tp sp 2d"), OMPI_CUDA (default .ompi-cuda),
# LOGS (run_tests.py's rank logs, default /tmp/gpu-check-logs), PYTHON (default python3).
set -u
OUTDIR=${OUTDIR:-${OUT:-gpu-check}}
BUDGET=${GPU_CHECK_BUDGET:-460}  # the device tool allows 600 s a command: this leaves the rest
BENCH_SIZES=${BENCH_SIZES:-1M,16M,64M}
GPT_LAYOUTS=${GPT_LAYOUTS:-dp tp sp 2d}
DEVICE=cuda  # the placement type of bench and gpt (cpu in a rehearsal without a GPU)
OMPI_CUDA=${OMPI_CUDA:-.ompi-cuda}
LOGS=${LOGS:-/tmp/gpu-check-logs}
PY=${PYTHON:-python3}
LOG_BYTES=400000  # each step's log is cut to its last bytes: few bytes come back from a run
MIN_STEP=15       # a step is started only with at least this many seconds for it

COMM_TESTS="tests/comm/test_comm_collectives.py tests/comm/test_comm_vcollectives.py tests/comm/test_comm_p2p.py"
IPC_TESTS="tests/comm/gpu/test_gpu_transport_cuda.py tests/comm/gpu/test_gpu_transport_mpi.py"
CORE_TESTS="tests/tensor/test_global_tensor.py tests/boxing/test_every_conversion.py tests/ops/test_every_op.py tests/boxing/test_plan.py tests/parallel/test_parallel_layouts.py"
RT="\$PY scripts/run_tests.py --no-serial"  # the test command (its MPI runs only)

# name|limit|kept|needs|commands, in priority order. "kept": seconds no earlier step may use,
# so that this step still runs; "needs": any, gpu, or ompi (a CUDA-aware Open MPI in OMPI_CUDA).
steps() {
  cat <<EOF
env|45|20|any|versions; for t in staged ipc; do SBPMPI_GPU_TRANSPORT=\$t mpiexec -n 2 \$PY -m sbpmpi info; done
gpu-n2-staged|100|40|gpu|$RT --sizes 2 --timeout \$STEP_SECS --logs \$LOGS/gpu-n2-staged -- $COMM_TESTS -k cupy
gpu-n2-ipc|120|45|gpu|export SBPMPI_GPU_TRANSPORT=ipc; $RT --sizes 2 --timeout \$STEP_SECS --logs \$LOGS/gpu-n2-ipc-a -- $IPC_TESTS && $RT --sizes 2 --timeout \$STEP_SECS --logs \$LOGS/gpu-n2-ipc-b -- $COMM_TESTS -k cupy
cuda-core-n2|120|45|gpu|\$PY scripts/run_tests.py --sizes 2 --timeout \$STEP_SECS --logs \$LOGS/cuda-core-n2 -- $CORE_TESTS -k cuda
bench-n2|120|60|gpu|bench 2 staged && bench 2 ipc; table
gpt-n2|90|40|gpu|for l in \$GPT_LAYOUTS; do gpt \$l || exit 1; done
gpu-n4-ipc|120|0|gpu|export SBPMPI_GPU_TRANSPORT=ipc; $RT --sizes 4 --timeout \$STEP_SECS --logs \$LOGS/gpu-n4-ipc-a -- $IPC_TESTS && $RT --sizes 4 --timeout \$STEP_SECS --logs \$LOGS/gpu-n4-ipc-b -- $COMM_TESTS -k cupy
pseudo-nodes|120|0|gpu|export SBPMPI_GPU_TRANSPORT=ipc SBPMPI_IPC_NODE_SIZE=2; $RT --sizes 3,4 --timeout \$STEP_SECS --logs \$LOGS/pseudo-nodes -- $IPC_TESTS
bench-n4|120|0|gpu|bench 4 staged && bench 4 ipc; table
aware-n2|150|0|ompi|aware && SBPMPI_GPU_TRANSPORT=mpi $RT --sizes 2 --timeout \$STEP_SECS --logs \$LOGS/aware-n2 -- $COMM_TESTS -k cupy && bench 2 mpi; table
EOF
}

# -- what the step commands use (exported to their shells) -----------------------------------

versions() {
  "$PY" - <<'PYEOF'
import importlib, platform
print("python", platform.python_version())
for m in ("numpy", "cupy", "mpi4py", "pytest", "torch"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "-", type(e).__name__)
from mpi4py import MPI
print(MPI.Get_library_version().replace("\0", "").strip().splitlines()[0])
PYEOF
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  return 0
}

bench() {  # bench N TRANSPORT: the timing rows of one transport at N ranks, as JSON in OUTDIR
  SBPMPI_GPU_TRANSPORT=$2 mpiexec -n "$1" "$PY" -m sbpmpi bench --device "$DEVICE" \
    --sizes "$BENCH_SIZES" --repeats 10 --overhead-repeats 100 --out '' \
    --json "$OUTDIR/bench-$2-n$1.json" --csv "$OUTDIR/bench-$2-n$1.csv"
}

table() {  # the GPU table of every timing file so far
  "$PY" scripts/gpu_table.py "$OUTDIR"/bench-*-n*.json | tee "$OUTDIR/gpu-table.md"
}

gpt() {  # gpt LAYOUT: a few steps on cuda and on cpu, each checked against NumPy; the same losses
  local dev
  for dev in "$DEVICE" cpu; do
    mpiexec -n 2 "$PY" examples/train_gpt.py --layout "$1" --device "$dev" --steps 3 --check \
      --sample 0 > "$OUTDIR/gpt-$1-$dev.txt" 2>&1 || { tail -n 20 "$OUTDIR/gpt-$1-$dev.txt"; return 1; }
  done
  grep '^step' "$OUTDIR/gpt-$1-$DEVICE.txt"
  if diff <(grep '^step' "$OUTDIR/gpt-$1-$DEVICE.txt" | cut -d'(' -f1) \
          <(grep '^step' "$OUTDIR/gpt-$1-cpu.txt" | cut -d'(' -f1); then
    echo "gpt $1: $DEVICE and cpu losses agree, both within the reference's tolerance"
  else
    echo "gpt $1: $DEVICE and cpu losses differ"; return 1
  fi
}

aware() {  # the CUDA-aware Open MPI of OMPI_CUDA in front of the machine's
  local prefix
  prefix=$(cd "$OMPI_CUDA" && pwd)
  export OPAL_PREFIX=$prefix PATH=$prefix/bin:$PATH OMPI_MCA_opal_cuda_support=true
  export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  "$PY" -c 'from sbpmpi.comm import cuda_aware; d = cuda_aware.detect_library(); print(d); assert d.aware'
}

setup() {
  # The machine's Python has no package index: the wheels carried in .whl/ (mpi4py >= 4,
  # pytest-mpi, pytest-timeout: ../shared/gpu/wheels.sh) go into a private site.
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --target /tmp/gpu-check-site .whl/*.whl \
      >"$OUTDIR/setup.log" 2>&1 || echo "setup: pip install failed (see setup.log)"
    export PYTHONPATH=/tmp/gpu-check-site:$PWD
  else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  fi
  # Open MPI 4.1 as root, oversubscribed, shared memory inside a VM (../shared/gpu/env.sh)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  export PYTHONUNBUFFERED=1 SBPMPI_COST_CACHE=off
  mkdir -p "$LOGS"  # run_tests.py makes one folder in it per run
  export PY OUTDIR BENCH_SIZES GPT_LAYOUTS OMPI_CUDA LOGS DEVICE
  export -f versions bench table gpt aware
}

check_import() {  # stop at once when the project does not import: every step would fail
  local log="$OUTDIR/import.log" last rc wheels pyv
  timeout -k 5 60 "$PY" -c "import sbpmpi" >"$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] && return 0
  last=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && last="(no answer within 60 s) ${last}"
  wheels="none were carried (.whl/ holds no wheel)"
  compgen -G ".whl/*.whl" >/dev/null && wheels="installed here, their install log: $OUTDIR/setup.log"
  pyv=$("$PY" -c 'import platform; print(platform.python_version())' 2>&1 | tail -n 1)
  {
    echo "gpu_check.sh: stopped before any step: \`$PY -c \"import sbpmpi\"\` failed after the setup:"
    echo "  ${last:-(no output, exit $rc)}"
    echo "  (the whole traceback: $log; PYTHONPATH=$PYTHONPATH)"
    echo "Check:"
    echo "  - the wheels in .whl/ (mpi4py >= 4, pytest-mpi, pytest-timeout: fetched with"
    echo "    \`bash ../shared/gpu/wheels.sh pytest-timeout\`, sent with carry=[\".whl\"]): $wheels;"
    echo "  - that they were fetched for this machine's Python ($pyv);"
    echo "  - that the script runs from the checkout's root (here: $PWD)."
  } | tee "$OUTDIR/summary.md" >&2
  exit 3
}

have() {  # have NEEDS: "" when this machine has it, else why not
  case "$1" in
    any) echo "";;
    gpu) if [ -n "${GPU_CHECK_NO_GPU:-}" ]; then echo "GPU_CHECK_NO_GPU is set"
         elif [ -z "$GPU" ] && [ -z "${GPU_CHECK_REHEARSE:-}" ]; then echo "no GPU: CuPy sees none"
         else echo ""; fi;;
    ompi) if [ -z "$GPU" ] || [ -n "${GPU_CHECK_NO_GPU:-}" ]; then echo "no GPU: CuPy sees none"
          elif [ ! -x "$OMPI_CUDA/bin/mpiexec" ]; then echo "no CUDA-aware Open MPI in $OMPI_CUDA"
          else echo ""; fi;;
  esac
}

# -- the summary, written after every step ---------------------------------------------------

declare -A STATUS SECS NOTE
ORDER=()

write_summary() {
  {
    echo "# GPU check $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
    echo
    echo "budget ${BUDGET} s, $((SECONDS)) s used; device: ${GPU:-none}"
    echo
    echo "| step | status | seconds | note |"
    echo "|---|---|---|---|"
    local n
    for n in "${ORDER[@]}"; do
      echo "| $n | ${STATUS[$n]} | ${SECS[$n]:-} | ${NOTE[$n]:-} |"
    done
  } > "$OUTDIR/summary.md"
}

run_step() {  # run_step NAME SECONDS COMMANDS
  local name=$1 secs=$2 cmds=$3 t0=$SECONDS rc log="$OUTDIR/$1.log"
  STATUS[$name]=RUNNING; NOTE[$name]="at most $secs s"; write_summary
  STEP_SECS=$secs timeout -k 10 "$secs" bash -c "$cmds" </dev/null >"$log" 2>&1
  rc=$?
  SECS[$name]=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then STATUS[$name]=PASS; NOTE[$name]=""
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then STATUS[$name]=TIMEOUT; NOTE[$name]="killed after $secs s"
  else STATUS[$name]=FAIL; NOTE[$name]="exit $rc"
  fi
  if [ "$(wc -c <"$log")" -gt $LOG_BYTES ]; then
    tail -c $LOG_BYTES "$log" > "$log.tail" && mv "$log.tail" "$log"
  fi
  write_summary
  echo "== $name: ${STATUS[$name]} in ${SECS[$name]} s (at most $secs s); last lines of $log:"
  tail -n 8 "$log" | sed 's/^/   | /'
}

case "${1:-}" in
  -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
  list) steps | while IFS='|' read -r name limit kept needs _; do
          printf '%-14s %4s s  kept %3s s  %s\n' "$name" "$limit" "$kept" "$needs"; done
        exit 0;;
esac
wanted=("$@")
known=$(steps | cut -d'|' -f1)
for w in "${wanted[@]}"; do
  if ! grep -qx -- "$w" <<<"$known"; then
    echo "gpu_check.sh: no step named '$w' (see: bash scripts/gpu_check.sh list)" >&2
    exit 2
  fi
done
if [ -n "${GPU_CHECK_DRY:-}" ]; then
  steps | while IFS='|' read -r name limit kept needs cmds; do
    if [ ${#wanted[@]} -eq 0 ] || printf '%s\n' "${wanted[@]}" | grep -qx -- "$name"; then
      echo "== $name (at most $limit s, $needs): $cmds"
    fi
  done
  exit 0
fi

mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
setup
check_import
GPU=$("$PY" -c 'import cupy; n = cupy.cuda.runtime.getDeviceCount(); assert n > 0
name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
print(name.decode() if isinstance(name, bytes) else name, "x", n)' 2>/dev/null)
[ -z "$GPU" ] && DEVICE=cpu  # a rehearsal: the GPU steps' plumbing on cpu placements
export DEVICE
mapfile -t LINES < <(steps)
for line in "${LINES[@]}"; do
  IFS='|' read -r name _ _ _ _ <<<"$line"
  if [ ${#wanted[@]} -eq 0 ] || printf '%s\n' "${wanted[@]}" | grep -qx -- "$name"; then
    ORDER+=("$name"); STATUS[$name]=pending
  fi
done
write_summary
for i in "${!LINES[@]}"; do
  IFS='|' read -r name limit kept needs cmds <<<"${LINES[$i]}"
  [ -n "${STATUS[$name]:-}" ] || continue
  why=$(have "$needs")
  if [ -n "$why" ]; then
    STATUS[$name]=SKIP; NOTE[$name]=$why; write_summary
    echo "== $name: SKIP ($why)"
    continue
  fi
  later=0  # the time kept for the later steps of this run that this machine can run
  for line in "${LINES[@]:$((i + 1))}"; do
    IFS='|' read -r n2 _ k2 needs2 _ <<<"$line"
    [ -n "${STATUS[$n2]:-}" ] && [ -z "$(have "$needs2")" ] && later=$((later + k2))
  done
  secs=$(( BUDGET - SECONDS - later ))
  [ "$secs" -gt "$limit" ] && secs=$limit
  if [ "$secs" -lt $MIN_STEP ]; then
    STATUS[$name]=SKIP; NOTE[$name]="no time: $((BUDGET - SECONDS)) s left, $later s kept for later steps"
    write_summary
    echo "== $name: SKIP (${NOTE[$name]})"
    continue
  fi
  run_step "$name" "$secs" "$cmds"
done
failed=0
for n in "${ORDER[@]}"; do
  case "${STATUS[$n]}" in FAIL|TIMEOUT) failed=$((failed + 1));; esac
done
echo
cat "$OUTDIR/summary.md"
echo
echo "== $failed step(s) failed or timed out; summary and logs in $OUTDIR"
[ $failed -eq 0 ]
