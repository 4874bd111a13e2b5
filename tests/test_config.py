"""The configuration module: every ``SBPMPI_*`` setting declared once, read through it alone.

Serial tests of the declarations, of ``sm.config.update`` / ``override`` / ``reset`` and
the callbacks of the modules that act on a change, of the generated documentation page,
and a walk of the package's source that finds any other module reading an ``SBPMPI_*``
variable from the environment.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

import sbpmpi as sm
from sbpmpi import config

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "sbpmpi"
DOCS_PAGE = ROOT / "docs" / "configuration.md"


# -- the declarations ---------------------------------------------------------------------------

def test_every_setting_is_declared_once_with_its_variable_and_help():
    names = [s.name for s in config.SETTINGS.values()]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert set(config.__all__) >= set(names)
    for name, s in config.SETTINGS.items():
        assert getattr(config, name) is s
        assert s.env == "SBPMPI_" + name.upper()
        assert s.help and "\n" not in s.help and s.help.endswith("."), name
        assert s.default_text, name
        assert s.checked(s.default) == s.default  # the default is a value the program may set
        assert s.parse(None) == s.default and s.parse("  ") == s.default


def test_the_settings_the_package_reads():
    assert {s.env: s.default for s in config.SETTINGS.values()} == {
        "SBPMPI_ABORT_ON_ERROR": None, "SBPMPI_ARRAY_API_SBP": "split", "SBPMPI_CHECK": True, "SBPMPI_COMM_CHECK": False,
        "SBPMPI_COST_CACHE": None, "SBPMPI_CUDA_AWARE": None, "SBPMPI_DEBUG": False,
        "SBPMPI_EXIT_WATCH": True, "SBPMPI_GPU_TRANSPORT": None, "SBPMPI_HOST_POOL_BYTES": None,
        "SBPMPI_IPC_NODE_SIZE": None, "SBPMPI_MPIEXEC": None, "SBPMPI_MPIEXEC_ARGS": "",
        "SBPMPI_TIMEOUT": None}


@pytest.mark.parametrize("name, text, value", [
    ("check", " Off ", False), ("debug", "YES", True), ("abort_on_error", "0", False),
    ("timeout", "600", 600.0), ("timeout", "0", None), ("timeout", "none", None),
    ("host_pool_bytes", "512M", 512 << 20), ("host_pool_bytes", "2GiB", 2 << 30),
    ("host_pool_bytes", "0", 0), ("gpu_transport", " IPC", "ipc"), ("ipc_node_size", "2", 2),
    ("cost_cache", "OFF", "off"), ("cost_cache", "/tmp/c.json", "/tmp/c.json"),
    ("mpiexec_args", "-bind-to none", "-bind-to none"),
    ("array_api_sbp", " Broadcast", "broadcast")])
def test_environment_text_is_parsed(name, text, value):
    assert config.SETTINGS[name].parse(text) == value


@pytest.mark.parametrize("name, text", [
    ("check", "maybe"), ("exit_watch", "2"), ("comm_check", "enabled"), ("timeout", "-1"),
    ("timeout", "soon"), ("host_pool_bytes", "1.5G"), ("gpu_transport", "nccl"),
    ("ipc_node_size", "0"), ("ipc_node_size", "two"), ("array_api_sbp", "diagonal")])
def test_text_it_does_not_understand_names_the_variable(name, text):
    s = config.SETTINGS[name]
    with pytest.raises(ValueError, match=f"^{s.env}={text!r} is not understood; expected "):
        s.parse(text)


def test_switch_words():
    for word in ("1", "true", "Yes", " ON "):
        assert config.switch(word) is True, word
    for word in ("0", "false", "NO", "off\n"):
        assert config.switch(word) is False, word
    for word in (None, "", "2", "maybe"):
        assert config.switch(word) is None, word


# -- changing settings --------------------------------------------------------------------------

def test_update_override_and_reset_with_their_sources(monkeypatch):
    monkeypatch.delenv("SBPMPI_TIMEOUT", raising=False)
    with config.override(timeout=None, check=config.check.value):
        config.reset("timeout")
        assert config.timeout.value is None and config.timeout.source == "default"
        config.update("timeout", 60)
        assert config.timeout.value == 60.0 and config.timeout.source == "program"
        config.update("SBPMPI_TIMEOUT", 30)  # the variable's name works too
        assert config.timeout.value == 30.0
        with config.override(timeout=5, check=False):
            assert (config.timeout.value, config.check.value) == (5.0, False)
        assert config.timeout.value == 30.0 and config.timeout.source == "program"
        with pytest.raises(RuntimeError, match="inside"):
            with config.override(timeout=7):
                raise RuntimeError("inside")
        assert config.timeout.value == 30.0  # restored when the block raises too
        monkeypatch.setenv("SBPMPI_TIMEOUT", "90")
        assert config.timeout.value == 30.0  # the environment is read at import and by reset
        config.reset("timeout")
        assert config.timeout.value == 90.0 and config.timeout.source == "environment"
        assert config.timeout.origin() == "SBPMPI_TIMEOUT=90.0 (environment)"
        rows = {r.variable: r for r in config.report()}
        assert rows["SBPMPI_TIMEOUT"].source == "environment"
        assert rows["SBPMPI_TIMEOUT"].text == "90.0"
        assert rows["SBPMPI_CHECK"].value is config.check.value


def test_program_values_are_normalised_as_the_environment_s():
    with config.override(cost_cache="OFF", gpu_transport=" MPI", timeout=3):
        assert config.cost_cache.value == "off" and config.gpu_transport.value == "mpi"
        assert config.timeout.value == 3.0 and isinstance(config.timeout.value, float)
        from sbpmpi.runtime import cost_cache

        assert cost_cache.cache_path() is None


def test_bad_updates_change_nothing():
    with config.override(check=True, debug=False):
        with pytest.raises(TypeError, match="check=1 is not allowed; expected True or False"):
            config.update(debug=True, check=1)  # every value checked before any is set
        assert config.check.value is True and config.debug.value is False
        with pytest.raises(KeyError, match="no setting 'chek'; the settings are abort_on_error"):
            config.update(chek=False)
        with pytest.raises(TypeError, match="needs a value"):
            config.update("check")
        with pytest.raises(ValueError, match="ipc_node_size=0 is not allowed"):
            config.update(ipc_node_size=0)
        with pytest.raises(TypeError, match="timeout=True is not allowed"):
            config.update(timeout=True)
        with pytest.raises(AttributeError, match=r"sm.config.update\(check=False\)"):
            sm.config.check = False  # would replace the declaration, not set the value
        assert isinstance(sm.config.check, config.Setting)


def test_callbacks_run_on_every_change():
    seen = []
    config.on_update("exit_watch", seen.append)
    try:
        with config.override(exit_watch=False):
            config.update(exit_watch=False)
        assert seen == [False, False, config.exit_watch.value]
    finally:
        config.exit_watch._callbacks.remove(seen.append)


def test_owners_follow_their_settings():
    from sbpmpi.backend import host_pool
    from sbpmpi.comm import cuda_aware
    from sbpmpi.comm.agreement import checks
    from sbpmpi.comm.gpu import route, select
    from sbpmpi.comm.lifecycle import watchdog
    from sbpmpi.runtime import consistency, cost_table

    with config.override(check=False, debug=True, comm_check=True, timeout=12):
        assert not consistency.check_enabled() and consistency.debug_enabled()
        assert checks.checking() and sm.comm.checking() and watchdog.timeout() == 12.0
        with checks.agreed():
            assert not checks.checking()
            config.update(comm_check=True)  # a change inside agreed() keeps it off there
            assert not checks.checking()
        assert checks.checking()
    assert checks.checking() is config.comm_check.value
    with config.override(host_pool_bytes=3 << 20):
        assert host_pool.host_pool_limit() == 3 << 20
    with config.override(cuda_aware=True, gpu_transport=None):
        assert cuda_aware.is_cuda_aware() and select.gpu_transport().name == "mpi"
        config.update(gpu_transport="ipc")  # beside device pointers to MPI, ipc stays off
        assert not route.STATE.enabled and select.gpu_transport().name == "mpi"
        version = cost_table.version()
        config.update(cuda_aware=False)
        assert route.STATE.enabled and select.gpu_transport().name == "ipc"
        assert cost_table.version() != version  # the plan caches see the new default table
        config.update(gpu_transport=None)
        assert not cuda_aware.is_cuda_aware() and select.gpu_transport().name == "staged"
        assert not route.STATE.enabled


def test_a_bad_variable_stops_the_import_with_its_name():
    env = dict(os.environ, SBPMPI_TIMEOUT="soon")
    res = subprocess.run([sys.executable, "-c", "import sbpmpi"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "ValueError: SBPMPI_TIMEOUT='soon' is not understood; expected a positive number " \
           "of seconds" in res.stderr, res.stderr


def test_the_command_line_shows_each_value_and_where_it_came_from():
    env = dict(os.environ, SBPMPI_CHECK="0", SBPMPI_HOST_POOL_BYTES="64M")
    env.pop("SBPMPI_DEBUG", None)
    res = subprocess.run([sys.executable, "-m", "sbpmpi", "config"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line.split() for line in res.stdout.splitlines()[2:]}
    assert set(rows) == {s.env for s in config.SETTINGS.values()}
    assert rows["SBPMPI_CHECK"][1:] == ["0", "environment"]
    assert rows["SBPMPI_HOST_POOL_BYTES"][1:] == [str(64 << 20), "environment"]
    assert rows["SBPMPI_DEBUG"][1:] == ["0", "default"]


def test_info_lists_every_setting_with_its_source():
    env = dict(os.environ, SBPMPI_TIMEOUT="600")
    res = subprocess.run([sys.executable, "-m", "sbpmpi", "info"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("settings"))
    rows = {line.split()[0]: line.split() for line in lines[start + 3:start + 3 + len(
        config.SETTINGS)]}
    assert set(rows) == {s.env for s in config.SETTINGS.values()}, lines[start:]
    assert rows["SBPMPI_TIMEOUT"][1:] == ["600.0", "environment"]
    assert rows["SBPMPI_CHECK"][-1] in ("default", "environment")


# -- the documentation page ---------------------------------------------------------------------

def test_the_docs_page_is_generated_from_the_declarations():
    assert DOCS_PAGE.read_text() == config.markdown(), (
        "docs/configuration.md differs from the declarations in sbpmpi/config.py: run "
        "python -m sbpmpi config --markdown > docs/configuration.md")
    page = config.markdown()
    for s in config.SETTINGS.values():
        assert f"| `{s.env}` | `{s.name}` |" in page and s.help in page


# -- nobody else reads the environment for our variables ------------------------------------------

_ENV_READS = {"get", "getenv", "pop", "setdefault", "__getitem__", "__contains__"}


def env_reads(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, variable) of every place in ``source`` that reads an ``SBPMPI_*`` name from a
    mapping or the environment: ``environ[...]``, ``.get(...)``, ``os.getenv(...)``,
    ``... in environ``, with the name written out or held by a module-level constant."""
    tree = ast.parse(source, filename)
    constants = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for t in node.targets if isinstance(t, ast.Name)}

    def name_of(node: ast.AST) -> str | None:
        value = node.value if isinstance(node, ast.Constant) else \
            constants.get(node.id) if isinstance(node, ast.Name) else None
        return value if isinstance(value, str) and value.startswith("SBPMPI_") else None

    found = []
    for node in ast.walk(tree):
        keys: list[ast.AST] = []
        if isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Call) and node.args and (
                (isinstance(node.func, ast.Attribute) and node.func.attr in _ENV_READS)
                or (isinstance(node.func, ast.Name) and node.func.id == "getenv")):
            keys = [node.args[0]]
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn))
                                                   for op in node.ops):
            keys = [node.left]
        found += [(node.lineno, n) for n in map(name_of, keys) if n]
    return found


