"""Fault tests: every failure ends the whole job with a message naming the rank and the cause.

Each fault program runs under its own ``mpiexec`` (tests/fault_programs) from a serial test
with a time limit: the job must end by itself, non-zero, well before the limit.
Also serial unit tests of the pieces (settings, fingerprints, the hooks).
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from conftest import errors_of
from fault_programs.runner import mpiexec, run_mpi

from sbpmpi import config
from sbpmpi.comm import agreement
from sbpmpi.comm.lifecycle import abort, watchdog
from sbpmpi.errors import CollectiveMismatchError
from sbpmpi.runtime import consistency, step_checks

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec on PATH")


@pytest.fixture
def switches():
    """``switches(check=..., debug=...)``: sm.config.update for the test; both settings
    (values and sources) as they were after it."""
    with config.override(check=config.check.value, debug=config.debug.value):
        yield config.update


def skip_if_not_wired(res) -> None:
    if "NOT-WIRED" in res.out and res.rc == 0:
        line = next(ln for ln in res.out.splitlines() if "NOT-WIRED" in ln)
        pytest.skip(f"lead wiring missing: {line.split(':', 1)[1].strip()}")


# -- abort, not hang -----------------------------------------------------------------------------

@needs_mpiexec
def test_exception_on_one_rank_aborts_the_job():
    res = run_mpi(2, "uncaught.py", "main")
    assert res.rc != 0, res
    assert "sbpmpi: rank 1: uncaught ValueError: bad value on rank 1" in res.out, res
    assert "Traceback (most recent call last)" in res.out and "uncaught.py" in res.out, res
    assert "should not happen" not in res.out, res
    assert res.seconds < 30, res


@needs_mpiexec
def test_exception_in_a_thread_aborts_the_job():
    res = run_mpi(2, "uncaught.py", "thread")
    assert res.rc != 0, res
    assert "sbpmpi: rank 0: uncaught in thread 'worker': RuntimeError: worker thread failed" \
        in res.out, res
    assert "should not happen" not in res.out, res


@needs_mpiexec
def test_sys_exit_on_one_rank_aborts_under_the_runner():
    res = run_mpi(2, "uncaught.py", "exit", python_args=("-m", "sbpmpi.abort"))
    assert res.rc != 0, res
    assert "sbpmpi: rank 1: exited with sys.exit(3)" in res.out, res
    assert "should not happen" not in res.out, res


@needs_mpiexec
def test_import_sbpmpi_installs_the_abort_hook():
    res = run_mpi(2, "uncaught.py", "auto")
    skip_if_not_wired(res)
    assert res.rc != 0, res
    assert "sbpmpi: rank 1: uncaught ValueError: bad value on rank 1" in res.out, res


def test_abort_switch_parsing():
    setting = config.abort_on_error
    assert setting.parse(None) is None and setting.parse("") is None and setting.parse(" ") is None
    for off in ("0", "false", "OFF", " no "):
        assert setting.parse(off) is False
    for on in ("1", "true", "yes"):
        assert setting.parse(on) is True
    with pytest.raises(ValueError, match="SBPMPI_ABORT_ON_ERROR='maybe' is not understood"):
        setting.parse("maybe")
    with config.override(abort_on_error=None):  # unset: on exactly for more than 1 process
        assert abort.enabled(2) and abort.enabled(4) and not abort.enabled(1)
    with config.override(abort_on_error=False):
        assert not abort.enabled(4)
    with config.override(abort_on_error=True):
        assert abort.enabled(1)


def test_install_is_off_for_one_process_and_restorable():
    before_sys, before_thread = sys.excepthook, threading.excepthook
    was = abort.installed()
    abort.uninstall()
    plain_sys, plain_thread = sys.excepthook, threading.excepthook  # abort's hooks are off
    try:
        with config.override(abort_on_error=None):
            assert abort.install() is False  # a world of one process
        assert sys.excepthook is plain_sys and threading.excepthook is plain_thread
        with config.override(abort_on_error=False):
            assert abort.install() is False
        assert abort.install(force=True) is True and abort.installed()
        assert sys.excepthook.__module__ == threading.excepthook.__module__ == abort.__name__
        abort.uninstall()
        assert not abort.installed()
        assert sys.excepthook is plain_sys and threading.excepthook is plain_thread
    finally:
        abort.uninstall()
        if was:
            abort.install(force=True)
    if not was:
        assert sys.excepthook is before_sys and threading.excepthook is before_thread


def test_abort_report_names_rank_and_cause():
    try:
        raise KeyError("w1")
    except KeyError as e:
        text = abort.format_report("uncaught", type(e), e, e.__traceback__, 3, 4)
    assert text.startswith("sbpmpi: rank 3: uncaught KeyError: 'w1'\n")
    assert "Traceback (most recent call last)" in text
    assert "aborting all 4 ranks" in text and "SBPMPI_ABORT_ON_ERROR=0" in text


# -- consistency checks ---------------------------------------------------------------------------

@needs_mpiexec
def test_ranks_calling_different_ops_fail_on_every_rank():
    res = run_mpi(2, "mismatch.py", "ops")
    assert res.rc != 0, res
    assert "uncaught CollectiveMismatchError" in res.out, res
    assert "ranks disagree on a collective step" in res.out, res
    assert "rank 0: add(tensor((4, 3), float64, sbp=(S(0)), placement=cpu[0, 1])" in res.out, res
    assert "rank 1: mul(tensor((4, 3), float64, sbp=(S(0)), placement=cpu[0, 1])" in res.out, res
    assert "should not happen" not in res.out, res


@needs_mpiexec
def test_mismatched_shapes_in_to_global_fail_on_every_rank():
    res = run_mpi(3, "mismatch.py", "shapes")
    assert res.rc != 0, res
    assert "uncaught ValueError: to_global: shards cannot form one global tensor" in res.out, res
    assert "should not happen" not in res.out, res


@needs_mpiexec
def test_ranks_converting_to_different_sbps_fail_on_every_rank():
    res = run_mpi(2, "mismatch.py", "to_global")
    skip_if_not_wired(res)
    assert res.rc != 0, res
    assert "CollectiveMismatchError" in res.out, res
    assert "S(1)" in res.out and "B" in res.out, res
    assert "should not happen" not in res.out, res


def test_meta_text_and_fingerprint_are_stable_and_metadata_only():
    import sbpmpi as sm

    pl = sm.placement("cpu", [0])
    x = sm.tensor(np.arange(6.0).reshape(2, 3), placement=pl, sbp=sm.sbp.split(1))
    y = sm.tensor(np.zeros((2, 3)), placement=pl, sbp=sm.sbp.split(1))
    assert step_checks.meta_text(x) == step_checks.meta_text(y)  # data does not count
    assert step_checks.meta_text(x) == "tensor((2, 3), float64, sbp=(S(1)), placement=cpu[0])"
    assert step_checks.meta_text((np.float32, np.dtype("<i4"), [1, 2.5], {"b": 1, "a": None})) \
        == "(float32, int32, [1, 2.5], {'a': None, 'b': 1})"
    assert step_checks.meta_text(object()) == "<object>"  # no memory addresses
    metas = [(x,), (x, 1), (x, sm.sbp.broadcast), ("add", (2, 3)),
             ("add", (3, 2)), ("mul", (2, 3)), (np.zeros((2, 3)),), (np.zeros((3, 2)),)]
    fps = [step_checks.fingerprint(m) for m in metas]
    assert all(0 <= f < 2**63 for f in fps)
    assert len(set(fps[1:])) == len(fps) - 1
    assert fps[0] == step_checks.fingerprint((y,))


def test_check_switches(switches, monkeypatch):
    monkeypatch.delenv("SBPMPI_CHECK", raising=False)
    monkeypatch.delenv("SBPMPI_DEBUG", raising=False)
    config.reset("check", "debug")
    assert consistency.check_enabled() and not consistency.debug_enabled()  # the defaults
    assert config.check.source == config.debug.source == "default"
    monkeypatch.setenv("SBPMPI_CHECK", "0")
    monkeypatch.setenv("SBPMPI_DEBUG", "1")
    # read at import: the environment alone changes nothing until reset() reads it again
    assert consistency.check_enabled() and not consistency.debug_enabled()
    config.reset("check", "debug")
    assert not consistency.check_enabled() and consistency.debug_enabled()
    assert config.check.source == "environment"
    before = consistency.stats()["checks"]
    assert consistency.check_collective("add", ()) is False
    assert consistency.stats()["checks"] == before  # off: not even counted
    # the program wins over the environment, one setting at a time
    switches(check=True)
    assert consistency.check_enabled() and consistency.debug_enabled()
    assert config.check.source == "program" and config.debug.source == "environment"
    switches(debug=False)
    assert consistency.check_enabled() and not consistency.debug_enabled()
    monkeypatch.setenv("SBPMPI_DEBUG", "yes")
    monkeypatch.setenv("SBPMPI_CHECK", "off")
    config.reset("debug")  # debug from the environment again; check stays the program's
    assert consistency.check_enabled() and consistency.debug_enabled()
    monkeypatch.setenv("SBPMPI_CHECK", "maybe")  # not a switch value: an error naming it
    with pytest.raises(ValueError, match="SBPMPI_CHECK='maybe' is not understood"):
        config.reset("check")
    assert consistency.check_enabled() and config.check.source == "program"  # unchanged
    with pytest.raises(TypeError, match="check='0' is not allowed; expected True or False"):
        switches(check="0")


# -- exit-time agreement -----------------------------------------------------------------------

def _cause_on_every_rank(res, n: int, doing: str, finished: list[int]) -> None:
    who = (f"rank {finished[0]}" if len(finished) == 1
           else "ranks " + ", ".join(map(str, finished)))
    assert f"  {who}: reached the end of the program" in res.out, res
    assert doing in res.out, res
    for r in finished:  # the finished ranks print the same cause
        assert f"sbpmpi: rank {r}: CollectiveMismatchError: ranks disagree on a collective step" \
            in res.out, res
    assert "should not happen" not in res.out, res


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3, 4])
def test_collective_on_one_rank_ends_the_job_with_the_cause_on_every_rank(n):
    res = run_mpi(n, "exit_early.py", "numpy", timeout=60)
    assert res.rc != 0, res
    assert res.seconds < 30, res
    assert "sbpmpi: rank 0: uncaught CollectiveMismatchError" in res.out, res
    _cause_on_every_rank(res, n, "  rank 0: x.numpy(tensor(", list(range(1, n)))


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3, 4])
def test_early_sys_exit_on_one_rank_ends_the_job_with_the_cause_on_every_rank(n):
    res = run_mpi(n, "exit_early.py", "sys_exit", timeout=60)
    assert res.rc != 0, res
    assert res.seconds < 30, res
    waiting = "rank 0" if n == 2 else "ranks " + ", ".join(map(str, range(n - 1)))
    _cause_on_every_rank(res, n, f"  {waiting}: x.to_global(tensor(", [n - 1])
    for r in range(n - 1):
        assert f"sbpmpi: rank {r}: uncaught CollectiveMismatchError" in res.out, res


@needs_mpiexec
def test_exit_agreement_with_abort_off_and_a_caught_error():
    res = run_mpi(3, "exit_early.py", "abort_off", env={"SBPMPI_ABORT_ON_ERROR": "0"})
    assert res.rc != 0 and res.seconds < 30, res
    _cause_on_every_rank(res, 3, "  rank 0: x.numpy(tensor(", [1, 2])
    res = run_mpi(3, "exit_early.py", "caught")
    assert res.rc != 0 and res.seconds < 30, res
    assert "rank 0 caught: ranks disagree on a collective step" in res.out, res
    _cause_on_every_rank(res, 3, "  rank 0: x.numpy(tensor(", [1, 2])


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_a_raw_sm_comm_collective_on_one_rank_is_met_by_the_exit_watch(n):
    res = run_mpi(n, "exit_early.py", "comm", timeout=60)
    assert res.rc != 0 and res.seconds < 30, res
    _cause_on_every_rank(res, n, "  rank 0: all_reduce (sm.comm, waiting on ranks "
                         f"{list(range(n))})", list(range(1, n)))
    assert "sbpmpi: rank 0: CollectiveMismatchError" in res.out, res


@needs_mpiexec
def test_a_correct_program_ends_normally_after_the_exit_handshake():
    res = run_mpi(4, "exit_early.py", "ok")
    assert res.rc == 0, res
    assert all(f"rank {r}: ok" in res.out for r in range(4)), res
    assert "CollectiveMismatchError" not in res.out, res


# -- watchdog -------------------------------------------------------------------------------------

@needs_mpiexec
def test_watchdog_aborts_a_rank_stuck_in_a_collective():
    res = run_mpi(2, "stuck.py", "direct", env={"SBPMPI_TIMEOUT": "1"})
    assert res.rc == watchdog.EXIT_CODE, res
    assert "sbpmpi: rank 0: watchdog: stuck for" in res.out, res
    assert "in 'barrier' waiting on ranks [0, 1] (SBPMPI_TIMEOUT=1)" in res.out, res
    assert "stuck.py" in res.out, res  # the stuck thread's stack
    assert "should not happen" not in res.out, res
    assert res.seconds < 20, res


@needs_mpiexec
def test_watchdog_is_wired_into_comm():
    res = run_mpi(2, "stuck.py", "comm", "4", env={"SBPMPI_TIMEOUT": "1"})
    skip_if_not_wired(res)
    assert res.rc == watchdog.EXIT_CODE, res
    assert "sbpmpi: rank 0: watchdog: stuck for" in res.out and "barrier" in res.out, res


def test_watchdog_parsing_and_noop_when_off(monkeypatch):
    with config.override(timeout=None):
        assert watchdog.timeout() is None
        assert watchdog.watch("x") is watchdog.watch("y")  # the shared no-op
    for bad in ("-1", "abc", "inf", "nan"):
        with pytest.raises(ValueError, match="SBPMPI_TIMEOUT=.* is not understood; expected a "
                                             "positive number of seconds"):
            config.timeout.parse(bad)
    assert config.timeout.parse("2.5") == 2.5
    assert config.timeout.parse("0") is config.timeout.parse("off") is None
    monkeypatch.setenv("SBPMPI_TIMEOUT", "2.5")
    with config.override(timeout=None):
        config.reset("timeout")  # read from the environment
        assert watchdog.timeout() == 2.5
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="positive number"):
            config.update(timeout=bad)
    with pytest.raises(TypeError, match="positive number"):
        config.update(timeout="60")


def test_watchdog_tracks_open_blocks_and_lets_fast_ones_pass():
    with config.override(timeout=30):
        with watchdog.watch("outer", peers=[0, 1]):
            with watchdog.watch("inner", peers=range(3)):
                act = watchdog.active()
                assert [a[:2] for a in act] == [("outer", (0, 1)), ("inner", (0, 1, 2))]
        assert watchdog.active() == []


# -- in-process MPI tests of the checks (n = 1..4) --------------------------------------------------


@pytest.mark.mpi(min_size=1)
def test_check_collective_agrees_or_names_every_side(switches):
    from mpi4py import MPI

    import sbpmpi as sm

    switches(check=True)
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    pl = sm.placement("cpu", list(range(size)))
    x = sm.tensor(np.arange(6.0).reshape(3, 2), placement=pl, sbp=sm.sbp.split(0))
    assert errors_of(lambda: consistency.check_collective("add", (x, 2.0))) == ("no error", "")
    # shapes differ on the last rank only
    meta = ("reshape", (3, 2) if rank < size - 1 else (2, 3))
    got = errors_of(lambda: consistency.check_collective("box", meta))
    if size == 1:
        assert got == ("no error", "")
        return
    assert got[0] == "CollectiveMismatchError", got
    first = "rank 0" if size == 2 else f"ranks {', '.join(map(str, range(size - 1)))}"
    assert f"  {first}: box('reshape', (3, 2))\n  rank {size - 1}: box('reshape', (2, 3))" \
        in got[1], got
    # a different op on each rank
    got = errors_of(lambda: consistency.check_collective(f"op{rank}", (x,)))
    assert all(f"rank {r}: op{r}(tensor((3, 2), float64" in got[1] for r in range(size)), got
    # switched off: no communication, no error (every rank must agree on the switch)
    switches(check=False)
    assert errors_of(lambda: consistency.check_collective(f"op{rank}", ())) == ("no error", "")


@pytest.mark.mpi(min_size=1)
def test_local_steps_are_verified_at_the_next_check(switches):
    from mpi4py import MPI

    switches(check=True)
    switches(debug=False)  # debug mode checks every step at once
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    for k in range(3):
        consistency.note_step("add", ((4, 3), k))
    before = consistency.stats()["exchanges"]
    assert errors_of(lambda: consistency.check_collective("box", ())) == ("no error", "")
    assert consistency.stats()["exchanges"] == before + (size > 1)
    # the last rank ran mul instead of add two steps back: found at the next check
    for k in range(9):
        consistency.note_step("mul" if (k == 6 and rank == size - 1) else "add", ((4, 3), k))
    got = errors_of(lambda: consistency.check_collective("box", ()))
    if size == 1:
        assert got == ("no error", "")
        return
    assert got[0] == "CollectiveMismatchError", got
    assert f"rank {size - 1}: box() (after 9 local steps, the last: add((4, 3), 3)," in got[1]
    assert "mul((4, 3), 6), add((4, 3), 7), add((4, 3), 8))" in got[1], got
    # the state is clean afterwards
    assert errors_of(lambda: consistency.check_collective("box", ())) == ("no error", "")


@pytest.mark.mpi(min_size=2)
def test_check_collective_on_a_group():
    from mpi4py import MPI

    import sbpmpi as sm

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    g = sm.comm.new_group(list(range(1, size)))
    # rank 0 is outside: it returns at once whatever it passes
    got = errors_of(lambda: consistency.check_collective("x", (rank if rank == 0 else 1,), group=g))
    assert got == ("no error", "")
    # members disagree: they raise, rank 0 (outside) does not take part
    try:
        consistency.check_collective("x", (rank,), group=g)
        got = "no error"
    except CollectiveMismatchError as e:
        got = str(e)
    if rank == 0 or size == 2:
        assert got == "no error"
    else:
        assert "rank 1: x(1)" in got and f"rank {size - 1}: x({size - 1})" in got, got


@pytest.mark.mpi(min_size=1)
def test_debug_mode_finds_diverged_broadcast_shards(switches):
    from mpi4py import MPI

    import sbpmpi as sm

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    pl = sm.placement("cpu", list(range(size)))
    x = sm.tensor(np.arange(12.0).reshape(4, 3), placement=pl, sbp=sm.sbp.broadcast)
    switches(debug=False)
    x.to_local()[0, 0] += rank  # diverge on ranks > 0
    assert errors_of(lambda: consistency.check_broadcast_shards(x, "x")) == ("no error", "")
    switches(debug=True)
    got = errors_of(lambda: consistency.check_broadcast_shards(x, "x"))
    if size == 1:
        assert got == ("no error", "")
    else:
        assert got[0] == "CollectiveMismatchError", got
        assert "SBPMPI_DEBUG: x is broadcast along mesh axis [0] but its shards differ" in got[1]
        assert "rank 0 (coord (0,)) and rank 1 (coord (1,)) hold different data" in got[1], got
    y = sm.tensor(np.arange(12.0).reshape(4, 3), placement=pl, sbp=sm.sbp.broadcast)
    assert errors_of(lambda: consistency.check_broadcast_shards(y, "y")) == ("no error", "")
    if size == 4:
        mesh = sm.placement("cpu", [[0, 1], [2, 3]])
        z = sm.tensor(np.arange(12.0).reshape(4, 3), placement=mesh,
                      sbp=(sm.sbp.broadcast, sm.sbp.split(0)))
        assert errors_of(lambda: consistency.check_broadcast_shards(z, "z")) == ("no error", "")
        if rank == 3:
            z.to_local()[...] = -1
        got = errors_of(lambda: consistency.check_broadcast_shards(z, "z"))
        assert "mesh axis 0: rank 1 (coord (0, 1)) and rank 3 (coord (1, 1))" in got[1], got


@pytest.mark.mpi(min_size=1)
def test_collective_decisions():
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    last = size - 1
    assert agreement.all_ok(True) is True
    assert agreement.all_ok(rank != last) is False
    # an error on the last rank only: the same type and message everywhere
    got = errors_of(lambda: agreement.raise_if_any(
        FileNotFoundError("no such file 'a.npy'") if rank == last else None, "sm.load"))
    assert got == ("FileNotFoundError", f"sm.load: rank {last}: no such file 'a.npy'"), got
    # errors on several ranks: the lowest rank's type; the others listed
    got = errors_of(lambda: agreement.raise_if_any(ValueError(f"bad {rank}"), "step"))
    assert got[0] == "ValueError" and got[1].startswith("step: rank 0: bad 0"), got
    assert all(f"step: rank {r}: bad {r}" in got[1] for r in range(min(size, 4))), got

    def block():
        with agreement.collective_errors("reading"):
            if rank == 0:
                raise KeyError("w")
    got = errors_of(block)
    assert got == ("KeyError", str(KeyError("reading: rank 0: 'w'"))), got

    def unknown_type():
        class LocalError(Exception):
            pass
        with agreement.collective_errors("x"):
            if rank == last:
                raise LocalError("odd")
    got = errors_of(unknown_type)
    assert got[0] == "RuntimeError" and f"x: rank {last}: odd" in got[1], got
    # one rank decides, everyone follows
    assert agreement.decide_on_root(lambda: ("tmp", rank), "save") == ("tmp", 0)
    got = errors_of(lambda: agreement.decide_on_root(
        lambda: (_ for _ in ()).throw(PermissionError("read-only")), "sm.save"))
    assert got == ("PermissionError", "sm.save: read-only"), got
