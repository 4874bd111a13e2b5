"""The op registry is complete: every door leads to a registered op, and nothing else does.

Walks the surfaces by which an op can be reached (``sm.<name>``, ``sm.ops.<name>``,
``GlobalTensor``'s operator methods, the NumPy ufuncs and functions the protocols accept,
the array API's elementwise names, ``sm.explain``) and checks each against
:data:`sbpmpi.ops.registry.REGISTRY`; checks that every differentiable entry has a
backward rule and no rule lacks an entry; and that every op has an example for the
table-wide tests (tests/ops/op_examples.py). Metadata only, no MPI.
"""

from __future__ import annotations

import ast
import inspect
import pathlib

import numpy as np
import pytest
from op_examples import EXAMPLES

import sbpmpi as sm
from sbpmpi import protocols
from sbpmpi.array_api import _elementwise
from sbpmpi.autograd import rules
from sbpmpi.ops import registry
from sbpmpi.ops.op import GlobalOp
from sbpmpi.ops.registry import OPERATOR_METHODS, REGISTRY, OpEntry
from sbpmpi.tensor import GlobalTensor

PKG = pathlib.Path(sm.__file__).parent


def test_every_op_is_registered_once_with_a_global_op():
    assert len(REGISTRY) == len(set(REGISTRY))
    for name, e in REGISTRY.items():
        assert isinstance(e, OpEntry) and e.name == name and isinstance(e.op, GlobalOp)
        assert e.op.name == name and e.table is e.op.table and e.kind in registry.KINDS
    assert sm.ops.OPS == {name: e.op for name, e in REGISTRY.items()}


def test_ops_namespace_and_all_are_the_registry():
    names = set(sm.ops.__all__)
    assert set(REGISTRY) <= names
    for name in names:
        obj = getattr(sm.ops, name)
        if isinstance(obj, GlobalOp):
            assert name in REGISTRY and REGISTRY[name].op is obj, name
    for name, e in REGISTRY.items():
        assert getattr(sm.ops, name) is e.op, name


def test_sm_names_are_the_public_entries():
    ops_in_sm = {n for n in sm.__all__ if isinstance(getattr(sm, n), GlobalOp)}
    assert ops_in_sm == {n for n, e in REGISTRY.items() if e.public}
    for name in ops_in_sm:
        assert getattr(sm, name) is REGISTRY[name].op
    for name, e in REGISTRY.items():
        if not e.public:
            assert not isinstance(getattr(sm, name, None), GlobalOp), name


def test_every_operator_method_of_global_tensor_comes_from_the_registry():
    for name in OPERATOR_METHODS:
        method = GlobalTensor.__dict__.get(name)
        entry = registry.entry_for_dunder(name)
        if entry is None:
            assert method is None, f"GlobalTensor.{name} is not made from the registry"
            continue
        assert method is sm.ops.operators.METHODS[name], name
        assert name in entry.dunders
    # every binary operator has its forward, reflected and in-place form
    for e in REGISTRY.values():
        forms = {OPERATOR_METHODS[d].form for d in e.dunders}
        if "forward" in forms and OPERATOR_METHODS[e.dunders[0]].symbol not in (
                "==", "!=", "<", "<=", ">", ">="):
            assert forms == {"forward", "reflected", "inplace"}, e.name


