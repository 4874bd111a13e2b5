"""The scoped modes (sbpmpi.core.modes): one context-local state, entered by the context
managers of each mode, restored on exit (also on an exception), per thread as in torch."""

from __future__ import annotations

import pathlib
import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import sbpmpi as sm
from sbpmpi.core.modes import DEFAULT_MODES, AutocastState, Modes, current_modes
from sbpmpi.ops.autocast import current as autocast_state
from sbpmpi.ops.inference import lazy_partial_outputs
from sbpmpi.parallel.reducer import no_sync
from sbpmpi.tape import capturing

PKG = pathlib.Path(sm.__file__).resolve().parent


def _in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` run in a new thread (its result, or its exception raised here)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the thread did not finish in 30 s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_the_defaults_outside_every_block():
    m = current_modes()
    assert m == Modes()
    assert m.grad and not m.autocast.enabled and not m.lazy_partials and not m.no_sync
    assert m.recorder is None and m.tape_capture is None and m.reuse is None


def test_no_grad_in_one_thread_is_not_seen_by_another():
    """As torch: grad mode is per thread, and a new thread starts with grad on."""
    with sm.no_grad():
        assert not sm.is_grad_enabled()
        assert _in_thread(sm.is_grad_enabled) is True
    assert sm.is_grad_enabled()


def test_a_mode_set_in_a_thread_stays_there():
    def other() -> tuple[bool, bool]:
        sm.set_grad_enabled(False)  # as a function: no restore in this thread
        with sm.autocast(dtype=sm.bfloat16), lazy_partial_outputs(), no_sync():
            inside = current_modes()
        return sm.is_grad_enabled(), inside.autocast.enabled and inside.lazy_partials \
            and inside.no_sync

    assert _in_thread(other) == (False, True)
    assert current_modes() == Modes()


def test_autocast_and_lazy_partials_are_per_thread():
    with sm.autocast(dtype=sm.float16), lazy_partial_outputs(), no_sync():
        here = current_modes()
        there = _in_thread(current_modes)
    assert here.autocast == AutocastState(True, np.dtype(np.float16))
    assert here.lazy_partials and here.no_sync
    assert there == Modes()


def test_nested_blocks_restore_each_field_also_on_an_exception():
    with pytest.raises(KeyError):
        with sm.autocast(dtype=sm.bfloat16):
            with sm.no_grad(), lazy_partial_outputs(), no_sync(), capturing() as nodes:
                assert current_modes().tape_capture is nodes
                with sm.enable_grad():
                    assert sm.is_grad_enabled()
                    raise KeyError("inside")
    assert current_modes() == Modes()


def test_decorators_and_a_reused_instance_restore_the_mode():
    ng = sm.no_grad()

    @ng
    def f() -> bool:
        return sm.is_grad_enabled()

    with ng:
        with ng:  # the same instance entered twice
            assert not f()
        assert not sm.is_grad_enabled()
    assert sm.is_grad_enabled() and f() is False and sm.is_grad_enabled()

    ac = sm.autocast(dtype=sm.float16)

    @ac
    def depth(n: int) -> bool:  # the decorator recursing enters ``ac`` again
        return autocast_state().enabled if n == 0 else depth(n - 1)

    assert depth(3) and not autocast_state().enabled


def test_set_grad_enabled_as_a_function_inside_another_block_keeps_its_change():
    """torch: modes are independent; leaving autocast does not undo a grad change made
    inside it with set_grad_enabled(False) as a function."""
    try:
        with sm.autocast(dtype=sm.bfloat16):
            sm.set_grad_enabled(False)
        assert not sm.is_grad_enabled() and not autocast_state().enabled
    finally:
        sm.set_grad_enabled(True)
    with sm.set_grad_enabled(False):
        assert not sm.is_grad_enabled()
    assert sm.is_grad_enabled()
    assert current_modes() is DEFAULT_MODES  # the per-op path's one test finds it again


def test_blocks_left_out_of_order_restore_their_own_field():
    a, b = sm.no_grad(), sm.autocast(dtype=sm.float16)
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)  # left before b: only grad comes back
    assert sm.is_grad_enabled() and autocast_state().enabled
    b.__exit__(None, None, None)
    assert current_modes() == Modes()


def test_inner_captures_collect_their_own_nodes():
    x = sm.tensor(np.arange(4.0), placement=sm.placement("cpu", ranks=[0]), sbp=sm.sbp.broadcast,
                  requires_grad=True)
    with capturing() as outer:
        y = x * 2.0
        with capturing() as inner:
            z = y + 1.0
        w = z * z
    assert [n.name for n in outer] == ["mul", "mul"] and [n.name for n in inner] == ["add"]
    assert w._node is outer[-1]


def test_no_module_outside_comm_has_a_global_statement():
    """Modes are fields of core.modes' state; lazy values are cached functions or fields of
    a holder object (sbpmpi/comm/ has its own owner)."""
    found = [f"{p.relative_to(PKG.parent)}:{i}"
             for p in sorted(PKG.rglob("*.py")) if "comm" not in p.relative_to(PKG).parts[:1]
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.match(r"\s*global\s", line)]
    assert not found, found
