"""Green-context partitions: unsupported on a CPU with a clear reason; the driver path against a stand-in libcuda.

The stand-in (native_fakes.FAKE_LIBCUDA) implements only the green-context calls, declaring
CUdevResource as cuda.h does, and remembers which SMs each context got; it stands in for a real
driver and GPU, which a CPU machine cannot provide. Whether kernels on a partition's stream really
stay on its SMs is for benchmarks/gpu/smpartition.py.
"""

from __future__ import annotations

import ctypes

import pytest
from native_fakes import libcuda_loads

from native.availability import Unavailable
from native.green_context import GreenContexts, _DevResource, probe


def _fake(path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.fake_reset()
    return lib


def _ints(lib: ctypes.CDLL, name: str, n: int) -> list[int]:
    return list((ctypes.c_int * 32).in_dll(lib, name)[:n])


def test_unsupported_here_with_reasons():
    if libcuda_loads():
        pytest.skip("this machine has a CUDA driver; the no-driver reason cannot be observed")
    gc = GreenContexts()
    state = gc.available()
    assert not state.ok
    assert state.reason.startswith("unsupported: driver: no CUDA driver (libcuda)")
    assert "torch: " in state.reason
    assert gc.backend is None
    with pytest.raises(Unavailable, match="no CUDA driver"):
        gc.partition([8])
    gc.close()
    assert probe() == state


def test_torch_backend_says_why_on_a_cpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here")
    state = GreenContexts(backend="torch").available()
    assert not state.ok and state.reason.startswith("unsupported: torch: ")
    assert "no CUDA GPU" in state.reason or "without green contexts" in state.reason


def test_rejects_unknown_backend():
    with pytest.raises(ValueError, match="backend='mps'"):
        GreenContexts(backend="mps")  # type: ignore[arg-type]


def test_resource_buffer_covers_the_driver_struct(fake_libcuda):
    lib = _fake(fake_libcuda)
    assert ctypes.sizeof(_DevResource) >= ctypes.c_int.in_dll(lib, "fake_sizeof_resource").value == 144
    assert _DevResource.sm_count.offset == 96


def test_disjoint_partitions_through_the_driver(fake_libcuda):
    lib = _fake(fake_libcuda)
    with GreenContexts(driver_path=str(fake_libcuda), backend="driver") as gc:
        assert gc.available().ok, gc.available().reason
        assert gc.backend == "driver" and "disjoint" in gc.available().reason
        assert gc.device_sms() == 132
        parts = gc.partition([16, 9])
        # 9 rounds up to 16 (Hopper: steps of 8); the rest is what remains of 132.
        assert [p.sms for p in parts] == [16, 16, 100]
        assert all(p.disjoint for p in parts)
        assert len({p.stream for p in parts}) == 3 and all(p.stream for p in parts)
        n = ctypes.c_int.in_dll(lib, "fake_nctx").value
        firsts, counts = _ints(lib, "fake_ctx_first", n), _ints(lib, "fake_ctx_count", n)
        assert list(zip(firsts, counts, strict=True)) == [(0, 16), (16, 16), (32, 100)]
        encoder, prefill = gc.split(40)
        assert (encoder.sms, prefill.sms) == (40, 92)
    assert ctypes.c_int.in_dll(lib, "fake_ctx_destroyed").value == 5
    assert ctypes.c_int.in_dll(lib, "fake_streams_destroyed").value == 5


def test_driver_errors_say_what_failed(fake_libcuda):
    lib = _fake(fake_libcuda)
    with GreenContexts(driver_path=str(fake_libcuda), backend="driver") as gc:
        with pytest.raises(ValueError, match="no group of 200 SMs"):
            gc.partition([200])
        ctypes.c_int.in_dll(lib, "fake_sms").value = 128
        with pytest.raises(ValueError, match="no SMs are left for the rest after \\[128\\]"):
            gc.partition([128])
        assert [p.sms for p in gc.partition([128], rest=False)] == [128]
        with pytest.raises(ValueError, match="must be positive"):
            gc.partition([0])
    state = GreenContexts(1, "driver", driver_path=str(fake_libcuda)).available()
    assert not state.ok and "cuDeviceGet(1) failed: 101 CUDA_ERROR_INVALID_DEVICE" in state.reason
    ctypes.c_int.in_dll(lib, "fake_version").value = 12020
    state = GreenContexts(backend="driver", driver_path=str(fake_libcuda)).available()
    assert state == state.__class__(False, "unsupported: driver: CUDA driver 12020 lacks green contexts "
                                           "(needs 12040+; missing nothing)")
