"""Serial tests of sbpmpi.comm's pure parts: CUDA-awareness decision, dtype and op tables,
the pinned-buffer pool, host copies of CUDA stand-ins, and sm.trace records."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
from fake_cuda import FakeCudaArray
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import backend
from sbpmpi.backend import device_copy
from sbpmpi.comm import ReduceOp, cuda_aware
from sbpmpi.comm.buffers import Stager, array_meta, output_array_meta
from sbpmpi.comm.dtypes import BOOL, COMPLEX, EMULATED, FLOAT, INT, OPAQUE, dtype_info
from sbpmpi.comm.reduce_op import mpi_reduction

trace = importlib.import_module("sbpmpi.comm.trace")  # the module; sm.trace is the class

# ----------------------------------------------------------------------------- CUDA-awareness


@pytest.fixture
def fresh(monkeypatch):
    """The MPI libraries' GPU variables unset and both settings automatic; after the test,
    the settings as they were (the decision is then made again)."""
    for var in ("MPICH_GPU_SUPPORT_ENABLED", "MV2_USE_CUDA", "MPIR_CVAR_ENABLE_GPU",
                "I_MPI_OFFLOAD", "OMPI_MCA_opal_cuda_support"):
        monkeypatch.delenv(var, raising=False)
    with sm.config.override(cuda_aware=None, gpu_transport=None):
        yield monkeypatch
        monkeypatch.undo()


def lib(monkeypatch, text):
    monkeypatch.setattr(cuda_aware.MPI, "Get_library_version", lambda: text)


class FakeFn:
    def __init__(self, value, out=None):
        self.value, self.out = value, out
        self.restype = self.argtypes = None

    def __call__(self, *args):
        if args:  # MPIX_GPU_query_support(type, int*)
            args[1]._obj.value = self.out
        return self.value


def test_override_wins(fresh):
    sm.config.update(cuda_aware=True)
    d = cuda_aware.detect()
    assert d.aware and "cuda_aware=True (set in the program)" in d.reason
    assert "override" in d.reason
    fresh.setenv("SBPMPI_CUDA_AWARE", "1")
    sm.config.reset("cuda_aware")  # the environment's value, read again
    d = cuda_aware.detect()
    assert d.aware and "SBPMPI_CUDA_AWARE=1" in d.reason and "override" in d.reason
    fresh.setenv("SBPMPI_CUDA_AWARE", "0")
    sm.config.reset("cuda_aware")
    lib(fresh, "Open MPI v5.0.3")
    fresh.setattr(cuda_aware, "mpi_symbol", lambda name: FakeFn(1))
    assert cuda_aware.detect().aware is False and cuda_aware.is_cuda_aware() is False
    fresh.setenv("SBPMPI_CUDA_AWARE", "maybe")
    with pytest.raises(ValueError, match="SBPMPI_CUDA_AWARE='maybe' is not understood"):
        sm.config.reset("cuda_aware")


def test_open_mpi_query(fresh):
    lib(fresh, "Open MPI v5.0.3, package: Open MPI ...")
    fresh.setattr(cuda_aware, "mpi_symbol",
                  lambda name: FakeFn(1) if name == "MPIX_Query_cuda_support" else None)
    d = cuda_aware.detect()
    assert d.aware and "MPIX_Query_cuda_support() returned 1" in d.reason
    fresh.setattr(cuda_aware, "mpi_symbol", lambda name: FakeFn(0))
    assert not cuda_aware.detect().aware
    fresh.setattr(cuda_aware, "mpi_symbol", lambda name: None)
    d = cuda_aware.detect()
    assert not d.aware and "not found" in d.reason


class FakeMpiT:
    """The MPI tool interface's control variables of a stand-in library (``cvars``: name ->
    value), as ``mpi_symbol`` hands out C functions; ``MPIX_Query_cuda_support`` answers
    ``built``. Counts the MPI_T sessions opened and closed."""

    def __init__(self, built: int, cvars: dict[str, int]) -> None:
        self.built, self.cvars, self.names = built, cvars, list(cvars)
        self.sessions = self.handles = 0

    def __call__(self, name: str):
        fns = {"MPIX_Query_cuda_support": lambda: self.built,
               "MPI_T_init_thread": self._init, "MPI_T_finalize": self._finalize,
               "MPI_T_cvar_get_index": self._index, "MPI_T_cvar_handle_alloc": self._alloc,
               "MPI_T_cvar_read": self._read, "MPI_T_cvar_handle_free": self._free}
        fn = fns.get(name)
        return None if fn is None else _CFn(fn)

    def _init(self, required, provided):
        self.sessions += 1
        provided._obj.value = required
        return 0

    def _finalize(self):
        self.sessions -= 1
        return 0

    def _index(self, name, index):
        if name.decode() not in self.cvars:
            return 57  # MPI_T_ERR_INVALID_NAME
        index._obj.value = self.names.index(name.decode())
        return 0

    def _alloc(self, index, obj, handle, count):
        handle._obj.value = 1000 + index.value
        count._obj.value = 1
        self.handles += 1
        return 0

    def _read(self, handle, buf):
        value = self.cvars[self.names[handle.value - 1000]]
        for i, byte in enumerate(int(value).to_bytes(4, "little")):  # an MPI_INT
            buf[i] = byte
        return 0

    def _free(self, handle):
        self.handles -= 1
        return 0


class _CFn:
    def __init__(self, fn) -> None:
        self.fn, self.restype, self.argtypes = fn, None, None

    def __call__(self, *args):
        return self.fn(*args)


def test_open_mpi_4_runtime_switch(fresh):
    """Open MPI 4.x answers MPIX_Query_cuda_support at compile time: a CUDA build with the
    run-time switch opal_cuda_support off (conda-forge's) is not CUDA-aware."""
    lib(fresh, "Open MPI v4.1.6, package: Open MPI conda@builder, ident: 4.1.6\0")
    off = FakeMpiT(1, {"opal_cuda_support": 0, "mpi_param_check": 1})
    fresh.setattr(cuda_aware, "mpi_symbol", off)
    d = cuda_aware.detect()
    assert not d.aware, d
    assert "MPIX_Query_cuda_support() returned 1" in d.reason and "switch is off" in d.reason
    assert "opal_cuda_support = 0" in d.reason and "\0" not in d.reason
    assert off.sessions == 0 and off.handles == 0  # every MPI_T session and handle closed
    on = FakeMpiT(1, {"opal_cuda_support": 1})
    fresh.setattr(cuda_aware, "mpi_symbol", on)
    d = cuda_aware.detect()
    assert d.aware and "opal_cuda_support = 1" in d.reason
    # no such variable (Open MPI 5 asks at run time): the query's answer, or the variable
    fresh.setattr(cuda_aware, "mpi_symbol", FakeMpiT(1, {}))
    assert cuda_aware.detect().aware
    fresh.setenv("OMPI_MCA_opal_cuda_support", "0")
    d = cuda_aware.detect()
    assert not d.aware and "OMPI_MCA_opal_cuda_support=0" in d.reason
    fresh.setattr(cuda_aware, "mpi_symbol", FakeMpiT(0, {"opal_cuda_support": 1}))
    assert not cuda_aware.detect().aware  # not built with CUDA: nothing to switch on


def test_mpi_t_reads_this_library():
    """The MPI_T calls, on the real library: a control variable every build of it has."""
    name = library_name_known_cvar()
    if name is None:
        pytest.skip(f"no known MPI_T control variable for {cuda_aware.library_name()}")
    got = cuda_aware.mpi_t_control(name)
    assert got.value in (0, 1) and name in got.how, got
    assert cuda_aware.mpi_t_control("sbpmpi_no_such_variable").value is None


def library_name_known_cvar() -> str | None:
    text = cuda_aware.library_name()
    if "Open MPI" in text:
        return "mpi_param_check"
    if "MPICH" in text and "CRAY" not in text.upper():
        return "MPIR_CVAR_ASYNC_PROGRESS"
    return None


def test_the_library_version_has_no_nul(monkeypatch):
    """Open MPI's version string ends with the C string's NUL: it must reach no message,
    no `sbpmpi info` and no cost-cache key."""
    from sbpmpi.comm import mpi_library
    from sbpmpi.runtime import cost_cache

    text = "Open MPI v4.1.6, package: Open MPI builder, ident: 4.1.6, repo rev: v4.1.6\0"
    monkeypatch.setattr(mpi_library.MPI, "Get_library_version", lambda: text)
    assert mpi_library.library_version() == text[:-1]
    assert mpi_library.library_line() == text[:-1] and mpi_library.library_name() == text[:-1]
    assert "\0" not in sm.comm.info()["mpi_library"]
    assert "\0" not in cost_cache.cache_key(2) and "v4.1.6 |" in cost_cache.cache_key(2)
    from sbpmpi.tools.mpiexec import mpi_library as launcher_view

    assert "\0" not in launcher_view().version


def test_mpich_query_and_cvar(fresh):
    lib(fresh, "MPICH Version:      4.2.0\nMPICH Release date: ...")
    fresh.setattr(cuda_aware, "mpi_symbol",
                  lambda name: FakeFn(0, out=1) if name == "MPIX_GPU_query_support" else None)
    d = cuda_aware.detect()
    assert d.aware and "MPIX_GPU_query_support(CUDA) returned 1" in d.reason
    fresh.setenv("MPIR_CVAR_ENABLE_GPU", "0")
    d = cuda_aware.detect()
    assert not d.aware and "MPIR_CVAR_ENABLE_GPU=0" in d.reason


def test_cray_mvapich_intel_use_environment(fresh):
    lib(fresh, "MPI VERSION    : CRAY MPICH version 8.1.28")
    assert not cuda_aware.detect().aware
    fresh.setenv("MPICH_GPU_SUPPORT_ENABLED", "1")
    d = cuda_aware.detect()
    assert d.aware and "MPICH_GPU_SUPPORT_ENABLED=1" in d.reason
    lib(fresh, "MVAPICH2 Version      :\t2.3.7")
    assert not cuda_aware.detect().aware
    fresh.setenv("MV2_USE_CUDA", "1")
    assert cuda_aware.detect().aware
    lib(fresh, "Intel(R) MPI Library 2021.10 for Linux* OS")
    assert not cuda_aware.detect().aware
    fresh.setenv("I_MPI_OFFLOAD", "1")
    assert cuda_aware.detect().aware
    lib(fresh, "Some Other MPI 1.0")
    d = cuda_aware.detect()
    assert not d.aware and "assuming not CUDA-aware" in d.reason


def test_this_mpi_is_detected(fresh):
    d = cuda_aware.detect()
    assert isinstance(d.aware, bool) and d.reason
    assert cuda_aware.library_name().split()[0] in MPI.Get_library_version()
    sm.config.update(cuda_aware=True)
    assert cuda_aware.is_cuda_aware()
    sm.config.update(cuda_aware=None)  # detected again
    assert cuda_aware.is_cuda_aware() == d.aware


def test_info_reports_the_decision(fresh):
    fresh.setenv("SBPMPI_CUDA_AWARE", "0")
    sm.config.reset("cuda_aware")
    info = sm.comm.info()
    assert info["cuda_aware"] is False and "SBPMPI_CUDA_AWARE=0" in info["cuda_aware_reason"]
    assert "pinned host buffers" in info["staging"]
    assert info["mpi_library"] and info["gpus_visible"] == backend.cuda_device_count()
    for key in ("mpi_version", "mpi4py", "rank", "world_size", "gpu", "pinned_pool"):
        assert key in info


# ----------------------------------------------------------------------------- dtypes and ops


def test_dtype_table():
    cats = {np.bool_: BOOL, np.int8: INT, np.uint64: INT, np.float16: EMULATED,
            np.float32: FLOAT, np.float64: FLOAT, np.longdouble: FLOAT, np.complex64: COMPLEX,
            np.clongdouble: COMPLEX, "U3": OPAQUE, ">f8": OPAQUE, "datetime64[s]": OPAQUE}
    for dt, cat in cats.items():
        info = dtype_info(np.dtype(dt))
        assert info.category == cat, dt
        assert info.mpi.Get_size() == np.dtype(dt).itemsize, dt
        assert dtype_info(np.dtype(dt)) is info  # cached
    with pytest.raises(TypeError, match="Python object"):
        dtype_info(np.dtype(object))


def test_reduction_table():
    f16 = dtype_info(np.dtype(np.float16))
    for op in ReduceOp:
        red = mpi_reduction(op, f16)
        assert red.host_only and red.average == (op is ReduceOp.AVG)
    assert mpi_reduction(ReduceOp.SUM, dtype_info(np.dtype(bool))).op == MPI.LOR
    assert mpi_reduction(ReduceOp.MIN, dtype_info(np.dtype(bool))).op == MPI.LAND
    assert mpi_reduction(ReduceOp.AVG, dtype_info(np.dtype("f8"))).op == MPI.SUM
    for op in (ReduceOp.MAX, ReduceOp.MIN):
        with pytest.raises(TypeError, match="complex"):
            mpi_reduction(op, dtype_info(np.dtype(np.complex128)))
    with pytest.raises(TypeError, match="AVG"):
        mpi_reduction(ReduceOp.AVG, dtype_info(np.dtype(np.uint8)))
    with pytest.raises(TypeError, match="cannot reduce"):
        mpi_reduction(ReduceOp.SUM, dtype_info(np.dtype(">f8")))


def test_float16_user_op_matches_numpy():
    red = mpi_reduction(ReduceOp.SUM, dtype_info(np.dtype(np.float16)))
    a = np.array([1.5, 2049, -3], np.float16)
    b = np.array([0.25, 1, 3], np.float16)
    want = a + b
    red.op.Reduce_local([a, MPI.UINT16_T], [b, MPI.UINT16_T])
    np.testing.assert_array_equal(b, want)


# ----------------------------------------------------------------------------- buffers


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int8, np.complex128])
def test_host_array_meta_matches_numpy(dtype):
    a = np.zeros((3, 4), dtype)
    m = array_meta(a, "x", "t")
    assert m == (a.dtype, a.size, True, False, a.nbytes)
    assert (m.dtype, m.size, m.contiguous, m.on_gpu, m.nbytes) == tuple(m)
    v = a[:, ::2]
    assert array_meta(v, "x", "t") == (a.dtype, v.size, False, False, v.nbytes)
    assert output_array_meta(np.ones(12, dtype), "out", "t") is m  # shared: immutable
    with pytest.raises(ValueError, match="out receives data and must be C-contiguous"):
        output_array_meta(v, "out", "t")
    ro = np.zeros(12, dtype)
    ro.flags.writeable = False
    assert array_meta(ro, "x", "t") == m  # a read-only input is fine ...
    with pytest.raises(ValueError, match="out receives data but is read-only"):
        output_array_meta(ro, "out", "t")  # ... but cannot receive data


