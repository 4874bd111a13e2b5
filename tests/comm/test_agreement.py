"""The one agreement mechanism (sbpmpi.comm.agreement) behind the consistency check and
comm's checked mode, at n = 1..4.

- one normalisation: ranks passing ``split(-1)`` and ``split(1)`` for a 2-d tensor agree,
  a real mismatch still raises on every rank;
- checked mode (``SBPMPI_COMM_CHECK``) makes one agreement exchange per ``x.to_global``;
- the exchanges are recorded in ``Trace.agreements``, apart from the comm calls;
- a rank in an op's consistency check and a rank in a checked sm.comm call meet in the same
  exchange and both get an explanation.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from conftest import assert_same_on_all_ranks, errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.comm import agreement
from sbpmpi.runtime import consistency, step_checks

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


@pytest.fixture
def checked():
    """Checked mode on for the test, with the automatic GPU transport (the exchanges
    counted here are those of the MPI path); the settings as they were after it."""
    with sm.config.override(comm_check=True, check=sm.config.check.value, gpu_transport=None):
        yield


def _x():
    a = np.arange(4 * size * 6, dtype=np.float64).reshape(4 * size, 6)
    return a, sm.tensor(a, placement=sm.placement("cpu", list(range(size))), sbp=sm.sbp.split(0))


# -- one normalisation ---------------------------------------------------------------------------

def test_conversion_meta_normalises_against_ndim():
    pl = sm.placement("cpu", [0])
    x = sm.tensor(np.zeros((2, 3)), placement=pl, sbp=sm.sbp.split(0))
    sbps = (sm.sbp.split(-1), sm.sbp.split(1), [sm.sbp.split(1)], (sm.sbp.split(-1),))
    texts = {step_checks.step_check("x.to_global", step_checks.conversion_meta(x, None, s)).text
             for s in sbps}
    # x.to_global's own check (cached per raw arguments) describes them alike too
    assert {step_checks.conversion_check(x, None, s).text for s in sbps} == texts
    assert texts == {"x.to_global(tensor((2, 3), float64, sbp=(S(0)), placement=cpu[0]), None, "
                     "(S(1),))"}, texts
    # an SBP that does not normalise is described as given (the conversion refuses it later)
    assert step_checks.conversion_meta(x, None, sm.sbp.split(2)).sbp == sm.sbp.split(2)
    assert step_checks.conversion_meta(x, None, "S(1)").sbp == "S(1)"
    assert step_checks.conversion_meta(x, None, None).sbp is None


MODES = ["check", "checked mode", "both"]


def _in_mode(mode: str):
    """The check on for "check" and "both", checked mode on for the other two."""
    sm.config.update(check=mode != "checked mode")
    sm.config.update(comm_check=mode != "check")
    return _x()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", MODES)
def test_split_minus_one_and_split_one_agree(mode, checked):
    a, x = _in_mode(mode)
    want = sm.sbp.split(-1) if rank % 2 == 0 else sm.sbp.split(1)
    y = x.to_global(sbp=want)
    assert y.sbp == (sm.sbp.split(1),)
    np.testing.assert_array_equal(y.numpy(), a)
    # a list of one SBP is the same request as the SBP
    y = x.to_global(sbp=[sm.sbp.broadcast] if rank % 2 else sm.sbp.broadcast)
    np.testing.assert_array_equal(y.to_local(), a)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", MODES)
def test_a_real_sbp_mismatch_raises_on_every_rank(mode, checked):
    a, x = _in_mode(mode)
    want = sm.sbp.split(0) if rank == size - 1 else sm.sbp.split(-1)
    kind, msg = errors_of(lambda: x.to_global(sbp=want))
    if mode == "checked mode":  # the conversion's own agreement (check off)
        assert kind == "ValueError", (kind, msg)
        assert "box: ranks disagree on the conversion" in msg and "S(1)" in msg, msg
    else:
        assert kind == "CollectiveMismatchError", (kind, msg)
        assert f"rank {size - 1}: x.to_global(tensor(" in msg and "None, (S(0),))" in msg, msg
        assert "None, (S(1),))" in msg, msg
    np.testing.assert_array_equal(x.numpy(), a)  # every rank is in step afterwards


# -- a repeated conversion is checked like the first ----------------------------------------------

@pytest.mark.mpi(min_size=2)
def test_a_repeated_to_global_is_checked_like_the_first():
    """Repeated arguments take the cached step check (text and fingerprint described
    once): a rank that diverges on a repeated call, or after a local step of its own,
    still raises on every rank, with the same message as the first time."""
    if not consistency.check_enabled():
        pytest.skip("SBPMPI_CHECK is off")
    step_checks.clear_step_checks()
    a, x = _x()
    first = errors_of(lambda: x.to_global(sbp=sm.sbp.split(1) if rank == 0 else
                                          sm.sbp.broadcast))
    for _ in range(2):  # both conversions seen (and cached) on every rank
        y = x.to_global(sbp=sm.sbp.broadcast)
        z = x.to_global(sbp=sm.sbp.split(1))
    np.testing.assert_array_equal(y.to_local(), a)
    np.testing.assert_array_equal(z.numpy(), a)
    for sbp in (sm.sbp.broadcast, sm.sbp.split(1)):  # cached: the same check again
        assert step_checks.conversion_check(x, None, sbp) is \
            step_checks.conversion_check(x, None, sbp)
    again = errors_of(lambda: x.to_global(sbp=sm.sbp.split(1) if rank == 0 else
                                          sm.sbp.broadcast))
    assert again == first and again[0] == "CollectiveMismatchError", (first, again)
    assert "rank 0: x.to_global(" in again[1] and "(S(1),))" in again[1], again
    # a local step on rank 0 only, then a repeated conversion: reported with the step
    _ = x + x if rank == 0 else x
    kind, msg = errors_of(lambda: x.to_global(sbp=sm.sbp.broadcast))
    assert kind == "CollectiveMismatchError" and "local step" in msg, (kind, msg)
    np.testing.assert_array_equal(x.to_global(sbp=sm.sbp.broadcast).to_local(), a)


# -- one exchange per conversion ----------------------------------------------------------------

def _ops(t) -> list[str]:
    return [r.op for r in t]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("check", [True, False])
def test_checked_mode_makes_one_exchange_per_to_global(check, checked):
    sm.config.update(check=check)
    a, x = _x()
    with sm.trace() as plain:
        x.to_global(sbp=sm.sbp.broadcast)
    with sm.trace() as t:
        y = x.to_global(sbp=sm.sbp.broadcast)
    np.testing.assert_array_equal(y.to_local(), a)
    # the data moves exactly as without checked mode ...
    sm.config.update(comm_check=False)
    with sm.trace() as unchecked:
        x.to_global(sbp=sm.sbp.broadcast)
    assert _ops(t) == _ops(unchecked) == _ops(plain), (str(t), str(unchecked))
    assert _ops(t) == ([] if size == 1 else ["all_gather"]), str(t)
    # ... after one agreement exchange of 16 bytes (none for a single process)
    want = [] if size == 1 else [("agreement", 16)]
    assert [(r.op, r.nbytes) for r in t.agreements] == want, t.agreements
    assert [(r.op, r.nbytes) for r in unchecked.agreements] == (want if check else [])
    # a conversion that goes through several collectives: still one exchange
    if size == 4:
        mesh = sm.placement("cpu", [[0, 1], [2, 3]])
        z = sm.tensor(a, placement=mesh, sbp=(sm.sbp.split(0), sm.sbp.split(1)))
        sm.config.update(comm_check=True)
        with sm.trace() as t:
            w = z.to_global(sbp=(sm.sbp.broadcast, sm.sbp.broadcast))
        assert len(t) >= 2 and len(t.agreements) == 1, (str(t), t.agreements)
        np.testing.assert_array_equal(w.to_local(), a)


@pytest.mark.mpi(min_size=1)
def test_box_and_numpy_in_checked_mode_make_one_exchange(checked):
    a, x = _x()
    for check in (True, False):
        sm.config.update(check=check)
        with sm.trace() as t:
            y = sm.boxing.box(x, sbp=sm.sbp.broadcast)  # no consistency check of its own
        assert len(t.agreements) == (size > 1), t.agreements
        with sm.trace() as t:
            got = y.to_global(sbp=sm.sbp.split(1)).numpy()
        np.testing.assert_array_equal(got, a)
        # to_global (local slicing) and numpy (an all-gather): one exchange each
        assert len(t.agreements) == 2 * (size > 1), (check, t.agreements)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("check", [True, False])
def test_an_op_that_boxes_an_operand_makes_one_exchange_in_checked_mode(check, checked):
    """The operand an op boxes goes through the same door as x.to_global: in checked mode
    the op's consistency check covers its conversion (its collectives make no exchange of
    their own), and without the check the conversion makes one exchange itself."""
    sm.config.update(check=check)  # the fixture restores it
    a, x = _x()
    y = x.to_global(sbp=sm.sbp.split(1))
    _ = x + y  # the signature is chosen (and cached) before the traced call
    with sm.trace() as t:
        z = x + y  # S(0) + S(1): one operand is converted (a collective)
    # one agreement exchange for the whole step: the op's check, or the conversion's own
    assert len(t.agreements) == (size > 1), (str(t), t.agreements)
    assert len(t) >= (size > 1), str(t)
    np.testing.assert_array_equal(z.numpy(), a + a)


@pytest.mark.mpi(min_size=1)
def test_checked_sm_comm_calls_agree_in_one_small_exchange(checked):
    x = np.arange(3.0) + rank
    with sm.trace() as t:
        sm.comm.all_reduce(x)
    assert (x == sum(np.arange(3.0) + r for r in range(size))).all()
    assert _ops(t) == ["all_reduce"]
    assert [(r.op, r.nbytes) for r in t.agreements] == ([("agreement", 16)] if size > 1 else [])
    # all_to_all_v also needs every rank's counts: one more gather
    out, src = np.zeros(size), np.arange(float(size))
    with sm.trace() as t:
        sm.comm.all_to_all_v(out, [1] * size, src, [1] * size)
    assert [r.op for r in t.agreements] == (["agreement", "agreement_gather"] if size > 1 else [])
    np.testing.assert_array_equal(out, np.full(size, float(rank)))


# -- the decisions go through it too -------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_decisions_are_traced_as_agreements():
    with sm.trace() as t:
        assert agreement.all_ok(True)
        assert agreement.decide_on_root(lambda: 7, "seven") == 7
        agreement.raise_if_any(None, "nothing")
    assert len(t) == 0
    want = ["agreement", "agreement_broadcast", "agreement"] if size > 1 else []
    assert [r.op for r in t.agreements] == want, t.agreements
    assert all(r.group_ranks == tuple(range(size)) for r in t.agreements)
    assert agreement.gather(rank, "ranks") == list(range(size))


@pytest.mark.mpi(min_size=2)
def test_a_consistency_check_and_a_checked_comm_call_meet(checked):
    # rank 0 converts a tensor, the others call sm.comm.all_reduce in checked mode: the
    # same exchange on every rank, so every rank explains instead of hanging
    sm.config.update(check=True)
    a, x = _x()
    sm.config.update(comm_check=True)

    def step():
        if rank == 0:
            consistency.check_collective("x.numpy", (x,))
        else:
            sm.comm.all_reduce(np.zeros(2))

    try:
        step()
        got = ("no error", "")
    except Exception as e:
        got = (type(e).__name__, str(e))
    assert got[0] == "CollectiveMismatchError", got
    assert "rank 0: x.numpy(tensor(" in got[1], got
    others = "rank 1" if size == 2 else f"ranks {', '.join(map(str, range(1, size)))}"
    assert f"{others}: all_reduce(dtype=<f8, size=2, op=SUM)" in got[1], got
    assert_same_on_all_ranks(got[1].splitlines()[1:-1])  # the same lines everywhere
    np.testing.assert_array_equal(x.numpy(), a)


def test_fingerprints_and_helpers():
    fp = agreement.fingerprint_of("add(1)")
    assert 0 <= fp < 2**63 and fp == agreement.fingerprint_of("add(1)")
    assert fp != agreement.fingerprint_of("add(1)", b"\x01" * 8)
    assert agreement.covers_world(None)
    assert agreement.members(None)[1] == tuple(range(size))
    if size == 1:  # a group of one never communicates
        assert agreement.agree(fp, "x", "x", lambda: 1 / 0) is None
        assert agreement.all_ok(False) is False


def test_repeated_step_checks_are_cached_only_where_equal_means_alike():
    """The check cache of a step (x.to_global in a loop) never gives two different
    descriptions one text: numbers are described afresh (``1 == True``), a tensor's text
    follows its dtype, and the cached check equals a fresh description."""
    pl = sm.placement("cpu", [0], world_size=1)
    a = sm.zeros(4, 3, placement=sm.placement("cpu", [0]), sbp=sm.sbp.split(0))
    b = a.astype(np.float64)
    check = step_checks.step_check
    assert check("f", (1,)) is not check("f", (1,))  # a number: described afresh
    assert check("f", (1,)).text != check("f", (True,)).text
    listed = (a, [sm.sbp.split(0)])
    assert check("f", listed) is not check("f", listed)  # a list: not cached
    meta = (a, pl, (sm.sbp.broadcast,))
    ta = check("x.to_global", meta)
    assert ta is check("x.to_global", meta)  # cached
    tb = check("x.to_global", (b, pl, (sm.sbp.broadcast,)))
    assert ta.text != tb.text and "float64" in tb.text
    step_checks.clear_step_checks()
    fresh = check("x.to_global", meta)
    assert fresh == ta and fresh is not ta
    # the fingerprint the check compares and the digest a local step folds in: the text's
    assert ta.fingerprint == agreement.fingerprint_of(ta.text)
    assert ta.digest == hashlib.blake2b(ta.text.encode(), digest_size=8).digest()
    # x.to_global's check (SBP normalised) is cached apart from a step of the same arguments
    raw = (a, None, sm.sbp.split(-1))
    assert step_checks.conversion_check(*raw).text.endswith("(S(1),))")
    assert check("x.to_global", raw).text.endswith("S(-1))")
    assert step_checks.conversion_check(*raw).text.endswith("(S(1),))")  # not overwritten


@pytest.mark.mpi(min_size=1)
def test_a_flag_rides_on_the_fingerprint_exchange():
    """agree_flagged: one 16-byte exchange tells whether the fingerprints agree and whether
    any rank raised its flag; a mismatch is still found whatever the flags."""
    fp = agreement.fingerprint_of("the same step")
    for raiser in [None, *range(size)]:
        with sm.trace() as t:
            got = agreement.agree_flagged(fp, "step", "step", lambda: "step", flag=rank == raiser)
        assert got.explanations is None and got.any_flag == (raiser is not None), (raiser, got)
        assert [(r.op, r.nbytes) for r in t.agreements] == ([("agreement", 16)] if size > 1
                                                             else [])
    # fingerprints that differ in their low bit only are taken as one (62 bits compare) ...
    assert agreement.agree_flagged(fp | 1 if rank % 2 else fp & ~1, "s", "s",
                                   lambda: "s").explanations is None
    if size > 1:  # ... any other difference is found, flag or not
        other = agreement.fingerprint_of(f"step of rank {rank}")
        got = agreement.agree_flagged(other, "step", "step", lambda: rank, flag=rank == 0)
        assert got.explanations == list(range(size)) and not got.any_flag


@pytest.mark.mpi(min_size=1)
def test_checked_gpu_calls_decide_their_route_in_the_signature_exchange(checked):
    """With the ipc transport on, a checked collective makes one exchange: the signature
    agreement carries every rank's readiness for the IPC path (here: host arrays, so the
    MPI path), and a mismatch of arguments is still raised on every rank."""
    with sm.config.override(gpu_transport="ipc", cuda_aware=False):
        x = np.full(3, float(rank))
        with sm.trace() as t:
            sm.comm.all_reduce(x)
        np.testing.assert_array_equal(x, np.full(3, size * (size - 1) / 2))
        assert [r.op for r in t.agreements] == (["agreement"] if size > 1 else [])
        if size > 1:
            y = np.zeros(3 if rank else 4)
            kind, msg = errors_of(lambda: sm.comm.all_reduce(y))
            assert kind == "ValueError" and "disagree on size" in msg, msg
