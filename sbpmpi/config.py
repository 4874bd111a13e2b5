"""Every ``SBPMPI_*`` setting, declared once: its type, default, allowed values and help.

Each setting is a :class:`Setting` in this module (``sm.config.check``,
``sm.config.timeout``, ...) whose :attr:`~Setting.value` is what the package uses. The
value comes from one of three places, in this order of precedence:

1. the program: :func:`update` (``sm.config.update(check=False)``) or, for a block,
   :func:`override` (``with sm.config.override(timeout=60): ...``);
2. the environment variable (``SBPMPI_CHECK=0``), read when sbpmpi is imported
   (:func:`reset` reads it again);
3. the declared default.

A setting changed in the program must be changed on every rank alike, as every other
collective step. A module that must act when a setting changes (the host pool frees idle
blocks, the GPU transport is chosen again) registers a callback with :func:`on_update`;
this module imports nothing else of sbpmpi, so every layer can ask it.

Reading a value is one attribute read (``config.check.value``), cheap enough for the
per-op path. :func:`report` (and ``python -m sbpmpi config``) lists every setting with its
value and where the value came from; :func:`markdown` writes the documentation's table
(``docs/configuration.md``) from the declarations.

Only this module reads ``SBPMPI_*`` variables from the environment (a test walks the
package's source to check it).
"""

from __future__ import annotations

import os
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Generic, NamedTuple, TypeVar

__all__ = [
    "Setting",
    "SettingRow",
    "SETTINGS",
    "switch",
    "update",
    "override",
    "reset",
    "on_update",
    "report",
    "format_report",
    "markdown",
    "MAX_SECONDS",
    "startup_errors",
    "comparison",
    # the settings, one per SBPMPI_* variable
    "abort_on_error",
    "array_api_sbp",
    "check",
    "comm_check",
    "cost_cache",
    "cuda_aware",
    "debug",
    "exit_watch",
    "gpu_transport",
    "host_pool_bytes",
    "ipc_node_size",
    "mpiexec",
    "mpiexec_args",
    "timeout",
]

T = TypeVar("T")

PREFIX = "SBPMPI_"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")
_UNSET: Any = object()

#: Where a value came from.
DEFAULT, ENVIRONMENT, PROGRAM = "default", "environment", "program"


def switch(text: str | None) -> bool | None:
    """An on/off word's value: True for 1/true/yes/on, False for 0/false/no/off (any case,
    surrounding spaces ignored), None when ``text`` is None or anything else.

    The one vocabulary of every on/off environment variable (sbpmpi's own, parsed by
    their :class:`Setting`, and MPI libraries' variables that sbpmpi reads).
    """
    if text is None:
        return None
    text = text.strip().lower()
    return True if text in _ON else False if text in _OFF else None


# -- kinds of setting: how the environment's text is parsed, how a program's value is checked --

class _Kind(NamedTuple):
    """How one kind of setting reads text and checks values."""

    name: str  # shown in the docs' table
    parse: Callable[[Setting[Any], str], Any]  # stripped, non-empty text -> value
    check: Callable[[Setting[Any], Any], Any]  # a program's value -> value (raises if bad)
    spell: Callable[[Any], str]  # value -> how the environment writes it


def _parse_switch(s: Setting[Any], text: str) -> bool:
    on = switch(text)
    if on is None:
        raise s.bad_text(text, "1/true/yes/on or 0/false/no/off (any case)")
    return on


def _check_switch(s: Setting[Any], value: Any) -> bool | None:
    automatic = s.default is None  # None: back to the automatic choice
    if not (isinstance(value, bool) or (automatic and value is None)):
        raise s.bad_value(value, "True or False" + (", or None for the automatic choice"
                                                    if automatic else ""))
    return value  # type: ignore[no-any-return]


#: The longest timeout a setting takes, in seconds (about 31 years): within what a timer
#: accepts (``threading.TIMEOUT_MAX``, 2**63 ns on Linux), so that a watchdog never fails
#: with OverflowError on a value the parser let through.
MAX_SECONDS = min(1e9, threading.TIMEOUT_MAX)