def test_fake_cuda_copies_and_meta():
    h = np.arange(12, dtype=np.int32).reshape(3, 4)
    d = FakeCudaArray.from_numpy(h)
    assert array_meta(d, "x", "t") == (np.dtype(np.int32), 12, True, True, 48)
    nc = d[:, ::2]
    assert array_meta(nc, "x", "t") == (np.dtype(np.int32), 6, False, True, 24)
    assert array_meta(d[1:2], "x", "t").contiguous  # a contiguous slice
    out = np.empty(12, np.int32)
    device_copy.copy_device_to_host(d, out)
    np.testing.assert_array_equal(out, h.ravel())
    device_copy.copy_host_to_device(out * 2, d)
    np.testing.assert_array_equal(d.get(), h * 2)
    np.testing.assert_array_equal(device_copy.ascontiguous_device(nc).get(), (h * 2)[:, ::2])
    with pytest.raises(TypeError, match="NumPy or CuPy"):
        array_meta([1, 2], "arr", "all_reduce")


class _GpuCupy:
    """A stand-in for CuPy that sees a real GPU: any host pointer handed to it fails, as
    ``cupy.asarray`` of a host-backed array fails with cudaErrorInvalidDevice on a GPU node."""

    class ndarray:  # noqa: N801 - CuPy's name
        pass

    class cuda:  # noqa: N801
        class _Stream:
            def synchronize(self):
                pass

        runtime = None

        @staticmethod
        def get_current_stream():
            return _GpuCupy.cuda._Stream()

    @staticmethod
    def _refuse(*args, **kwargs):
        raise RuntimeError("cudaErrorInvalidDevice: a host-backed stand-in reached CuPy")

    asarray = ascontiguousarray = from_dlpack = _refuse


