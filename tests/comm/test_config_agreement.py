"""The SBPMPI_* settings agree across ranks: compared at ``import sbpmpi``.

A value that differs between ranks, or that some rank cannot read, raises on every rank,
naming the variable and the ranks on each side (it hung: the rank that could not read it
stopped at import, the others waited in their first collective). A timeout longer than a
timer takes is refused when it is parsed (it was accepted, then the watchdog thread died
with OverflowError). Each program runs under its own mpiexec with a time limit.
"""

from __future__ import annotations

import pytest
from fault_programs.runner import mpiexec, run_mpi

from sbpmpi import config

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec on PATH")
ABORT_OFF = {"SBPMPI_ABORT_ON_ERROR": "0"}  # each rank raises and exits on its own


def ranks(rs: list[int]) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_a_variable_one_rank_cannot_read_raises_on_every_rank(n):
    line = (f"  SBPMPI_TIMEOUT: {ranks(list(range(n - 1)))}: unset; rank {n - 1}: 'soon' "
            f"(not understood)")
    res = run_mpi(n, "settings.py", "bad_on_last", timeout=60)  # the default settings
    assert res.rc != 0 and res.seconds < 30, res
    assert "the SBPMPI_* settings differ across ranks" in res.out and line in res.out, res
    assert "SBPMPI_TIMEOUT='soon' is not understood; expected a positive number" in res.out
    assert "should not happen" not in res.out, res
    res = run_mpi(n, "settings.py", "bad_on_last", env=ABORT_OFF, timeout=60)
    assert res.rc != 0 and res.seconds < 30, res
    assert res.out.count("ValueError: the SBPMPI_* settings differ across ranks") == n, res
    assert res.out.count(line) == n, res


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_a_setting_that_differs_between_ranks_raises_on_every_rank(n):
    want = f"  SBPMPI_CHECK: {ranks([r for r in range(n) if r != 1])}: 1; rank 1: 0"
    res = run_mpi(n, "settings.py", "check_differs", timeout=60)
    assert res.rc != 0 and res.seconds < 30, res
    assert "the SBPMPI_* settings differ across ranks" in res.out and want in res.out, res
    assert "should not happen" not in res.out, res
    res = run_mpi(n, "settings.py", "check_differs", env=ABORT_OFF, timeout=60)
    assert res.rc != 0 and res.seconds < 30, res
    assert res.out.count(want) == n, res


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_a_timeout_beyond_what_a_timer_takes_is_refused_at_import(n):
    res = run_mpi(n, "settings.py", "huge_timeout", env=ABORT_OFF, timeout=60)
    assert res.rc != 0 and res.seconds < 30, res
    assert res.out.count("ValueError: SBPMPI_TIMEOUT='1e10' is not understood; expected a "
                         "positive number of seconds up to 1000000000") == n, res
    assert "OverflowError" not in res.out and "should not happen" not in res.out, res


@needs_mpiexec
def test_settings_that_agree_let_the_job_run():
    res = run_mpi(3, "settings.py", "same", timeout=60)
    assert res.rc == 0 and all(f"rank {r}: imported and reduced 36.0" in res.out
                               for r in range(3)), res


def test_out_of_range_timeouts_are_refused_when_parsed():
    with pytest.raises(ValueError, match=r"SBPMPI_TIMEOUT='1e10' is not understood; expected "
                                         r"a positive number of seconds up to 1000000000"):
        config.timeout.parse("1e10")
    assert config.timeout.parse("1e9") == 1e9
    with pytest.raises(ValueError, match="up to 1000000000"):
        config.update(timeout=1e10)
    assert config.MAX_SECONDS <= __import__("threading").TIMEOUT_MAX


def test_the_message_names_each_variable_and_the_ranks_on_each_side():
    from sbpmpi.comm.agreement import settings as settings_agreement

    rs = settings_agreement.RankSettings
    same = {"SBPMPI_CHECK": "1", "SBPMPI_TIMEOUT": "unset", "SBPMPI_DEBUG": "0"}
    every = [rs(dict(same), {}), rs(dict(same, SBPMPI_CHECK="0"), {}),
             rs(dict(same, SBPMPI_TIMEOUT="'x' (not understood)"),
                {"SBPMPI_TIMEOUT": "SBPMPI_TIMEOUT='x' is not understood"}), rs(dict(same), {})]
    text = settings_agreement.message(every)
    assert text.splitlines() == [
        "the SBPMPI_* settings differ across ranks; set each alike on every rank:",
        "  SBPMPI_CHECK: ranks 0, 2, 3: 1; rank 1: 0",
        "  SBPMPI_TIMEOUT: ranks 0, 1, 3: unset; rank 2: 'x' (not understood)",
        "    (SBPMPI_TIMEOUT='x' is not understood)",
    ], text


def test_per_rank_settings_are_not_compared():
    compared = config.comparison()
    for s in config.SETTINGS.values():
        assert (s.env in compared) is not s.per_rank, s
    assert {s.name for s in config.SETTINGS.values() if s.per_rank} == {
        "host_pool_bytes", "mpiexec", "mpiexec_args"}
