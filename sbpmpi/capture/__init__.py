"""A training step captured as a graph and replayed (``sm.graph``, ``sm.nn.Graph``).

- :mod:`.recorder`: one run of a step recorded through the doors of
  :mod:`sbpmpi.runtime.recording` (kernels, conversions, ``.grad``, host calls), two
  recordings compared, :class:`GraphBreak`.
- :mod:`.replay`: the signature, the replay :class:`~.replay.Plan`, ``graph`` and
  ``Graph``.
"""

from __future__ import annotations

from .recorder import GraphBreak
from .replay import Graph, GraphExplanation, GraphFunction, graph

__all__ = ["graph", "Graph", "GraphFunction", "GraphBreak", "GraphExplanation"]