def test_type_stubs_of_the_operators_match_the_installed_ones():
    """tensor.py declares the installed operators for type checkers (``if TYPE_CHECKING``):
    exactly the methods the registry installs."""
    tree = ast.parse((PKG / "tensor.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GlobalTensor")
    block = next(n for n in cls.body if isinstance(n, ast.If)
                 and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING")
    declared = {f.name for f in block.body if isinstance(f, ast.FunctionDef)}
    assert declared == set(sm.ops.operators.METHODS)


def test_every_numpy_ufunc_and_function_we_accept_is_a_registered_op():
    for ufunc, op in protocols.UFUNCS.items():
        e = registry.entry_for_ufunc(ufunc.__name__)
        assert e is not None and e.op is op, ufunc
    for e in REGISTRY.values():
        for u in e.ufuncs:
            assert protocols.UFUNCS[getattr(np, u)] is e.op
        for f in e.functions:
            assert getattr(np, f) in protocols.FUNCTIONS
    for name in registry.COMPOSED:  # the functions composed of ops, from the registry too
        assert getattr(np, name) in protocols.FUNCTIONS, name
    for func in protocols.FUNCTIONS:
        name = func.__name__
        assert (registry.entry_for_function(name) is not None) != (
            registry.composed_for_function(name) is not None), func
    # the metadata functions compute nothing: no op answers them
    assert not set(protocols.METADATA_FUNCTIONS) & set(protocols.FUNCTIONS)


def test_every_composed_function_resolves_to_a_callable_target():
    import importlib

    for name, row in registry.COMPOSED.items():
        module, _, qualname = row.target.partition(":")
        f = importlib.import_module(module)
        for part in qualname.split("."):
            f = getattr(f, part)
        assert callable(f), (name, row.target)


@pytest.mark.parametrize("rows,match", [
    ([("sum", "sbpmpi.array_api:sum")], "claimed by the op 'sum'"),
    ([("unique", "m:f"), ("unique", "m:g")], "listed twice"),
    ([("exp", "m:f")], "is a ufunc"),
    ([("unique", "sbpmpi.array_api.unique")], "not 'module:name'"),
])
def test_the_composed_table_refuses_a_second_claim_a_ufunc_and_a_bad_target(rows, match):
    with pytest.raises(ValueError, match=match):
        registry._composed(rows)


def test_every_array_api_elementwise_name_is_an_alias_of_a_registered_op():
    xp = sm.array_api
    for name in _elementwise.STANDARD:
        e = registry.entry_for_array_api(name)
        assert e is not None, name
        f = getattr(xp, name)
        assert f is _elementwise.ELEMENTWISE[name] and f.__name__ == name
        assert name in e.array_api
    for e in REGISTRY.values():
        for a in e.array_api:
            assert a in _elementwise.STANDARD, (e.name, a)


def test_the_array_api_elementwise_names_are_the_standards():
    """The standard's elementwise functions (2024.12) and no others."""
    assert set(_elementwise.STANDARD) == {
        "abs", "acos", "acosh", "add", "asin", "asinh", "atan", "atan2", "atanh",
        "bitwise_and", "bitwise_left_shift", "bitwise_invert", "bitwise_or",
        "bitwise_right_shift", "bitwise_xor", "ceil", "clip", "conj", "copysign", "cos",
        "cosh", "divide", "equal", "exp", "expm1", "floor", "floor_divide", "greater",
        "greater_equal", "hypot", "imag", "isfinite", "isinf", "isnan", "less", "less_equal",
        "log", "log1p", "log2", "log10", "logaddexp", "logical_and", "logical_not",
        "logical_or", "logical_xor", "maximum", "minimum", "multiply", "negative",
        "nextafter", "not_equal", "positive", "pow", "real", "reciprocal", "remainder",
        "round", "sign", "signbit", "sin", "sinh", "square", "sqrt", "subtract", "tan",
        "tanh", "trunc", "where"}


def test_explain_knows_every_registered_op():
    for name in REGISTRY:
        with pytest.raises((TypeError, ValueError, IndexError, AttributeError)) as info:
            sm.explain(name)  # no arguments: the builder's own error, not "unknown op"
        assert "unknown op" not in str(info.value), name
    with pytest.raises(ValueError, match="unknown op"):
        sm.explain("no_such_op")


def test_every_differentiable_entry_has_a_rule_and_every_rule_an_entry():
    for name, e in REGISTRY.items():
        assert (e.backward is not None) == e.differentiable, name
        assert rules.rule_for(name) is e.backward
    assert not set(rules.TAPE_ONLY_RULES) & set(REGISTRY)
    with pytest.raises(ValueError, match="already has a backward rule"):
        registry.attach_backward("add", rules.rule_for("sub"))
    registry.attach_backward("add", rules.rule_for("add"))  # the same rule again: no change
    with pytest.raises(ValueError, match="not a registered op"):
        registry.attach_backward("to_global", rules.rule_for("to_global"))
    with pytest.raises(ValueError, match="not differentiable"):
        registry.attach_backward("eq", rules.rule_for("add"))
    with pytest.raises(ValueError, match="already have backward rules"):
        rules.register_rules({"add": rules.rule_for("add")})


def test_every_op_has_an_example_for_the_table_wide_tests():
    assert set(EXAMPLES) == set(REGISTRY)
    assert all(EXAMPLES[name] for name in REGISTRY)


def test_a_door_claimed_twice_or_a_second_registration_is_refused():
    add = REGISTRY["add"]
    with pytest.raises(ValueError, match="registered twice"):
        registry._registry([add, add])
    clash = OpEntry("sub", REGISTRY["sub"].op, "pointwise", ufuncs=("add",))
    with pytest.raises(ValueError, match="ufunc 'add' is claimed by 'add' and 'sub'"):
        registry._registry([add, clash])
    with pytest.raises(ValueError, match="holds the op"):
        OpEntry("mul", REGISTRY["sub"].op, "pointwise")
    with pytest.raises(ValueError, match="not a NumPy ufunc"):
        OpEntry("sub", REGISTRY["sub"].op, "pointwise", ufuncs=("sum",))
    with pytest.raises(ValueError, match="kind"):
        OpEntry("sub", REGISTRY["sub"].op, "nonsense")  # type: ignore[arg-type]


def test_operator_methods_cover_pythons_operators():
    import operator

    for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
                 "or", "xor", "lshift", "rshift"):
        assert hasattr(operator, f"__{name}__")
        for form in (f"__{name}__", f"__r{name}__", f"__i{name}__"):
            assert form in OPERATOR_METHODS
    assert inspect.isfunction(sm.ops.operators.METHODS["__add__"])
