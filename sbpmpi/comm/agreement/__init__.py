"""Agreement across ranks: do the ranks of a group agree, and if not, what did each do?

:mod:`.exchange` (the one mechanism: a fingerprint all-reduce, the descriptions gathered
on a mismatch, and the collective decisions ``all_ok``, ``raise_if_any``,
``decide_on_root``, ``collective_errors``; its names are this package's), :mod:`.checks`
(comm's checked mode, ``SBPMPI_COMM_CHECK``), :mod:`.mismatch` (the message of ranks that
disagree), :mod:`.settings` (the ``SBPMPI_*`` settings compared across ranks at import).
"""

from .exchange import (
    CHECK_LABEL,
    MASK63,
    Agreement,
    agree,
    agree_flagged,
    all_ok,
    build_error,
    collective_errors,
    covers_world,
    decide_on_root,
    fingerprint_of,
    gather,
    members,
    raise_if_any,
    raised_on_every_rank,
)

__all__ = ["MASK63", "CHECK_LABEL", "fingerprint_of", "members", "covers_world", "agree",
           "agree_flagged", "Agreement", "gather", "all_ok",
           "raise_if_any", "decide_on_root", "collective_errors", "build_error",
           "raised_on_every_rank"]
