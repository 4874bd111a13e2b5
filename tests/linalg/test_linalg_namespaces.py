"""One home for linear algebra (issue 42): every name ``sm.linalg`` and
``sm.array_api.linalg`` offered on main 63f6f55 is still there at the same spelling, and
where both namespaces (or the Array API's main namespace) offer a function it is the same
object, ``sm.linalg``'s; the face ``sm.array_api.linalg`` holds no code of its own.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

import sbpmpi as sm
from sbpmpi import array_api as xp

#: ``sbpmpi.linalg.__all__`` on 63f6f55, and its submodules then (``sm.linalg.paths``, ...).
LINALG_63F6F55 = ["lstsq", "cg", "svd_randomized", "path_of", "LstsqResult", "CGResult",
                  "LinalgPath"]
LINALG_MODULES_63F6F55 = ["blocks", "conjugate_gradients", "least_squares", "paths",
                          "randomized", "results", "tall", "tsqr"]
#: ``sbpmpi.array_api.linalg.__all__`` on 63f6f55 (the standard's linalg extension).
ARRAY_API_LINALG_63F6F55 = [
    "cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul",
    "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer", "pinv", "qr",
    "slogdet", "solve", "svd", "svdvals", "tensordot", "trace", "vecdot", "vector_norm",
    "EighResult", "QRResult", "SlogdetResult", "SVDResult"]
#: The linear algebra of the Array API's main namespace and of ``sm`` on 63f6f55.
MAIN_63F6F55 = ["matmul", "matrix_transpose", "tensordot", "vecdot"]


@pytest.mark.parametrize("name", LINALG_63F6F55 + ARRAY_API_LINALG_63F6F55)
def test_sm_linalg_holds_every_name(name: str) -> None:
    assert name in sm.linalg.__all__
    assert getattr(sm.linalg, name) is getattr(importlib.import_module("sbpmpi.linalg"), name)


@pytest.mark.parametrize("name", LINALG_MODULES_63F6F55)
def test_the_submodules_of_sm_linalg_stay(name: str) -> None:
    module = importlib.import_module(f"sbpmpi.linalg.{name}")
    assert getattr(sm.linalg, name) is module


@pytest.mark.parametrize("name", ARRAY_API_LINALG_63F6F55)
def test_the_array_api_face_is_sm_linalg(name: str) -> None:
    assert name in xp.linalg.__all__
    assert getattr(xp.linalg, name) is getattr(sm.linalg, name)


@pytest.mark.parametrize("name", MAIN_63F6F55)
def test_the_main_namespace_takes_sm_linalgs_products(name: str) -> None:
    assert getattr(xp, name) is getattr(sm.linalg, name)


def test_sm_matmul_stays_the_op() -> None:
    """``sm.matmul`` is the registered matmul op (no dtype promotion of its own)."""
    assert sm.matmul is sm.ops.matmul
    assert sm.matmul is not sm.linalg.matmul


def test_the_face_defines_nothing() -> None:
    """Every function and class of ``sm.array_api.linalg`` is defined under ``sm.linalg``."""
    for name in dir(xp.linalg):
        obj = getattr(xp.linalg, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert obj.__module__.startswith("sbpmpi.linalg."), (name, obj.__module__)
