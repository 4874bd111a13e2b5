"""Python and NumPy protocols of GlobalTensor: truth value, scalars, ufuncs, array functions.

:mod:`.scalars` (Python's protocols, ``np.asarray``, ``iter``), :mod:`.ufuncs` (NEP 13),
:mod:`.functions` (NEP 18).

- ``bool(x)``, ``float(x)``, ``int(x)``, ``complex(x)``, ``operator.index(x)`` follow
  NumPy: the value of a one-element (``bool``) or 0-d (the others) tensor, gathered
  collectively; otherwise the error NumPy raises, on every rank (it depends on the shape
  of the whole tensor only, so no rank goes on alone).
- NumPy ufuncs (NEP 13: ``np.exp(x)``, ``np.sin(x)``, ``np.add(x, 1)``,
  ``np.float64(2) * x``) run as the sbpmpi op the op registry names for them and return
  GlobalTensors. ``out=`` a GlobalTensor writes the result into it (NumPy's
  ``same_kind`` casting; it keeps its layout); ``out=`` a NumPy array, ``where=`` and
  ufunc methods (``np.add.reduce``) are refused with a TypeError naming them.
- NumPy functions (NEP 18: ``np.sum(x, axis=0)``, ``np.mean``, ``np.var``, ``np.max``,
  ``np.min``, ``np.transpose``, ``np.reshape``, ``np.concatenate``, ``np.where``,
  ``np.round``, ...) run as the registry's ops; those no single op answers (``np.unique``,
  ``np.atleast_2d``, ``np.sort``, ``np.einsum``, ...: the registry's ``COMPOSED`` rows)
  run as the function above the ops that the registry names for them. :data:`ADAPTERS`
  maps NumPy's arguments, :data:`FUNCTIONS` is made from the registry; ``np.shape``,
  ``np.ndim`` and ``np.size`` read metadata; any other raises a TypeError naming it and
  suggesting ``x.numpy()``.
- ``np.asarray(x)`` gathers the global value on every rank (collective), honouring
  NumPy 2's ``copy=``: ``copy=False`` raises, since the gathered array is always new.
"""

from .functions import ADAPTERS, FUNCTIONS, METADATA_FUNCTIONS, array_function
from .scalars import array, iterate, to_bool, to_index, to_scalar
from .ufuncs import UFUNCS, array_ufunc, write_into

__all__ = ["UFUNCS", "FUNCTIONS", "METADATA_FUNCTIONS", "ADAPTERS", "to_bool", "to_scalar",
           "to_index", "array", "array_ufunc", "array_function", "write_into", "iterate"]
