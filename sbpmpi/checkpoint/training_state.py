"""A model's and an optimizer's state in one state directory: ``save_training_state`` and
``load_training_state`` (collective; any layout and world size on load)."""

from __future__ import annotations

import os
from typing import Any

from ..tensor import GlobalTensor
from .state_directory import load_state, save_state

__all__ = ["save_training_state", "load_training_state"]


def _training_state(module: Any, optimizer: Any) -> dict[str, GlobalTensor]:
    out = {f"model.{k}": v for k, v in module.state_dict().items()}
    if optimizer is not None:
        out.update({f"optim.{k}": v for k, v in optimizer.state_dict().items()})
    return out



def save_training_state(directory: str | os.PathLike[str], module: Any,
                        optimizer: Any = None) -> None:
    """``sm.save_state`` of the module's parameters and the optimizer's state (collective)."""
    save_state(_training_state(module, optimizer), directory)



def load_training_state(directory: str | os.PathLike[str], module: Any,
                        optimizer: Any = None, *, verify: bool = True) -> None:
    """Restore what :func:`save_training_state` wrote, into the current layouts.

    Each tensor is read straight into the layout of the parameter (or state tensor) it
    belongs to, so the world size, placement and SBPs may differ from the saving run.
    ``verify``: check each file's CRC-32 against the index (as ``sm.load_state``).
    """
    want = _training_state(module, optimizer)
    state = load_state(directory, placement={k: v.placement for k, v in want.items()},
                       sbp={k: v.sbp for k, v in want.items()}, verify=verify)
    module.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("model.")})
    if optimizer is not None:
        optimizer.load_state_dict({k[6:]: v for k, v in state.items()
                                   if k.startswith("optim.")})
