"""``__array_namespace_info__()``: what the namespace supports, its devices and dtypes."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.placement import Placement
from ._device import default_device, device_arg
from ._dtypes import DTYPES, KINDS

__all__ = ["Info", "__array_namespace_info__"]


class Info:
    """The inspection API of the standard: capabilities, default device and dtypes."""

    def capabilities(self) -> dict[str, Any]:
        """Boolean indexing and data-dependent shapes are supported. The standard (2024.12)
        declares an extension present by the namespace attribute: ``linalg`` and ``fft``
        are (``xp.linalg``, ``xp.fft``)."""
        return {"boolean indexing": True, "data-dependent shapes": True,
                "max dimensions": 64}

    def default_device(self) -> Placement:
        """Every rank of the world, on CPU."""
        return default_device()

    def devices(self) -> list[Placement]:
        """The default device (any other placement is a device too)."""
        return [default_device()]

    def default_dtypes(self, *, device: Any = None) -> dict[str, np.dtype]:
        """float64, complex128, int64 and int64 for indexing."""
        device_arg(device)
        return {"real floating": DTYPES["float64"], "complex floating": DTYPES["complex128"],
                "integral": DTYPES["int64"], "indexing": DTYPES["int64"]}

    def dtypes(self, *, device: Any = None, kind: Any = None) -> dict[str, np.dtype]:
        """The namespace's dtypes by name, of ``kind`` (a kind name, a dtype, or a tuple)."""
        device_arg(device)
        if kind is None:
            return dict(DTYPES)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        out = {}
        for k in kinds:
            if isinstance(k, str):
                if k not in KINDS:
                    raise ValueError(f"dtypes: kind {k!r} is not one of {', '.join(KINDS)}")
                out.update({n: d for n, d in DTYPES.items() if d.kind in KINDS[k]})
            else:
                d = np.dtype(k)
                out[str(d)] = d
        return out


def __array_namespace_info__() -> Info:
    """The namespace's inspection object."""
    return Info()