@pytest.fixture
def gpu_cupy(monkeypatch):
    """``backend`` believes CuPy sees a GPU; pinned buffers come from a stand-in cupyx."""
    import sys
    import types

    monkeypatch.setattr(backend, "_cupy", lambda: _GpuCupy)
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda shape, dtype: np.empty(shape, dtype)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    assert backend.cupy_available()
    yield monkeypatch


def test_device_buffers_are_synchronised_device_wide(monkeypatch):
    """Before MPI or a staging copy reads a device buffer, the work producing it is done on
    every stream (a PyTorch stream, a non-blocking CuPy stream that the array does not
    name): a device-wide synchronize, not CuPy's current stream only."""
    import types

    calls: list[str] = []

    def stream(name: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(synchronize=lambda: calls.append(name))

    cp = types.SimpleNamespace(
        ndarray=type("ndarray", (), {}),
        cuda=types.SimpleNamespace(
            runtime=types.SimpleNamespace(deviceSynchronize=lambda: calls.append("device")),
            get_current_stream=lambda: stream("current stream"),
            ExternalStream=lambda ptr: stream(f"stream {ptr}")))
    monkeypatch.setattr(backend, "_cupy", lambda: cp)

    class Foreign:  # another library's GPU array
        def __init__(self, stream: int | None) -> None:
            self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "version": 3,
                                             "data": (1 << 40, False), "stream": stream}

    for named in (None, 1234):
        calls.clear()
        device_copy.sync_for_transfer(Foreign(named))
        assert calls == ["device"], calls
    calls.clear()
    device_copy.sync_for_transfer(FakeCudaArray.from_numpy(np.ones(2)))  # host memory
    assert calls == []