def _parse_seconds(s: Setting[Any], text: str) -> float | None:
    if text.lower() in ("0", "off", "none"):
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= MAX_SECONDS:
        raise s.bad_text(text, f"a positive number of seconds up to {MAX_SECONDS:.0f} (e.g. "
                               f"600), or 0 / unset for off")
    return seconds


def _check_seconds(s: Setting[Any], value: Any) -> float | None:
    if value is None:
        return None
    expected = f"a positive number of seconds up to {MAX_SECONDS:.0f}, or None for off"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise s.bad_value(value, expected)
    if not 0 < value <= MAX_SECONDS:
        raise s.bad_value(value, expected, ValueError)
    return float(value)


def _parse_bytes(s: Setting[Any], text: str) -> int:
    digits = text.upper().removesuffix("B").removesuffix("I")
    scale = 1
    if digits and digits[-1] in "KMG":
        scale = 1 << (10 * ("KMG".index(digits[-1]) + 1))
        digits = digits[:-1]
    try:
        n = int(digits)
    except ValueError:
        n = -1
    if n < 0:
        raise s.bad_text(text, "a size in bytes such as 512M, 2G or 1073741824 (0: off)")
    return n * scale


def _check_count(s: Setting[Any], value: Any, least: int, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise s.bad_value(value, f"{what}, or None for the default")
    if value < least:
        raise s.bad_value(value, f"{what}, or None for the default", ValueError)
    return value


def _parse_positive(s: Setting[Any], text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise s.bad_text(text, "a positive whole number")
    return n


def _parse_choice(s: Setting[Any], text: str) -> str:
    value = text.lower()
    if value not in s.choices:
        raise s.bad_text(text, f"one of {', '.join(s.choices)} (or unset for the automatic "
                               f"choice)")
    return value


def _check_choice(s: Setting[Any], value: Any) -> str | None:
    if value is None:
        return None
    expected = f"one of {', '.join(map(repr, s.choices))}, or None for the automatic choice"
    if not isinstance(value, str):
        raise s.bad_value(value, expected)
    if value.strip().lower() not in s.choices:
        raise s.bad_value(value, expected, ValueError)
    return value.strip().lower()


def _parse_text(s: Setting[Any], text: str) -> str:
    return text


def _check_text(s: Setting[Any], value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise s.bad_value(value, "a string, or None for the default")


def _parse_cache(s: Setting[Any], text: str) -> str:
    return "off" if text.lower() in ("off", "0", "none", "no") else text


def _check_cache(s: Setting[Any], value: Any) -> str | None:
    value = _check_text(s, value)
    return None if value is None or not value.strip() else _parse_cache(s, value.strip())


def _spell_plain(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return "unset" if value is None else str(value)


SWITCH = _Kind("switch", _parse_switch, _check_switch, _spell_plain)
SECONDS = _Kind("seconds", _parse_seconds, _check_seconds, _spell_plain)
BYTES = _Kind("bytes", _parse_bytes,
              lambda s, v: _check_count(s, v, 0, "a number of bytes >= 0"), _spell_plain)
COUNT = _Kind("positive int", _parse_positive,
              lambda s, v: _check_count(s, v, 1, "a positive int"), _spell_plain)
CHOICE = _Kind("choice", _parse_choice, _check_choice, _spell_plain)
TEXT = _Kind("text", _parse_text, _check_text, _spell_plain)
PATH = _Kind("path or off", _parse_cache, _check_cache, _spell_plain)


class Setting(Generic[T]):
    """One ``SBPMPI_*`` setting: its declaration and its current value.

    Attributes
    ----------
    name : str
        The name in :func:`update` (``"check"``); the variable is ``SBPMPI_`` + the name in
        capitals.
    value
        The value in use (read it; change it with :func:`update`).
    source : str
        Where the value came from: ``"default"``, ``"environment"`` or ``"program"``.
    default
        The value when neither the environment nor the program sets one.
    default_text : str
        The default as the documentation states it.
    choices : tuple of str
        The allowed values of a choice (empty otherwise).
    help : str
        One line: what the setting does.
    details : str
        More about it, for the documentation (Markdown; may be empty).
    per_rank : bool
        The value may differ between ranks (it changes only what one process does
        alone); every other setting is compared across the ranks at start.
    """

    __slots__ = ("name", "env", "kind", "default", "default_text", "choices", "help",
                 "details", "per_rank", "value", "source", "_callbacks")

    def __init__(self, name: str, kind: _Kind, default: T, help: str, *,
                 default_text: str = "", choices: tuple[str, ...] = (), details: str = "",
                 per_rank: bool = False) -> None:
        self.name = name
        self.env = PREFIX + name.upper()
        self.kind = kind
        self.default: T = default
        self.default_text = default_text or f"`{kind.spell(default)}`"
        self.choices = choices
        self.help = help
        self.details = details
        self.per_rank = per_rank
        self.value: T = default
        self.source = DEFAULT
        self._callbacks: list[Callable[[Any], None]] = []

    def __repr__(self) -> str:
        return f"<Setting {self.name}={self.value!r} ({self.source})>"

    def parse(self, text: str | None) -> T:
        """The value that the environment's ``text`` stands for (unset or blank: the
        default); raises ValueError naming the variable for text it does not understand."""
        if text is None or not text.strip():
            return self.default
        return self.kind.parse(self, text.strip())  # type: ignore[no-any-return]

    def checked(self, value: Any) -> T:
        """``value`` as a program sets it, checked (raises TypeError or ValueError)."""
        return self.kind.check(self, value)  # type: ignore[no-any-return]

    def bad_text(self, text: str, expected: str) -> ValueError:
        return ValueError(f"{self.env}={text!r} is not understood; expected {expected}")

    def bad_value(self, value: Any, expected: str, error: type[Exception] = TypeError
                  ) -> Exception:
        return error(f"sm.config: {self.name}={value!r} is not allowed; expected {expected}")

    def origin(self) -> str:
        """Where the value came from, as text: ``SBPMPI_CHECK=0 (environment)``,
        ``check=False (set in the program)`` or ``default``."""
        if self.source == ENVIRONMENT:
            return f"{self.env}={self.kind.spell(self.value)} (environment)"
        if self.source == PROGRAM:
            return f"sm.config {self.name}={self.value!r} (set in the program)"
        return "default"


#: Every setting by name, in the order of the documentation.
SETTINGS: dict[str, Setting[Any]] = {}


def _declare(setting: Setting[T]) -> Setting[T]:
    SETTINGS[setting.name] = setting
    return setting


# -- the declarations ---------------------------------------------------------------------------

abort_on_error: Setting[bool | None] = _declare(Setting(
    "abort_on_error", SWITCH, None,
    "An uncaught exception on any rank prints the rank, the cause and the traceback, then "
    "aborts the whole job (MPI_Abort) instead of leaving the other ranks waiting.",
    default_text="on when the world has more than 1 process",
    details="The report reads `sbpmpi: rank R: uncaught <Type>: <message>` and the traceback; "
    "`0` turns the hooks off, `1` turns them on even for one process. They cannot see "
    "`sys.exit(n)`: `python -m sbpmpi.abort prog.py ARGS` runs a program so that a "
    "`sys.exit(n)` with `n != 0` on one rank also aborts the job."))
array_api_sbp: Setting[str | None] = _declare(Setting(
    "array_api_sbp", CHOICE, "split",
    "The SBP of arrays that sbpmpi.array_api creates without a device= placement (on all "
    "ranks of the world): split on the first axis, or broadcast.",
    choices=("split", "broadcast"),
    details="`split`: an array with a first axis is split along it (`S(0)`, shards may be "
    "uneven), a 0-d array is broadcast; `broadcast`: every rank holds the whole array. "
    "`None` (set in the program) means the default, `split`. Change it for a block with "
    "`sm.config.override(array_api_sbp=\"broadcast\")`."))
check: Setting[bool] = _declare(Setting(
    "check", SWITCH, True,
    "Before each step that communicates, the ranks of its placements compare a fingerprint "
    "of the step (op, shapes, dtypes, SBPs, placements) in one 16-byte all-reduce over "
    "their communicator; local steps are folded into their group's next comparison; ranks "
    "outside make no call. 0: off (benchmarks).",
    details="Local-only ops (no data moves) are folded into the next comparison of their "
    "group (the ranks of their placements), so they cost no communication. A rank outside "
    "an op's placements takes no part in its check. While it waits, the check also "
    "watches for peers that reached the end of the program. `0` turns the check off; the "
    "end-of-program handshake stays."))
comm_check: Setting[bool] = _declare(Setting(
    "comm_check", SWITCH, False,
    "Checked mode of sm.comm: every call first compares its arguments across ranks (dtype, "
    "sizes, root, op), so a mistake made on one rank only raises on every rank instead of "
    "hanging.",
    details="The comparison is one 16-byte all-reduce of a fingerprint of the arguments; "
    "they are gathered only when they differ, so a wrong count or a root-only argument "
    "raises the same error on every rank instead of hanging or corrupting data. A "
    "conversion (`x.to_global`) is compared once, as a whole, and its calls skip their own "
    "comparison."))
cost_cache: Setting[str | None] = _declare(Setting(
    "cost_cache", PATH, None,
    "The file where sm.boxing.calibrate() keeps measured cost tables; off: no cache file.",
    details="Entries are keyed by host, MPI library, GPU, GPU transport and number of ranks; "
    "single-node GPU jobs use the cached device row at start, and `python -m sbpmpi info "
    "--calibrate` measures and refreshes it.",
    default_text="`$XDG_CACHE_HOME/sbpmpi/cost-tables.json` (else `~/.cache/...`)"))
cuda_aware: Setting[bool | None] = _declare(Setting(
    "cuda_aware", SWITCH, None,
    "Whether MPI takes device pointers: 1 hands GPU arrays to MPI directly, 0 stages them "
    "through pinned host buffers.",
    default_text="what the MPI library reports",
    details="Detected at the first GPU transfer: Open MPI's `MPIX_Query_cuda_support` and "
    "its run-time switch `opal_cuda_support` (read through MPI_T), MPICH's "
    "`MPIX_GPU_query_support`, Cray's `MPICH_GPU_SUPPORT_ENABLED`, MVAPICH's "
    "`MV2_USE_CUDA`, Intel MPI's `I_MPI_OFFLOAD`. `python -m sbpmpi info` shows the verdict "
    "and the reason. It wins over `gpu_transport=mpi|staged`."))
debug: Setting[bool] = _declare(Setting(
    "debug", SWITCH, False,
    "Checks every op at once (no folding) and also that the shards along broadcast mesh "
    "axes are identical (a pass over the data: for debugging).",
    details="The shards are compared by a hash of each, across the ranks of each broadcast "
    "mesh axis; a difference raises `CollectiveMismatchError` naming the ranks."))
exit_watch: Setting[bool] = _declare(Setting(
    "exit_watch", SWITCH, True,
    "A raw sm.comm call that waits more than a second on a peer that already reached the "
    "end of the program ends the job, naming that peer.",
    details="`0` turns it off; it costs well under a microsecond per call."))
gpu_transport: Setting[str | None] = _declare(Setting(
    "gpu_transport", CHOICE, None,
    "How GPU shards move: ipc (CUDA IPC between the ranks of a node), mpi (device pointers "
    "to MPI) or staged (pinned host buffers).",
    default_text="`mpi` on a CUDA-aware MPI, else `staged`", choices=("ipc", "mpi", "staged"),
    details="`ipc` copies straight out of the other ranks' GPU memory when the ranks of a "
    "collective share a node; across nodes with the same number of ranks on each, "
    "all-reduce and all-gather are hierarchical (IPC on each node, one staged MPI exchange "
    "between nodes); other calls take the `mpi` or `staged` path. The ranks of a call "
    "decide its route together, in one small exchange: one rank with host arrays or memory "
    "that cannot be exported sends the whole group down the MPI path. `ipc` stays off "
    "where device pointers go to MPI (a CUDA-aware MPI maps its peers' buffers itself); "
    "`SBPMPI_CUDA_AWARE=0` keeps it on there. "
    "`ipc` is not the default yet: it has been tested against a stand-in device only. "
    "`python -m sbpmpi info` and `sm.comm.info()` say which transport is in use and why."))
host_pool_bytes: Setting[int | None] = _declare(Setting(
    "host_pool_bytes", BYTES, None,
    "Most idle bytes the host buffer pool keeps per process for large conversion outputs "
    "(512M, 2G or bytes); 0 turns the pool off.",
    default_text="an eighth of the machine's memory / ranks on it, at least 64M",
    details="Large host shards made by a conversion (1 MiB and up) reuse memory that a "
    "freed shard gave back, instead of fresh pages every call; memory is reused only once "
    "no array or view over it is alive. Lowering the limit frees idle blocks over it at "
    "once.", per_rank=True))
ipc_node_size: Setting[int | None] = _declare(Setting(
    "ipc_node_size", COUNT, None,
    "With gpu_transport=ipc: every k consecutive ranks of a node act as one node, so one "
    "machine runs the hierarchical collectives (for testing).",
    default_text="the machine"))
mpiexec: Setting[str | None] = _declare(Setting(
    "mpiexec", TEXT, None,
    "The mpiexec that python -m sbpmpi.launch uses (a path or a command on PATH).",
    default_text="the one of mpi4py's MPI library", per_rank=True))
mpiexec_args: Setting[str] = _declare(Setting(
    "mpiexec_args", TEXT, "",
    "Extra arguments for mpiexec in python -m sbpmpi.launch, split like a shell; they come "
    "before those of --mpiexec-args.",
    default_text="none", per_rank=True))
timeout: Setting[float | None] = _declare(Setting(
    "timeout", SECONDS, None,
    "Seconds a rank may wait inside one collective; then it prints the op, the ranks it "
    "waits on and its stack, and aborts the job (exit code 124).",
    default_text="off",
    details="It also names the peers that already reached the end of the program. Set it "
    "well above your slowest legitimate collective, e.g. `SBPMPI_TIMEOUT=600`. It is needed "
    "only for hangs the other mechanisms cannot see: a peer stuck in a computation or in a "
    "different `sm.comm` call."))


# -- reading and changing -----------------------------------------------------------------------

_lock = threading.RLock()


def _setting(name: str) -> Setting[Any]:
    if not isinstance(name, str):
        raise TypeError(f"sm.config: a setting's name must be a str, got {name!r}")
    key = name.lower().removeprefix(PREFIX.lower())
    try:
        return SETTINGS[key]
    except KeyError:
        raise KeyError(f"sm.config: no setting {name!r}; the settings are "
                       f"{', '.join(SETTINGS)}") from None


def _assign(values: Mapping[Setting[Any], tuple[Any, str]]) -> None:
    """Set each setting's (value, source), then run the callbacks of each."""
    with _lock:
        for s, (value, source) in values.items():
            s.value, s.source = value, source
        for s in values:
            for fn in list(s._callbacks):
                fn(s.value)


def _pairs(name: str | None, value: Any, values: dict[str, Any]) -> dict[Setting[Any], Any]:
    if name is not None:
        if value is _UNSET:
            raise TypeError(f"sm.config.update({name!r}) needs a value: "
                            f"sm.config.update({name!r}, value)")
        values = {name: value, **values}
    elif value is not _UNSET:
        raise TypeError("sm.config.update(name, value): the name is missing")
    return {_setting(n): v for n, v in values.items()}


def update(name: str | None = None, value: Any = _UNSET, /, **values: Any) -> None:
    """Set settings in the program: ``update("check", False)`` or ``update(check=False,
    timeout=60)`` (a name may also be the variable, ``"SBPMPI_CHECK"``).

    Every value is checked before any is set. Call it on every rank alike. The value
    stays until the next :func:`update` or :func:`reset`.

    Raises
    ------
    KeyError
        No setting has that name.
    TypeError, ValueError
        A value of the wrong type or out of range (the message names the setting).
    """
    pairs = _pairs(name, value, values)
    _assign({s: (s.checked(v), PROGRAM) for s, v in pairs.items()})


@contextmanager
def override(name: str | None = None, value: Any = _UNSET, /, **values: Any) -> Iterator[None]:
    """Within the block, settings have the values given (as :func:`update`); after it, the
    values and sources they had before, also when the block raises.

    Example: ``with sm.config.override(check=False): ...``
    """
    pairs = _pairs(name, value, values)
    checked = {s: (s.checked(v), PROGRAM) for s, v in pairs.items()}
    saved = {s: (s.value, s.source) for s in checked}
    _assign(checked)
    try:
        yield
    finally:
        _assign(saved)


def reset(*names: str) -> None:
    """Forget the values set in the program for ``names`` (every setting without a name):
    they take the environment's value again (read now) or the default."""
    chosen = [_setting(n) for n in names] if names else list(SETTINGS.values())
    _assign(_from_environment(chosen, os.environ))


def _from_environment(chosen: list[Setting[Any]], environ: Mapping[str, str]
                      ) -> dict[Setting[Any], tuple[Any, str]]:
    """(value, source) of each setting from ``environ``; every error at once."""
    out, errors = _read_environment(chosen, environ)
    if errors:
        raise ValueError("; ".join(errors.values()))
    return out


def _read_environment(chosen: list[Setting[Any]], environ: Mapping[str, str]
                      ) -> tuple[dict[Setting[Any], tuple[Any, str]], dict[str, str]]:
    """(value, source) of each setting ``environ`` sets readably, and the error message
    of each variable it does not (variable -> message)."""
    out: dict[Setting[Any], tuple[Any, str]] = {}
    errors: dict[str, str] = {}
    for s in chosen:
        text = environ.get(s.env)
        try:
            out[s] = (s.parse(text), ENVIRONMENT if text is not None and text.strip() else DEFAULT)
        except ValueError as e:
            errors[s.env] = str(e)
    return out, errors


def on_update(name: str, callback: Callable[[Any], None]) -> None:
    """Call ``callback(value)`` after each change of setting ``name`` (:func:`update`,
    :func:`override` and :func:`reset`), for the modules that act on a change."""
    _setting(name)._callbacks.append(callback)


# -- reports ------------------------------------------------------------------------------------

class SettingRow(NamedTuple):
    """One line of :func:`report`."""

    name: str
    variable: str
    value: Any
    text: str  # the value as the environment writes it; an automatic one: (what it does)
    source: str  # "default", "environment" or "program"
    help: str


def report() -> list[SettingRow]:
    """Every setting: its name, variable, current value and where the value came from."""
    return [SettingRow(s.name, s.env, s.value, _text(s), s.source, s.help)
            for s in SETTINGS.values()]


def format_report(rows: list[SettingRow] | None = None) -> str:
    """:func:`report` (or ``rows`` of it) as an aligned text table."""
    cells = [("variable", "value", "from"),
             *((r.variable, r.text, r.source) for r in (report() if rows is None else rows))]
    widths = [max(len(row[i]) for row in cells) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _text(s: Setting[Any]) -> str:
    if s.value is None or s.value == "":
        return f"({s.default_text.replace('`', '')})"
    return s.kind.spell(s.value)


def markdown() -> str:
    """The documentation page of the settings (``docs/configuration.md``), written from
    the declarations (``python -m sbpmpi config --markdown``)."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated from sbpmpi/config.py by `python -m sbpmpi config --markdown`; "
        "edit the declarations, not this file. -->",
        "",
        "Every `SBPMPI_*` environment variable that sbpmpi reads is declared once, in "
        "`sbpmpi/config.py`. A value set in the program (`sm.config.update(...)`, or "
        "`with sm.config.override(...):` for a block) wins over the environment, which "
        "wins over the default. The environment is read when sbpmpi is imported; a value "
        "it does not understand raises an error naming the variable. Set a value on every "
        "rank alike: at import the ranks compare their settings (one 16-byte all-reduce), "
        "and a variable that differs between ranks, or that some rank cannot read, raises "
        "`ValueError` on every rank naming the variable and the ranks on each side. Only "
        "the settings marked *per rank* below may differ.",
        "",
        "```python",
        "import sbpmpi as sm",
        "",
        "sm.config.update(check=False)            # for the rest of the program",
        "with sm.config.override(timeout=600):    # for a block",
        "    ...",
        "sm.config.check.value                    # the value in use",
        "print(sm.config.format_report())         # every setting, its value and source",
        "```",
        "",
        "`python -m sbpmpi config` prints the same table for the current environment, and "
        "`python -m sbpmpi info` includes it.",
        "",
        "On/off settings take `1`, `true`, `yes`, `on` and `0`, `false`, `no`, `off` (any "
        "case) in the environment, `True` and `False` in the program. A setting whose "
        "default is automatic takes `None` in the program to go back to the automatic "
        "choice.",
        "",
        "| Variable | `sm.config` name | Kind | Default | Allowed values | What it does |",
        "|---|---|---|---|---|---|",
    ]
    for s in SETTINGS.values():
        lines.append(f"| `{s.env}` | `{s.name}` | {s.kind.name} | {s.default_text} | "
                     f"{_allowed(s)} | {s.help}{' *Per rank.*' if s.per_rank else ''} |")
    lines += ["", "## Details", ""]
    for s in SETTINGS.values():
        if s.details:
            lines += [f"**`{s.env}`** ({s.name}). {s.details}", ""]
    lines += [
        "## Other variables",
        "",
        "The Slurm job scripts (`scripts/slurm/*.sbatch`) read `SBPMPI_SRUN_MPI` and "
        "`SBPMPI_GPU_BIND` themselves, and the test runner `SBPMPI_TEST_*`; see those "
        "scripts. sbpmpi itself does not read them. `MPIEXEC_TIMEOUT` (read by MPICH's and "
        "Open MPI's launchers) kills the whole job after that many seconds; the test suite "
        "sets it on every `mpiexec` it starts.",
        "",
    ]
    return "\n".join(lines)


def _allowed(s: Setting[Any]) -> str:
    if s.kind is CHOICE:
        return ", ".join(f"`{c}`" for c in s.choices) + " or unset"
    return {
        "switch": "`1` / `0` (and synonyms)" + (" or unset" if s.default is None else ""),
        "seconds": f"seconds > 0, up to {MAX_SECONDS:.0f}; `0` or unset: off",
        "bytes": "bytes, with `K`, `M`, `G`; `0`: off",
        "positive int": "an integer >= 1 or unset",
        "text": "any text",
        "path or off": "a file path or `off`",
    }[s.kind.name]


# -- the environment, read once at import ------------------------------------------------------

def startup_errors() -> dict[str, str]:
    """The variables whose text could not be read at import: variable -> message.

    Their settings keep the default meanwhile. This module does not raise at import:
    a rank that stopped here would leave the others waiting in their first collective.
    ``import sbpmpi`` raises instead, on every rank alike, once the ranks have compared
    their settings (:mod:`sbpmpi.comm.agreement.settings`).
    """
    return dict(_STARTUP_ERRORS)


def comparison() -> dict[str, str]:
    """What the ranks compare at start: each setting that is not ``per_rank``, by variable:
    its value as the environment spells it (``"unset"`` for an automatic one), or the
    text it could not read."""
    return {s.env: f"{_STARTUP_TEXT[s.env]!r} (not understood)" if s.env in _STARTUP_ERRORS
            else s.kind.spell(s.value) for s in SETTINGS.values() if not s.per_rank}


_values, _STARTUP_ERRORS = _read_environment(list(SETTINGS.values()), os.environ)
_STARTUP_TEXT = {name: os.environ.get(name, "") for name in _STARTUP_ERRORS}
for _s, (_value, _source) in _values.items():
    _s.value, _s.source = _value, _source
del _s, _value, _source, _values


class _ConfigModule(types.ModuleType):
    """``sm.config.check = False`` would replace the declaration, not change the value:
    say so, and point at :func:`update`."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in SETTINGS:
            raise AttributeError(f"sm.config.{name} is a setting's declaration; change its "
                                 f"value with sm.config.update({name}={value!r})")
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _ConfigModule
