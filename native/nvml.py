"""NVML telemetry through nvidia-ml-py (the `gpu` extra): what a worker's GPU is doing, for its heartbeat.

Each GPU worker reads its own device: utilisation, memory used and total, power, SM clock, temperature
and PCIe throughput. The readings travel as heartbeat stats (so /v1/cluster and /metrics show them per
worker); `reason` says why there are none ("unsupported: ..." on a CPU device, without nvidia-ml-py,
without a driver), and nothing is ever invented. A reading a board does not support (NVML's
NotSupported, e.g. power on some cards) is left out, not zeroed.

The CUDA index is mapped to NVML's through CUDA_VISIBLE_DEVICES (integers or GPU UUIDs), since NVML
numbers every GPU of the host. PCIe throughput is sampled by NVML over 20 ms, so readings are taken
at most every `min_interval_s` and cached in between. Not verifiable on a CPU machine: the readings
themselves (tests use a stand-in module; benchmarks/gpu records them on a GPU).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from native.availability import Availability


def _visible_entry(index: int) -> str:
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[index] if index < len(visible) else str(index)


class GpuTelemetry:
    """Readings of one worker's GPU. `nvml` is the pynvml module (tests pass a stand-in); `clock` seconds."""

    def __init__(self, device: str, nvml: Any | None = None, min_interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.device = device
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._nvml = nvml
        self._handle: Any | None = None
        self._last: dict[str, float] = {}
        self._read_at: float | None = None
        self.availability = self._open()

    @property
    def reason(self) -> str:
        """"nvml: <GPU name>" when reading, else "unsupported: <why>"."""
        return self.availability.reason

    def _open(self) -> Availability:
        if not self.device.startswith("cuda"):
            return Availability(False, f"unsupported: the worker runs on {self.device!r}, not a GPU")
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                return Availability(False, "unsupported: nvidia-ml-py is not installed (pip install 'tierserve[gpu]')")
            self._nvml = pynvml
        nv = self._nvml
        try:
            nv.nvmlInit()
            entry = _visible_entry(int(self.device.partition(":")[2] or 0))
            if entry.isdigit():
                self._handle = nv.nvmlDeviceGetHandleByIndex(int(entry))
            else:
                self._handle = nv.nvmlDeviceGetHandleByUUID(entry)
            name = nv.nvmlDeviceGetName(self._handle)
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, InvalidArgument, ...
            return Availability(False, f"unsupported: NVML could not open {self.device} ({type(e).__name__}: {e})")
        return Availability(True, f"nvml: {name.decode() if isinstance(name, bytes) else name}")

    def read(self) -> dict[str, float]:
        """The latest readings ({} when unsupported), taken anew at most every `min_interval_s`."""
        if not self.availability.ok:
            return {}
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self.min_interval_s:
            self._last = self._sample()
            self._read_at = now
        return dict(self._last)

    def _sample(self) -> dict[str, float]:
        nv, h = self._nvml, self._handle
        probes: dict[str, Callable[[], float]] = {
            "gpu_util_pct": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
            "gpu_mem_used_bytes": lambda: nv.nvmlDeviceGetMemoryInfo(h).used,
            "gpu_mem_total_bytes": lambda: nv.nvmlDeviceGetMemoryInfo(h).total,
            "gpu_power_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "gpu_sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "gpu_temp_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "gpu_pcie_tx_bytes_per_s": lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES) * 1024.0,
            "gpu_pcie_rx_bytes_per_s": lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES) * 1024.0,
        }
        out = {}
        for name, probe in probes.items():
            try:
                out[name] = float(probe())
            except Exception:  # NotSupported on this board (or a transient NVML error): left out, never invented
                continue
        return out