def test_fake_cuda_never_reaches_cupy(gpu_cupy):
    h = np.arange(12.0).reshape(3, 4)
    d = FakeCudaArray.from_numpy(h)
    nc = d[:, ::2]
    np.testing.assert_array_equal(device_copy.ascontiguous_device(nc).get(), h[:, ::2])
    assert backend.from_dlpack(d) is d
    device_copy.sync_for_transfer(d)
    for aware in (False, True):
        with sm.config.override(cuda_aware=aware):
            st = Stager()
            m = array_meta(nc, "arr", "t")
            buf = st.inp(nc, m)  # a non-contiguous device input: copied by the stand-in
            np.testing.assert_array_equal(np.asarray(buf.get() if aware else buf),
                                          h[:, ::2].ravel().reshape(buf.shape))
            out = FakeCudaArray.zeros(6, np.float64)
            ob = st.out(out, array_meta(out, "out", "t"))
            if aware:
                assert ob is out
            else:
                ob[...] = np.arange(6.0)
            st.finish()
            st.release()
            if not aware:
                np.testing.assert_array_equal(out.get(), np.arange(6.0))


def test_stager_round_trip_without_mpi():
    with sm.config.override(cuda_aware=False):
        d = FakeCudaArray.from_numpy(np.arange(5.0))
        st = Stager()
        m = array_meta(d, "arr", "t")
        buf = st.out(d, m, copy_in=True)
        assert isinstance(buf, np.ndarray) and st.staged
        buf *= 3
        st.finish()
        st.release()
        np.testing.assert_array_equal(d.get(), np.arange(5.0) * 3)