def names_held(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, variable) of every string constant that is exactly an ``SBPMPI_*`` name: the
    first step of a lookup the walk above cannot follow (``_flag("SBPMPI_X")`` reading
    ``os.environ.get(name)``). Messages write ``SBPMPI_X=...`` or name ``setting.env``."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(source, filename))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and re.fullmatch(r"SBPMPI_[A-Z0-9_]+", node.value)]


def test_the_walk_finds_every_way_of_reading_a_variable():
    src = ("import os\nENV = 'SBPMPI_X'\nos.environ['SBPMPI_A']\nos.environ.get('SBPMPI_B')\n"
           "os.getenv('SBPMPI_C', '')\nenv = os.environ\nenv.get(ENV)\n"
           "'SBPMPI_D' in os.environ\nos.environ.get('HOME')\nprint('SBPMPI_E=1')\n"
           "from os import getenv\ngetenv('SBPMPI_F')\n")
    assert env_reads(src) == [(3, "SBPMPI_A"), (4, "SBPMPI_B"), (5, "SBPMPI_C"),
                              (7, "SBPMPI_X"), (8, "SBPMPI_D"), (12, "SBPMPI_F")]
    src = ("import os\ndef flag(name):\n    return os.environ.get(name)\n"
           "ON = flag('SBPMPI_G')\nprint(f'set SBPMPI_H=0', 'SBPMPI_I=1')\n")
    assert env_reads(src) == [] and names_held(src) == [(4, "SBPMPI_G")]


def test_no_module_but_config_reads_an_sbpmpi_variable():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        if path == PKG / "config.py":
            continue
        text = path.read_text()
        bad += [f"{path.relative_to(ROOT)}:{line} reads {name}"
                for line, name in env_reads(text, str(path))]
        bad += [f"{path.relative_to(ROOT)}:{line} holds the name {name!r}"
                for line, name in names_held(text, str(path))]
    assert not bad, ("SBPMPI_* variables are read by sbpmpi/config.py alone (declare a "
                     "Setting there and read its .value):\n" + "\n".join(bad))


def test_every_variable_the_package_names_is_declared():
    declared = {s.env for s in config.SETTINGS.values()}
    named = {}
    for path in sorted(PKG.rglob("*.py")):
        if path != PKG / "config.py":
            for name in re.findall(r"\bSBPMPI_[A-Z_]*[A-Z]\b", path.read_text()):
                named.setdefault(name, str(path.relative_to(ROOT)))
    assert set(named) <= declared, {n: p for n, p in named.items() if n not in declared}
