"""Reverse-mode automatic differentiation of global tensors.

Ops on tensors that require grad record a :class:`~sbpmpi.autograd.tape.Node` on their
result; ``loss.backward()`` walks the tape back with the rules of
:mod:`sbpmpi.autograd.rules` (written with global ops, so each backward op chooses its
SBP signature by inference) and accumulates into ``leaf.grad`` in the leaf's layout.
"""

from __future__ import annotations

from typing import Any

from ..grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from ..tape import Node
from . import rules as rules  # attaches every op's backward rule to the op registry
from .hooks import (
    HookHandle,
    register_backward_end_hook,
    register_leaf_hook,
    register_poll_hook,
)

__all__ = ["no_grad", "enable_grad", "is_grad_enabled", "set_grad_enabled", "Node", "backward",
           "HookHandle", "register_leaf_hook", "register_backward_end_hook",
           "register_poll_hook"]


def backward(tensor: Any, gradient: Any = None) -> None:
    """``tensor.backward(gradient)`` (see :func:`sbpmpi.autograd.engine.backward`)."""
    from .engine import backward as run

    run(tensor, gradient)