# ----------------------------------------------------------------------------- trace


def test_trace_records_and_table():
    with sm.trace() as t:
        x = np.arange(4.0)
        sm.comm.all_reduce(x)
        sm.comm.broadcast(x, src=0)
        sm.comm.all_reduce(np.zeros(3, np.float32))
        with sm.trace() as inner:
            sm.comm.barrier()
    assert len(t) == 4 and len(inner) == 1
    assert t.count("all_reduce") == 2 and t.count() == 4 and t.count("scatter") == 0
    assert [r.op for r in t] == ["all_reduce", "broadcast", "all_reduce", "barrier"]
    assert t.nbytes("all_reduce") == 32 + 12 and t.nbytes() == 32 + 32 + 12
    r = t[0]
    assert (r.op, r.nbytes, r.group_size, r.dtype) == ("all_reduce", 32, 1, "float64")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.nbytes = 0  # type: ignore[misc]
    text = str(t)
    assert "all_reduce" in text and "broadcast" in text and "4 calls" in text
    assert t.summary() == {"all_reduce": 2, "broadcast": 1, "barrier": 1}
    sm.comm.all_reduce(np.zeros(1))  # outside: not recorded
    assert len(t) == 4 and not trace.ACTIVE


def test_trace_is_callable_from_the_package():
    assert isinstance(sm.trace(), trace.trace)
    with sm.trace() as t:
        pass
    assert isinstance(t, trace.Trace) and len(t) == 0


