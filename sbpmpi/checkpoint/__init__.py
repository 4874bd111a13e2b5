"""Checkpoints: global tensors as standard ``.npy`` files, written and read with MPI-IO.

``sm.save(x, path)`` writes the global value of ``x`` as one ``.npy`` file that
``numpy.load`` reads: rank 0 writes the header, every rank holding a block writes
it in one collective call, and no rank gathers the whole tensor. Partial tensors
are reduced first; along broadcast mesh axes only the first rank writes. The file
is written under a temporary name in the same directory and renamed into place
once every rank has succeeded, so a crash never leaves a partial file under the
final name.

``sm.load(path, placement=, sbp=)`` reads any ``.npy`` file (from ``sm.save``,
``numpy.save`` or else) into any placement and SBP: each rank reads only its own
slice. The header and the file size are checked first; a truncated or corrupt
file raises :class:`~sbpmpi.errors.CheckpointError` on every rank.

``sm.save_state(tensors, directory)`` / ``sm.load_state(directory)`` handle a dict
of tensors with a small JSON index (``index.json``) that is replaced atomically
last, so a directory always describes one complete state. With ``verbose=True`` rank 0
reports each tensor as it is written or read (name, shape, dtype, size, time, rate) on
stderr, as a progress bar when stderr is a terminal and tqdm is installed (the
``progress`` extra).

``sm.checkpoint.save_training_state(directory, model, optimizer)`` and
``load_training_state`` keep a model's parameters and an optimizer's state in one such
directory.

All of them are collective over the world: every rank calls them with the same
arguments.

Every error is raised on every rank alike and names the file: every rank makes its part
of a file's I/O (its block's bytes, its buffer, its file view) before the file is opened,
and the ranks agree on everything each did before each collective MPI-IO call
(:mod:`sbpmpi.comm.file_io`), so that no rank is left inside one; a failed save removes
what it created. The state index records each file's CRC-32, which ``sm.load_state``
verifies (``verify=False`` skips it).

Modules: :mod:`.header` (the ``.npy`` header), :mod:`.regular_file` (reading regular
files only, without blocking), :mod:`.atomic_write` (temporary name, rename once every
rank succeeded, permission bits kept), :mod:`.tensor_file` (one tensor: save, load),
:mod:`.state_directory` (save_state, load_state) with :mod:`.state_index`
(``index.json``), :mod:`.checksum` (a file's CRC-32, computed by the ranks together) and
:mod:`.progress` (``verbose=True``), :mod:`.arguments`; :mod:`.training_state` (a model's
and an optimizer's state in one directory).
"""

from __future__ import annotations

from .header import npy_header as npy_header  # public before the split, outside __all__
from .header import read_header
from .state_directory import load_state, save_state
from .state_index import INDEX_NAME
from .tensor_file import load, save
from .training_state import load_training_state, save_training_state

__all__ = ["save", "load", "save_state", "load_state", "save_training_state",
           "load_training_state", "read_header", "INDEX_NAME"]
