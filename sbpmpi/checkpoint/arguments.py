"""Argument checks of the checkpoint functions: pure, identical on every rank, before any
communication."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..core.placement import Placement
from ..tensor import GlobalTensor

__all__ = ["path_arg", "tensor_arg", "placement_arg", "sbp_arg", "verbose_arg"]


def path_arg(path: Any, name: str = "path") -> str:
    """``path`` as a non-empty str (``os.fspath``); TypeError/ValueError otherwise."""
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or os.PathLike, got {type(path).__name__} "
                        f"{path!r}")
    p = os.fspath(path)
    if not isinstance(p, str) or not p:
        raise ValueError(f"{name} must be a non-empty file name, got {path!r}")
    return p


def tensor_arg(x: Any, what: str) -> GlobalTensor:
    """``x`` itself when it is a GlobalTensor whose dtype a ``.npy`` file can hold."""
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"{what} needs a GlobalTensor, got {type(x).__name__}; to save a local "
                        f"array use numpy.save, or make it global with sm.to_global first")
    _dtype_ok(x.dtype, what)
    return x


def _dtype_ok(dt: np.dtype, what: str) -> None:
    if dt.hasobject:
        raise TypeError(f"{what}: dtype {dt} holds Python objects and cannot be stored in a "
                        f".npy file without pickling; convert to a numeric dtype first")
    if dt.itemsize == 0:
        raise TypeError(f"{what}: dtype {dt} has zero-size elements")


def placement_arg(placement: Any, what: str) -> Placement:
    """``placement`` when it is an sm.placement; TypeError (naming an example) otherwise."""
    if placement is None:
        raise TypeError(f"{what}: placement= is required, e.g. sm.placement('cpu', [0, 1])")
    if not isinstance(placement, Placement):
        raise TypeError(f"{what}: placement must be an sm.placement, got "
                        f"{type(placement).__name__} {placement!r}")
    return placement


def sbp_arg(sbp: Any, what: str) -> Any:
    """``sbp`` unless it is missing (Layout.make checks the rest)."""
    if sbp is None:
        raise TypeError(f"{what}: sbp= is required, e.g. sm.sbp.split(0) or sm.sbp.broadcast")
    return sbp


def verbose_arg(verbose: Any, what: str, name: str = "verbose") -> bool:
    """``verbose`` (the argument ``name``) when it is a bool (not merely truthy)."""
    if not isinstance(verbose, bool):
        raise TypeError(f"{what}: {name} must be True or False, got {verbose!r}")
    return verbose
