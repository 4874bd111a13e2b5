"""python -m sbpmpi.launch: finding mpiexec, the command it builds, the variables it sets,
and that a failing rank ends the job instead of hanging it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sbpmpi import config
from sbpmpi.tools import launch

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120  # seconds for any launched job; MPIEXEC_TIMEOUT ends it a little earlier


def run(args, cwd=None, extra_env=None, timeout=TIMEOUT):
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(timeout - 20), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "sbpmpi.launch", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


ENV_PROG = textwrap.dedent("""
    import json, os, sys
    import helper_next_to_script  # importable: the script's folder is on sys.path
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    with open(os.path.join(os.environ["ENV_OUT"], f"env-{rank}.json"), "w") as f:
        json.dump({"mpi_rank": rank, "mpi_size": MPI.COMM_WORLD.Get_size(),
                   "argv": sys.argv[1:], "name": __name__,
                   **{k: os.environ.get(k) for k in keys}}, f)
""")


def env_rows(out_dir):
    rows = [json.loads(p.read_text()) for p in Path(out_dir).glob("env-*.json")]
    return sorted(rows, key=lambda r: r["mpi_rank"])


def test_find_mpiexec_belongs_to_mpi4pys_library():
    lib = launch.mpi_library()
    m = launch.find_mpiexec()
    assert os.path.isfile(m.path) and os.access(m.path, os.X_OK)
    fam = launch.mpiexec_family(m.path)
    if "unknown" not in (fam, lib.family):
        assert fam == lib.family, (m, lib)
    from mpi4py import MPI

    assert lib.version == MPI.Get_library_version().replace("\0", "").strip().splitlines()[0].strip()


def test_mpiexec_override(tmp_path):
    real = launch.find_mpiexec().path
    assert launch.find_mpiexec(real).path == real
    with config.override(mpiexec=real):  # as SBPMPI_MPIEXEC
        assert launch.find_mpiexec().how.startswith("given with")
    missing = str(tmp_path / "no-such-mpiexec")
    with pytest.raises(FileNotFoundError, match="no-such-mpiexec"):
        launch.find_mpiexec(missing)


def test_build_command():
    cmd = launch.build_command("p.py", ["a", "--b"], 4, mpiexec="MPX", python="PY")
    assert cmd == ["MPX", "-n", "4", "PY", "-m", "sbpmpi.launch", "--bootstrap", "p.py", "a",
                   "--b"]
    cmd = launch.build_command("pkg.mod", [], 2, mpiexec="MPX", python="PY", module=True,
                               bootstrap=False)
    assert cmd == ["MPX", "-n", "2", "PY", "-m", "pkg.mod"]
    mpich = launch.build_command("p.py", [], 8, mpiexec="M", python="PY", family="mpich",
                                 nproc_per_node=4, hostfile="hosts")
    assert mpich[:8] == ["M", "-n", "8", "-ppn", "4", "-f", "hosts", "PY"]
    ompi = launch.build_command("p.py", [], 8, mpiexec="M", python="PY", family="openmpi",
                                nproc_per_node=4, hostfile="hosts",
                                mpiexec_args=["--bind-to", "core"])
    assert ompi[:10] == ["M", "-n", "8", "--map-by", "ppr:4:node", "--hostfile", "hosts",
                         "--bind-to", "core", "PY"]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="positive int"):
            launch.build_command("p.py", [], bad)
    with pytest.raises(ValueError, match="no program"):
        launch.build_command("", [], 1)


def test_child_env_drops_rank_identity_but_keeps_settings(monkeypatch):
    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("OMPI_MCA_btl", "self,vader")
    env = launch.child_env()
    assert "PMI_RANK" not in env and "OMPI_COMM_WORLD_RANK" not in env
    assert env["OMPI_MCA_btl"] == "self,vader"


def test_child_env_puts_this_sbpmpi_first_on_the_path(monkeypatch):
    """The child ranks import the sbpmpi of this launcher: the directory that holds the
    package (not the package itself) leads PYTHONPATH, unless it is site-packages."""
    import sbpmpi

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    here = Path(os.path.abspath(sbpmpi.__file__)).parents[1]
    paths = launch.child_env()["PYTHONPATH"].split(os.pathsep)
    if here.name in ("site-packages", "dist-packages"):
        assert paths == ["/elsewhere"]
    else:
        assert paths == [str(here), "/elsewhere"]


def test_dry_run_prints_the_command(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("")
    r = run(["--dry-run", "-n", "3", str(prog), "x", "-y"])
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert " -n 3 " in last and last.endswith(f"--bootstrap {prog} x -y"), last
    assert r.stdout.startswith("# mpiexec: ")


def test_missing_program_is_reported(tmp_path):
    r = run(["-n", "2", str(tmp_path / "nope.py")])
    assert r.returncode == 2
    assert "nope.py" in r.stderr and "does not exist" in r.stderr


@pytest.mark.parametrize("n", [1, 2, 3])
def test_launch_sets_the_launcher_variables(tmp_path, n):
    (tmp_path / "helper_next_to_script.py").write_text("")
    prog = tmp_path / "prog.py"
    prog.write_text(ENV_PROG)
    r = run(["-n", str(n), str(prog), "a", "--flag"], cwd=tmp_path,
            extra_env={"ENV_OUT": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rows = env_rows(tmp_path)
    assert [row["mpi_rank"] for row in rows] == list(range(n))
    for row in rows:
        assert row["mpi_size"] == n
        assert row["RANK"] == str(row["mpi_rank"])
        assert row["WORLD_SIZE"] == str(n)
        # one host: the local rank is the world rank
        assert row["LOCAL_RANK"] == str(row["mpi_rank"])
        assert row["LOCAL_WORLD_SIZE"] == str(n)
        assert row["argv"] == ["a", "--flag"]
        assert row["name"] == "__main__"
        assert row["MASTER_PORT"].isdigit()
    assert len({(row["MASTER_ADDR"], row["MASTER_PORT"]) for row in rows}) == 1


def test_launch_runs_a_module(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "main.py").write_text(ENV_PROG.replace("import helper_next_to_script", ""))
    r = run(["-n", "2", "-m", "mypkg.main", "z"], cwd=tmp_path,
            extra_env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
                       "ENV_OUT": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rows = env_rows(tmp_path)
    assert [row["RANK"] for row in rows] == ["0", "1"]
    assert all(row["argv"] == ["z"] and row["name"] == "__main__" for row in rows)


FAIL_PROG = textwrap.dedent("""
    import sys
    from mpi4py import MPI
    w = MPI.COMM_WORLD
    if w.Get_rank() == w.Get_size() - 1:
        {action}
    w.Barrier()  # the other ranks would wait here forever
