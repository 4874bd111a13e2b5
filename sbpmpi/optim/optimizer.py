"""The base class of the optimizers: checked parameters in parameter groups, per-parameter
state tensors in the parameters' layouts, ``zero_grad``, ``step`` (recorded as a host call
while a step is captured as a graph) and a flat ``state_dict``.

``p.grad`` has p's placement and SBP (backward boxes it there), so shard ``i`` of the
gradient belongs to shard ``i`` of the parameter and every update is local; the state
tensors (momentum, Adam moments) live in the parameter's layout too. Broadcast copies
stay identical because every rank applies the same arithmetic to the same values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .. import backend
from ..backend.memory import Scratch, Temporaries
from ..core.modes import current_modes
from ..core.sbp import Partial, broadcast
from ..creation import full, tensor
from ..grad_mode import no_grad
from ..tensor import GlobalTensor

__all__ = ["Optimizer", "recorded_step", "check_number"]

#: Most scratch arrays an optimizer keeps (two temporaries and a scalar per shape and
#: dtype of its parameters): over it, parameters of many shapes came and went.
_MOST_SCRATCH_ARRAYS = 3 * 64


def check_number(owner: str, name: str, value: Any, low: float = 0.0,
                 high: float = math.inf, open_high: bool = False) -> float:
    """``value`` as a float, checked to lie in ``[low, high]`` (``[low, high)`` with
    ``open_high``): TypeError unless a real number, ValueError out of range (both name
    ``owner`` and ``name``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise TypeError(f"{owner}: {name} must be a real number, got {type(value).__name__} "
                        f"{value!r}")
    v = float(value)
    if not (low <= v and (v < high if open_high else v <= high)):
        bound = f"[{low}, {high}{')' if open_high else ']'}"
        raise ValueError(f"{owner}: {name} must lie in {bound}, got {value!r}")
    return v


def recorded_step(step: Any, run: Any, params: list[GlobalTensor],
                  state: list[dict[str, GlobalTensor]]) -> None:
    """``run()``, an optimizer's update; while a step is captured as a graph
    (``sm.graph``), recorded as the host call ``step()``, which updates ``params`` and
    ``state`` in place at every replay."""
    if (recorder := current_modes().recorder) is not None:
        mutated = [(t, t._local) for i, p in enumerate(params) for t in (p, *state[i].values())]
        with recorder.host_call(step, (), mutated):
            run()
        return
    run()


class Optimizer:
    """Base class: checked parameters in parameter groups, per-parameter state tensors,
    ``zero_grad``, flat ``state_dict`` of GlobalTensors (saved with ``sm.save_state``).

    ``params`` is an iterable of GlobalTensors, or of dicts (parameter groups, as torch):
    ``{"params": [...], "weight_decay": 0.0}`` gives those parameters their own values
    of the optimizer's options; options a group leaves out take the constructor's
    values. ``param_groups`` holds the groups (a learning-rate schedule sets their
    ``"lr"``); ``opt.lr`` and the other options read group 0 (and setting one sets it
    in every group).
    """

    #: names of the state tensors each parameter gets (in the parameter's layout)
    buffers: tuple[str, ...] = ()
    #: the options of a parameter group, kept in ``state_dict`` (as 0-d float64 tensors)
    hyper: tuple[str, ...] = ()

    def __init__(self, params: Iterable[GlobalTensor] | Iterable[Mapping[str, Any]],
                 defaults: Mapping[str, Any] | None = None) -> None:
        name = type(self).__name__
        if isinstance(params, GlobalTensor):
            raise TypeError(f"{name}: params must be an iterable of GlobalTensors (e.g. "
                            f"model.parameters()), got one GlobalTensor: wrap it in a list")
        items: list[Any] = list(params)
        if not items:
            raise ValueError(f"{name}: got an empty parameter list")
        defaults = dict(defaults or {})
        if any(isinstance(g, Mapping) for g in items):
            if not all(isinstance(g, Mapping) for g in items):
                raise TypeError(f"{name}: params must be all GlobalTensors or all parameter "
                                f"groups (dicts with a 'params' list), not a mix")
            raw = [dict(g) for g in items]
        else:
            raw = [{"params": items}]
        groups: list[dict[str, Any]] = []
        for k, g in enumerate(raw):
            if "params" not in g:
                raise ValueError(f"{name}: parameter group {k} has no 'params' entry")
            unknown = sorted(set(g) - {"params", *self.hyper})
            if unknown:
                raise ValueError(f"{name}: parameter group {k} has unknown options {unknown}; "
                                 f"{name} takes {list(self.hyper)}")
            ps = g["params"]
            ps = [ps] if isinstance(ps, GlobalTensor) else list(ps)
            if not ps:
                raise ValueError(f"{name}: parameter group {k} has an empty parameter list")
            group = {"params": ps}
            for h in self.hyper:
                group[h] = self._check_option(h, g.get(h, defaults.get(h)))
            groups.append(group)
        self.param_groups: list[dict[str, Any]] = groups
        self.params: list[GlobalTensor] = [p for g in groups for p in g["params"]]
        #: index in ``param_groups`` of each parameter
        self.group_of: list[int] = [k for k, g in enumerate(groups) for _ in g["params"]]
        seen: set[int] = set()
        for i, p in enumerate(self.params):
            what = f"{name}: params[{i}]"
            if not isinstance(p, GlobalTensor):
                raise TypeError(f"{what} must be a GlobalTensor, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError(f"{what} is not a leaf (it is the result of "
                                 f"{p.grad_fn!r}): an optimizer updates leaf tensors; use "
                                 f"x.detach().requires_grad_() to make one")
            if not p.requires_grad:
                raise ValueError(f"{what} does not require grad: call p.requires_grad_() "
                                 f"or create it with requires_grad=True")
            if any(isinstance(s, Partial) for s in p.sbp):
                raise ValueError(f"{what} has SBP {tuple(p.sbp)}: the update of a partial "
                                 f"parameter is not local to its shards; convert it to "
                                 f"broadcast or split (p.to_global(sbp=...)) and optimize that")
            if id(p) in seen:
                raise ValueError(f"{what} appears more than once in the parameter list")
            seen.add(id(p))
        self.state: list[dict[str, GlobalTensor]] = [
            {b: full(p.shape, 0, placement=p.placement, sbp=p.sbp, dtype=p.dtype)
             for b in self._buffers(self.param_groups[k])}
            for p, k in zip(self.params, self.group_of)]
        self.steps = [0] * len(self.params)
        #: where the updates write their temporaries (no array made per step)
        self._scratch = Scratch(limit=_MOST_SCRATCH_ARRAYS)

    def _check_option(self, name: str, value: Any) -> Any:
        """The checked value of option ``name`` of a group (TypeError/ValueError)."""
        return check_number(type(self).__name__, name, value)

    def _buffers(self, group: Mapping[str, Any]) -> tuple[str, ...]:
        """The state tensors of the parameters of ``group``."""
        return self.buffers

    def __getattr__(self, name: str) -> Any:
        # opt.lr & co: group 0's option (as before parameter groups existed)
        if name in type(self).hyper and "param_groups" in self.__dict__:
            return self.param_groups[0][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self).hyper and "param_groups" in self.__dict__:
            value = self._check_option(name, value)
            for g in self.param_groups:
                g[name] = value
            return
        super().__setattr__(name, value)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients: ``p.grad = None``, or new zeros when not ``set_to_none``
        (never in place: a gradient may be shared by several leaves)."""
        # a step being captured as a graph (sm.graph): replayed as a call
        if (recorder := current_modes().recorder) is not None:
            with recorder.host_call(self.zero_grad, (set_to_none,), ()):
                self._zero_grad(set_to_none)
            return
        self._zero_grad(set_to_none)

    def _zero_grad(self, set_to_none: bool) -> None:
        for p in self.params:
            p._set_grad(None if set_to_none or p.grad is None else
                        full(p.shape, 0, placement=p.placement, sbp=p.sbp, dtype=p.dtype))

    def step(self) -> None:
        """Update every parameter that has a gradient (local to each rank's shards)."""
        recorded_step(self.step, self._step, self.params, self.state)

    def _step(self) -> None:
        with no_grad():
            for i, p in enumerate(self.params):
                g = p.grad
                if g is None:
                    continue
                if g.layout != p.layout:  # only a user assignment can do this
                    raise ValueError(f"{type(self).__name__}: params[{i}].grad has layout "
                                     f"{g.layout}, the parameter {p.layout}")
                self.steps[i] += 1
                local = p.to_local()
                if local.size:
                    xp = backend.get_xp(p.placement.type)
                    self._update(xp, local, g.to_local(),
                                 {k: v.to_local() for k, v in self.state[i].items()},
                                 self.steps[i], self.param_groups[self.group_of[i]])

    def _update(self, xp: Any, p: Any, g: Any, state: dict[str, Any], step: int,
                group: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _temporaries(self, xp: Any, p: Any, g: Any, state: dict[str, Any]
                     ) -> Temporaries | None:
        """Where the update of parameter shard ``p`` writes its temporaries: two arrays
        of ``p``'s shape and dtype and its scalars, from this optimizer's scratch, shared
        by its parameters (one update at a time uses it); None when the gradient or a
        state buffer has another dtype than ``p`` (the update then runs with NumPy's
        promotion as written, with its temporaries)."""
        if g.dtype != p.dtype or any(b.dtype != p.dtype for b in state.values()):
            return None
        return self._scratch.temporaries(xp, p.shape, p.dtype, 2)

    # -- state ---------------------------------------------------------------------------
    def _hyper_keys(self) -> list[tuple[str, int, str]]:
        """``(state_dict key, group, option)``: group 0's options under their names,
        group k's under ``groups.{k}.{name}``."""
        return [(h if k == 0 else f"groups.{k}.{h}", k, h)
                for k in range(len(self.param_groups)) for h in self.hyper]

    def state_dict(self) -> dict[str, GlobalTensor]:
        """Flat dict of GlobalTensors: ``"{i}.{buffer}"`` in params[i]'s layout,
        ``"{i}.step"`` and the options as 0-d broadcast tensors (group 0's under their
        names, group ``k``'s as ``"groups.{k}.{name}"``).

        Save it with ``sm.save_state``; :meth:`load_state_dict` takes it back on any
        world size and layout (each tensor is boxed into its parameter's layout).
        """
        out: dict[str, GlobalTensor] = {}
        pl = self.params[0].placement
        b = (broadcast,) * pl.ndim
        for i, p in enumerate(self.params):
            for k, v in self.state[i].items():
                out[f"{i}.{k}"] = v
            out[f"{i}.step"] = full((), self.steps[i], placement=p.placement,
                                    sbp=(broadcast,) * p.placement.ndim, dtype=np.int64)
        for key, gi, h in self._hyper_keys():
            out[key] = tensor(np.asarray(self.param_groups[gi][h], dtype=np.float64),
                              placement=pl, sbp=b)
        return out

    def load_state_dict(self, state: Mapping[str, GlobalTensor]) -> None:
        """Restore from :meth:`state_dict` (collective: boxes each tensor to its layout)."""
        name = type(self).__name__
        want = set(self.state_dict())
        if not isinstance(state, Mapping):
            raise TypeError(f"{name}.load_state_dict: needs a dict of name -> GlobalTensor, "
                            f"got {type(state).__name__}")
        missing = sorted(want - set(state))
        if missing:
            raise KeyError(f"{name}.load_state_dict: state lacks {missing}")
        for k in want:
            v = state[k]
            if not isinstance(v, GlobalTensor):
                raise TypeError(f"{name}.load_state_dict: {k!r} must be a GlobalTensor, got "
                                f"{type(v).__name__}")
        for i, p in enumerate(self.params):
            for k in self.state[i]:
                v = state[f"{i}.{k}"]
                if v.shape != p.shape:
                    raise ValueError(f"{name}.load_state_dict: {i}.{k} has shape {v.shape}, "
                                     f"params[{i}] {p.shape}")
                self.state[i][k] = _into(v, p)
            self.steps[i] = int(state[f"{i}.step"].item())
        for key, gi, h in self._hyper_keys():
            a = state[key].numpy()
            self.param_groups[gi][h] = tuple(float(x) for x in a) if h == "betas" else float(a)


def _into(v: GlobalTensor, like: GlobalTensor) -> GlobalTensor:
    """``v`` in ``like``'s layout and dtype, as a new tensor the optimizer owns."""
    with no_grad():
        if v.dtype != like.dtype:
            v = v.astype(like.dtype)
        v = v.to_global(placement=like.placement, sbp=like.sbp)
    local = v.to_local()
    return GlobalTensor(local.copy(), v.layout, v.dtype)
