"""NVML telemetry: "unsupported: <reason>" where there is no GPU (the real nvidia-ml-py here), readings mapped
from a stand-in NVML module (real readings need a GPU; benchmarks/gpu records them there)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from native.nvml import GpuTelemetry


def test_a_cpu_worker_has_no_readings_and_says_why():
    t = GpuTelemetry("cpu")
    assert t.reason == "unsupported: the worker runs on 'cpu', not a GPU"
    assert t.read() == {}


def test_no_driver_is_unsupported_with_nvml_s_reason():
    pytest.importorskip("pynvml")
    from native_fakes import libcuda_loads

    if libcuda_loads():
        pytest.skip("this machine has an NVIDIA driver")
    t = GpuTelemetry("cuda:0")
    assert t.reason.startswith("unsupported: NVML could not open cuda:0 (NVMLError_LibraryNotFound")
    assert t.read() == {}


class _NotSupported(Exception):
    pass


class _FakeNvml:
    """pynvml's calls as used, for one 80 GB board that does not report power."""

    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU, NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 1, 0, 0, 1

    def __init__(self) -> None:
        self.samples = 0
        self.index = None

    def nvmlInit(self):  # noqa: N802 (pynvml's names)
        pass

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        self.index = i
        return "h"

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return b"NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        self.samples += 1
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return SimpleNamespace(used=12 << 30, total=80 << 30)

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802
        raise _NotSupported("power")

    def nvmlDeviceGetClockInfo(self, h, kind):  # noqa: N802
        return 1980 if kind == self.NVML_CLOCK_SM else 0

    def nvmlDeviceGetTemperature(self, h, kind):  # noqa: N802
        return 61

    def nvmlDeviceGetPcieThroughput(self, h, kind):  # noqa: N802
        return 2000 if kind == self.NVML_PCIE_UTIL_TX_BYTES else 500  # KB/s


def test_readings_are_mapped_unsupported_ones_left_out_and_sampled_at_most_every_interval(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    nv, now = _FakeNvml(), [100.0]
    t = GpuTelemetry("cuda:1", nvml=nv, min_interval_s=2.0, clock=lambda: now[0])
    assert t.reason == "nvml: NVIDIA H200" and nv.index == 5  # cuda:1 is the host's GPU 5
    r = t.read()
    assert r == {"gpu_util_pct": 87.0, "gpu_mem_used_bytes": float(12 << 30), "gpu_mem_total_bytes": float(80 << 30),
                 "gpu_sm_clock_mhz": 1980.0, "gpu_temp_c": 61.0, "gpu_pcie_tx_bytes_per_s": 2000 * 1024.0,
                 "gpu_pcie_rx_bytes_per_s": 500 * 1024.0}  # no gpu_power_w: the board does not report it
    now[0] += 1.0
    assert t.read() == r and nv.samples == 1
    now[0] += 1.0
    t.read()
    assert nv.samples == 2
