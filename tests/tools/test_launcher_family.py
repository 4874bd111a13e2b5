"""sbpmpi.tools.launcher_family: the MPI launcher family from ``mpiexec --version`` text
(captured from each family), and what each needs to run N ranks."""

from __future__ import annotations

import os
import stat

import pytest

from sbpmpi.tools import launcher_family as lf

MPICH = """HYDRA build details:
    Version:                                 5.0.2
    Release Date:                            Fri Sep 25 20:45:26 UTC 2026
    CC:                              cc
    Configure options:                       --with-device=ch4:ucx,ofi --with-pm=hydra:gforker
    Process Manager:                         pmi
    Launchers available:                     ssh rsh fork slurm ll lsf sge manual persist
    Topology libraries available:            hwloc
    Resource management kernels available:   user slurm ll lsf sge pbs cobalt
    Demux engines available:                 poll select
"""
OMPI5 = "mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
OMPI4 = "mpirun (Open MPI) 4.1.2\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
OMPI2 = "mpirun (Open MPI) 2.1.1\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
ORTE = "orterun (OpenRTE) 4.0.3\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
PRRTE = "prterun (PRRTE) 3.0.6\n\nReport bugs to https://github.com/openpmix/prrte\n"
INTEL = ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
         "Copyright 2003-2023, Intel Corporation.\n")
SLURM = "slurm 23.02.7\n"
SLURM_DEB = "slurm-wlm 21.08.5\n"


@pytest.mark.parametrize("text,family,runtime,version", [
    (MPICH, "mpich", "hydra", "5.0.2"),
    (OMPI5, "openmpi", "prterun", "5.0.11"),
    (OMPI4, "openmpi", "orterun", "4.1.2"),
    (OMPI2, "openmpi", "orterun", "2.1.1"),
    (ORTE, "openmpi", "orterun", "4.0.3"),
    (PRRTE, "openmpi", "prterun", "3.0.6"),
    (INTEL, "mpich", "intel", "2021.10"),
    (SLURM, "slurm", "srun", "23.02.7"),
    (SLURM_DEB, "slurm", "srun", "21.08.5"),
    ("", "unknown", "", ""),
    ("some-launcher 1.0\n", "unknown", "", ""),
])
def test_parse_version(text, family, runtime, version):
    info = lf.parse_version(text)
    assert (info.family, info.runtime, info.version) == (family, runtime, version)
    assert info.major == (int(version.split(".")[0]) if version else None)
    if version:
        assert version in info.description


ROOT_VARS = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
OVER5 = {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}
OVER4 = {"OMPI_MCA_rmaps_base_oversubscribe": "1"}


@pytest.mark.parametrize("text", [MPICH, INTEL, SLURM, ""])
def test_launchers_other_than_open_mpi_need_nothing(text):
    info = lf.parse_version(text)
    assert lf.run_env(info, 64, cores=2, root=True) == {}


@pytest.mark.parametrize("text,over", [(OMPI5, OVER5), (PRRTE, OVER5), (OMPI4, OVER4),
                                       (ORTE, OVER4)])
def test_open_mpi_needs_root_permission_and_oversubscription(text, over):
    info = lf.parse_version(text)
    assert lf.run_env(info, 2, cores=2, root=False) == {}
    assert lf.run_env(info, 2, cores=2, root=True) == ROOT_VARS
    assert lf.run_env(info, 3, cores=2, root=False) == over
    assert lf.run_env(info, 4, cores=2, root=True) == {**ROOT_VARS, **over}
    # slots from a scheduler or a hostfile: their count is the user's to keep
    assert lf.run_env(info, 4, cores=2, root=False, scheduled=True) == {}
    # what the user set already wins
    mine = {"OMPI_ALLOW_RUN_AS_ROOT": "1", next(iter(over)): "mine"}
    assert lf.run_env(info, 4, cores=2, root=True, environ=mine) == \
        {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def test_open_mpi_of_unknown_version_gets_both_oversubscription_settings():
    info = lf.LauncherInfo("openmpi", "orterun", "", "Open MPI")
    assert lf.run_env(info, 8, cores=2, root=False) == {**OVER4, **OVER5}


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_run_env_checks_nprocs(bad):
    with pytest.raises(ValueError, match="nprocs must be a positive int"):
        lf.run_env(lf.parse_version(OMPI5), bad, cores=2, root=False)


def test_allocation_and_cores():
    assert lf.in_allocation({"SLURM_JOB_ID": "42"})
    assert not lf.in_allocation({"HOME": "/root"})
    assert 1 <= lf.physical_cores() <= (os.cpu_count() or 1)


def fake_mpiexec(tmp_path, text, name="mpiexec"):
    path = tmp_path / name
    path.write_text("#!/bin/sh\ncat <<'EOF'\n" + text + "EOF\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_detect_runs_version_once_per_executable(tmp_path):
    path = fake_mpiexec(tmp_path, OMPI4)
    assert lf.detect(path).runtime == "orterun"
    log = tmp_path / "calls"
    p = tmp_path / "mpiexec"
    p.write_text(f"#!/bin/sh\necho x >> {log}\ncat <<'EOF'\n{OMPI4}EOF\n")
    os.utime(p, (1, 1))  # a new mtime: a new cache entry
    assert lf.detect(str(p)).family == "openmpi"
    assert lf.detect(str(p)).family == "openmpi"
    assert log.read_text().count("x") == 1
    assert lf.detect(str(tmp_path / "missing")).family == "unknown"


def test_needed_env_on_this_machine(tmp_path):
    path = fake_mpiexec(tmp_path, OMPI5)
    root = os.geteuid() == 0
    many = lf.physical_cores() + 1
    info, env = lf.needed_env(path, many, environ={})
    assert info.runtime == "prterun"
    assert env == {**(ROOT_VARS if root else {}), **OVER5}
    _, env = lf.needed_env(path, many, hostfile=True, environ={})
    assert env == (ROOT_VARS if root else {})
    _, env = lf.needed_env(fake_mpiexec(tmp_path, MPICH, "mpich"), many, environ={})
    assert env == {}