def test_switch_words():
    """One vocabulary for every on/off environment variable (sbpmpi.config.switch)."""
    from sbpmpi.config import switch

    for word in ("1", "true", "Yes", " ON "):
        assert switch(word) is True, word
    for word in ("0", "false", "NO", "off\n"):
        assert switch(word) is False, word
    for word in (None, "", "2", "maybe"):
        assert switch(word) is None, word


# ----------------------------------------------------------------------------- NaN probe

@pytest.mark.parametrize("case", ["nan", "finite", "infinities", "strided", "empty", "half",
                                  "nan-last", "ints"])
def test_nan_probe_matches_numpy(case):
    """The flag of a max/min all-reduce says whether a shard holds a NaN, as NumPy does,
    without an array of the shard's size (the max propagates NaN; -inf and inf do not
    make one)."""
    from sbpmpi.comm.nan_reduction import _has_nan
    rng = np.random.default_rng(0)
    a = {"nan": np.array([1.0, np.nan, 3.0]), "finite": rng.standard_normal(50),
         "infinities": np.array([np.inf, -np.inf, 0.0]),
         "strided": np.where(rng.random((6, 8)) < 0.1, np.nan, 1.0).astype(np.float32)[:, ::3],
         "empty": np.empty((0, 3)), "half": np.array([np.nan, 1.0], dtype=np.float16),
         "nan-last": np.r_[rng.standard_normal(1000), np.nan], "ints": np.arange(5)}[case]
    want = bool(np.isnan(a).any()) if a.dtype.kind == "f" else False
    assert _has_nan(a) is want