""")


@pytest.mark.parametrize("action,code", [
    ("raise ValueError('planted failure')", None),
    ("sys.exit(3)", 3),
])
def test_a_failing_rank_ends_the_job(tmp_path, action, code):
    prog = tmp_path / "fail.py"
    prog.write_text(FAIL_PROG.format(action=action))
    t0 = time.monotonic()
    r = run(["-n", "2", str(prog)], timeout=90)
    took = time.monotonic() - t0
    assert r.returncode != 0
    assert took < 60, f"the job took {took:.0f} s: the other rank was left waiting"
    assert "rank 1" in r.stderr
    if code is None:
        assert "ValueError: planted failure" in r.stderr
    else:
        assert f"sys.exit({code})" in r.stderr


def test_single_rank_failure_is_a_plain_python_error(tmp_path):
    prog = tmp_path / "fail.py"
    prog.write_text("raise KeyError('solo')\n")
    r = run(["-n", "1", str(prog)])
    assert r.returncode != 0
    assert "KeyError: 'solo'" in r.stderr


# -- any MPI: mpiexec arguments, what each launcher needs, -c --------------------------------

OMPI5_VERSION = "mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"


def dry_run(capsys, args):
    assert launch.main(["--dry-run", *args]) == 0
    return capsys.readouterr().out.strip().splitlines()


@pytest.mark.parametrize("given,expected", [
    (["--mpiexec-args", "--oversubscribe"], ["--oversubscribe"]),   # the README's examples
    (["--mpiexec-args", "--allow-run-as-root --oversubscribe"],
     ["--allow-run-as-root", "--oversubscribe"]),
    (["--mpiexec-args", "-bind-to core"], ["-bind-to", "core"]),
    (["--mpiexec-args=--bind-to core"], ["--bind-to", "core"]),
    (["--mpiexec-args", "-genv A 1", "--mpiexec-args", "--verbose"], ["-genv", "A", "1",
                                                                       "--verbose"]),
])
def test_mpiexec_args_accept_values_starting_with_dashes(capsys, tmp_path, given, expected):
    prog = tmp_path / "prog.py"
    prog.write_text("")
    with config.override(mpiexec_args=""):
        cmd = dry_run(capsys, ["-n", "2", *given, str(prog), "--mpiexec-args", "x"])[-1].split()
    i = cmd.index("2") + 1
    assert cmd[i:i + len(expected)] == expected
    assert cmd[i + len(expected)] == sys.executable
    assert cmd[-3:] == [str(prog), "--mpiexec-args", "x"]  # the program's own arguments


def test_mpiexec_args_from_the_environment_come_first(capsys, tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("")
    with config.override(mpiexec_args="-bind-to none"):  # as SBPMPI_MPIEXEC_ARGS
        cmd = dry_run(capsys, ["-n", "2", "--mpiexec-args", "--verbose", str(prog)])[-1].split()
        i = cmd.index("2") + 1
        assert cmd[i:i + 3] == ["-bind-to", "none", "--verbose"]
    with config.override(mpiexec_args="x"):
        assert launch.mpiexec_args_from(["'a b' c"]) == ["x", "a b", "c"]
    # the variable itself, in the launcher's environment
    res = run(["--dry-run", "-n", "2", "--mpiexec-args", "--verbose", str(prog)],
              extra_env={"SBPMPI_MPIEXEC_ARGS": "-bind-to none"})
    assert res.returncode == 0, res.stderr
    cmd = res.stdout.strip().splitlines()[-1].split()
    i = cmd.index("2") + 1
    assert cmd[i:i + 3] == ["-bind-to", "none", "--verbose"], cmd


def test_bad_mpiexec_args_are_refused(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("")
    r = run(["--dry-run", "--mpiexec-args", "'unclosed", str(prog)])
    assert r.returncode == 2 and "--mpiexec-args" in r.stderr


def test_dry_run_shows_what_open_mpi_needs(capsys, tmp_path, monkeypatch):
    """An Open MPI 5 mpiexec (a stand-in that only answers --version) gets the root
    permission as root and oversubscription for more ranks than cores."""
    from sbpmpi.tools import launcher_family

    for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
              "PRTE_MCA_rmaps_default_mapping_policy", "SLURM_JOB_ID", "PBS_JOBID"):
        monkeypatch.delenv(k, raising=False)  # as set by run_tests.py under Open MPI

    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{OMPI5_VERSION}EOF\n")
    fake.chmod(0o755)
    prog = tmp_path / "prog.py"
    prog.write_text("")
    many = launcher_family.physical_cores() + 1
    out = dry_run(capsys, ["--mpiexec", str(fake), "-n", str(many), "--nproc-per-node", "2",
                           str(prog)])
    assert out[0].startswith(f"# mpiexec: {fake}") and "Open MPI 5.0.11 (prterun)" in out[0]
    added = out[1]
    assert "PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe" in added
    assert ("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in added) == \
        (os.geteuid() == 0)
    assert "--map-by ppr:2:node" in out[-1]  # Open MPI's dialect
    # one rank as a normal user needs nothing
    if os.geteuid() != 0:
        assert len(dry_run(capsys, ["--mpiexec", str(fake), "-n", "1", str(prog)])) == 2


def test_launch_runs_code_with_c(tmp_path):
    code = ("import os, sys; from mpi4py import MPI; "
            "open(os.path.join(sys.argv[1], f'c-{MPI.COMM_WORLD.Get_rank()}'), 'w')"
            ".write(os.environ['RANK'] + ' ' + ' '.join(sys.argv))")
    r = run(["-n", "2", "-c", code, str(tmp_path), "--x"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = sorted(p.read_text() for p in tmp_path.glob("c-*"))
    assert got == [f"0 -c {tmp_path} --x", f"1 -c {tmp_path} --x"]


def test_c_code_that_fails_on_one_rank_ends_the_job(tmp_path):
    code = ("from mpi4py import MPI; w = MPI.COMM_WORLD\n"
            "if w.Get_rank() == 1: raise RuntimeError('from -c')\n"
            "w.Barrier()")
    t0 = time.monotonic()
    r = run(["-n", "2", "-c", code], timeout=90)
    assert r.returncode != 0 and time.monotonic() - t0 < 60
    assert "rank 1" in r.stderr and "RuntimeError: from -c" in r.stderr


def test_m_and_c_together_are_refused(tmp_path):
    r = run(["-n", "2", "-m", "-c", "pass"])
    assert r.returncode == 2


def test_build_command_for_srun_and_code():
    srun = launch.build_command("p.py", [], 8, mpiexec="srun", python="PY", family="slurm",
                                nproc_per_node=4, hostfile="nodes")
    assert srun[:8] == ["srun", "-n", "8", "--ntasks-per-node", "4", "--nodefile", "nodes", "PY"]
    code = launch.build_command("print(1)", ["x"], 2, mpiexec="M", python="PY", code=True)
    assert code == ["M", "-n", "2", "PY", "-m", "sbpmpi.launch", "--bootstrap", "-c",
                    "print(1)", "x"]
    with pytest.raises(ValueError, match="exclude each other"):
        launch.build_command("x", [], 1, module=True, code=True)
