"""A pure-Python double of the pynvml surface gpuaudit uses, driven by a scenario.

``FakeNvml(scenario)`` behaves like the ``pynvml`` module for the calls
:class:`gpuaudit.measure.live.nvml.NvmlBackend` makes: it returns pynvml's own ctypes structures
and raises pynvml's own ``NVMLError_*`` classes, so the backend's translation and probing run
exactly as on a real driver. The compiled double (``fakenvml/fakenvml.c``, a
``libnvidia-ml.so.1`` loaded by the real pynvml) reads the same scenario format with the same
semantics; the tests check both against each other.

Use it to test an integration without a GPU::

    from gpuaudit.measure.live.fake_nvml import FakeNvml
    with gpuaudit.monitor(backend=FakeNvml.backend({"gpus": [{"pattern": {"kind": "square"}}]})):
        ...

Scenario (JSON; every key optional)::

    {"driver_version": "550.54.15",
     "missing": ["nvmlGpmSampleGet"],            # FunctionNotFound, as with an older driver
     "gpus": [{"uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3",
               "memory_total_mib": 81559, "power_idle_w": 70, "power_max_w": 700,
               "power_limit_w": 700, "temp_idle_c": 30, "temp_max_c": 75,
               "sm_clock_mhz": 1980, "gpm": true, "tensor_ratio": 0.6, "ecc_dbe": 0,
               "energy_start_j": 1000000,
               "not_supported": ["utilization", "memory", "fields", "power_instant",
                                 "power_average", "energy", "ecc", "power_usage",
                                 "power_limit", "temperature", "clock", "clocks_event_reasons",
                                 "pcie"],
               "lost_at_s": 2.0,                 # every call on this GPU fails from then on
               "pattern": {"kind": "square", "period_s": 1.0, "low": 0, "high": 100,
                           "duty": 0.5},
               "mig": [{"uuid": "MIG-...", "profile": "1g.10gb", "gi": 1,
                        "memory_total_mib": 9984, "pattern": {"kind": "constant",
                                                              "value": 40}}]}]}

Patterns give utilization (percent) at ``t`` seconds after ``nvmlInit``: ``constant``
(``value``), ``square`` (``low``/``high``, ``period_s``, ``duty`` share high), ``sawtooth``
(``low`` to ``high`` over ``period_s``), ``steps`` (``values`` each held ``step_s``, then
the last). Everything else follows from utilization u: memory-controller util u/2, power
``idle + (max - idle) u/100``, temperature likewise, SM clock 345 MHz when u < 1 else
``sm_clock_mhz``, clocks-event reasons 0x1 (GPU idle) when u < 1, GPM SM util 0.9u, occupancy
0.4u, tensor ``tensor_ratio`` u, DRAM 0.3u, graphics u, PCIe TX u and RX 2u MiB/s, NVLink
TX/RX 0.1u MiB/s; energy integrates power between calls. MIG instances report memory and GPM
(through the parent) only; utilization and power are NotSupported on them, as on a real A100.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["SCENARIO_ENV", "FakeNvml", "build_fake_library", "load_scenario", "pattern_value"]

#: Environment variable naming the scenario file (read by the C double at nvmlInit).
SCENARIO_ENV = "GPUAUDIT_FAKE_NVML_SCENARIO"


def build_fake_library(out_dir: str | os.PathLike[str], cc: str = "gcc") -> Path:
    """Compile the C double into ``out_dir/libnvidia-ml.so.1`` (needs a C compiler).

    Load it with ``LD_LIBRARY_PATH=out_dir`` in a child process, or in this one with
    :func:`gpuaudit.measure.live.nvml.load_library`; point ``GPUAUDIT_FAKE_NVML_SCENARIO`` at a
    scenario file before ``nvmlInit``.
    """
    import subprocess

    src = Path(__file__).with_name("fakenvml") / "fakenvml.c"
    out = Path(out_dir) / "libnvidia-ml.so.1"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out), str(src), "-lm"],
                   check=True, capture_output=True, text=True)
    return out


def load_scenario(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a scenario JSON file."""
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def pattern_value(pattern: Mapping[str, Any] | None, t_s: float) -> float:
    """Utilization percent of a scripted pattern at ``t_s`` seconds (see module doc)."""
    if not pattern:
        return 0.0
    kind = pattern.get("kind", "constant")
    if kind == "constant":
        return float(pattern.get("value", 0.0))
    low = float(pattern.get("low", 0.0))
    high = float(pattern.get("high", 100.0))
    period = float(pattern.get("period_s", 1.0))
    if kind == "square":
        phase = math.fmod(t_s, period) / period
        return high if phase < float(pattern.get("duty", 0.5)) else low
    if kind == "sawtooth":
        phase = math.fmod(t_s, period) / period
        return low + (high - low) * phase
    if kind == "steps":
        values = list(pattern.get("values", [0.0]))
        k = int(t_s / float(pattern.get("step_s", 1.0)))
        return float(values[min(k, len(values) - 1)])
    raise ValueError(f"unknown pattern kind {kind!r}")


class _Handle:
    def __init__(self, spec: Mapping[str, Any], index: int, parent: _Handle | None = None):
        self.spec = spec
        self.index = index
        self.parent = parent
        self.mig: list[_Handle] = []
        self.energy_mj = float(spec.get("energy_start_j", 1_000_000.0)) * 1000.0
        self.energy_t: float | None = None

    @property
    def gpu(self) -> _Handle:
        return self.parent if self.parent is not None else self

    def __repr__(self) -> str:
        return f"<fake nvmlDevice_t {self.spec.get('uuid')}>"


class _GpmMetric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class _GpmMetricsGet:
    """Stands in for ``c_nvmlGpmMetricsGet_t`` (whose sample fields take only C pointers)."""

    def __init__(self) -> None:
        self.version = 1
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_GpmMetric() for _ in range(64)]


class _GpmSample:
    def __init__(self) -> None:
        self.t: float | None = None
        self.handle: _Handle | None = None


def _default_uuid(i: int) -> str:
    return f"GPU-fa4e0000-0000-4000-8000-{i:012x}"


class FakeNvml:
    """The pynvml functions gpuaudit calls, answering from a scenario (see module doc)."""

    def __init__(self, scenario: Mapping[str, Any] | None = None,
                 clock: Any = time.monotonic) -> None:
        import pynvml

        self._p = pynvml
        self.NVMLError = pynvml.NVMLError
        self.c_nvmlGpmMetricsGet_t = _GpmMetricsGet
        self.scenario: dict[str, Any] = dict(scenario or {"gpus": [{}]})
        self._clock = clock
        self._t0: float | None = None
        self._gpus: list[_Handle] = []
        self.calls = 0

    @classmethod
    def backend(cls, scenario: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
        """An :class:`~gpuaudit.measure.live.nvml.NvmlBackend` over a fake with ``scenario``."""
        from gpuaudit.measure.live.nvml import NvmlBackend

        kwargs.setdefault("visible", None)
        return NvmlBackend(cls(scenario), **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return {"scenario": self.scenario}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["scenario"])  # type: ignore[misc]

    # -- plumbing --------------------------------------------------------------------------
    def _raise(self, code: int) -> None:
        raise self._p.NVMLError(code)

    def _enter(self, name: str, handle: _Handle | None = None) -> float:
        self.calls += 1
        if name in self.scenario.get("missing", ()):
            self._raise(self._p.NVML_ERROR_FUNCTION_NOT_FOUND)
        if self._t0 is None:
            self._raise(self._p.NVML_ERROR_UNINITIALIZED)
        t = float(self._clock() - (self._t0 or 0.0))
        if handle is not None:
            lost = handle.gpu.spec.get("lost_at_s")
            if lost is not None and t >= float(lost):
                self._raise(self._p.NVML_ERROR_GPU_IS_LOST)
        return t

    def _check(self, handle: _Handle, what: str) -> None:
        if what in handle.spec.get("not_supported", ()):
            self._raise(self._p.NVML_ERROR_NOT_SUPPORTED)

    def _whole(self, handle: _Handle) -> None:
        if handle.parent is not None:
            self._raise(self._p.NVML_ERROR_NOT_SUPPORTED)

    def _u(self, handle: _Handle, t: float) -> float:
        return max(0.0, min(100.0, pattern_value(handle.spec.get("pattern"), t)))

    def _power_mw(self, h: _Handle, t: float) -> float:
        idle = float(h.spec.get("power_idle_w", 70.0))
        peak = float(h.spec.get("power_max_w", 700.0))
        return (idle + (peak - idle) * self._u(h, t) / 100.0) * 1000.0

    # -- init ------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if "nvmlInit" in self.scenario.get("missing", ()):
            self._raise(self._p.NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.scenario.get("driver_not_loaded"):
            self._raise(self._p.NVML_ERROR_DRIVER_NOT_LOADED)
        self._t0 = float(self._clock())
        self._gpus = []
        for i, spec in enumerate(self.scenario.get("gpus", [])):
            spec = {"uuid": _default_uuid(i), **spec}
            h = _Handle(spec, i)
            for j, ms in enumerate(spec.get("mig", [])):
                ms = {"uuid": f"MIG-fa4e{i:04x}-0000-4000-8000-{j:012x}", "gi": j + 1, **ms}
                h.mig.append(_Handle(ms, j, parent=h))
            self._gpus.append(h)

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._t0 = None

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return str(self.scenario.get("driver_version", "550.54.15"))

    # -- enumeration -----------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._gpus):
            self._raise(self._p.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpus[index]

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        self._enter("nvmlDeviceGetUUID", h)
        return str(h.spec["uuid"])

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        self._enter("nvmlDeviceGetName", h)
        name = str(h.gpu.spec.get("name", "NVIDIA H100 80GB HBM3"))
        if h.parent is not None:
            return f"{name} MIG {h.spec.get('profile', '1g.10gb')}"
        return name

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", h)
        if "mig" not in h.spec and not h.spec.get("mig_capable"):
            self._raise(self._p.NVML_ERROR_NOT_SUPPORTED)
        on = 1 if h.mig else 0
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, index: int) -> _Handle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if index >= len(h.mig):
            self._raise(self._p.NVML_ERROR_NOT_FOUND)
        return h.mig[index]

    def nvmlDeviceGetGpuInstanceId(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", h)
        if h.parent is None:
            self._raise(self._p.NVML_ERROR_INVALID_ARGUMENT)
        return int(h.spec["gi"])

    # -- readings --------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> Any:
        t = self._enter("nvmlDeviceGetUtilizationRates", h)
        self._whole(h)
        self._check(h, "utilization")
        u = self._u(h, t)
        return self._p.c_nvmlUtilization_t(gpu=int(u + 0.5), memory=int(u / 2 + 0.5))

    def nvmlDeviceGetMemoryInfo(self, h: _Handle) -> Any:
        t = self._enter("nvmlDeviceGetMemoryInfo", h)
        self._check(h, "memory")
        total = int(float(h.spec.get("memory_total_mib", 81559 if h.parent is None else 9984))
                    * 1048576)
        used = int(total * (0.05 + 0.5 * self._u(h, t) / 100.0))
        return self._p.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def _energy_mj(self, h: _Handle, t: float) -> float:
        if h.energy_t is not None:
            h.energy_mj += self._power_mw(h, t) * max(0.0, t - h.energy_t)
        h.energy_t = t
        return h.energy_mj

    def nvmlDeviceGetFieldValues(self, h: _Handle, field_ids: list[int]) -> Any:
        t = self._enter("nvmlDeviceGetFieldValues", h)
        self._check(h, "fields")
        p = self._p
        values = (p.c_nvmlFieldValue_t * len(field_ids))()
        for k, fid in enumerate(field_ids):
            v = values[k]
            v.fieldId = fid
            v.timestamp = int(time.time() * 1e6)
            names = {p.NVML_FI_DEV_POWER_INSTANT: "power_instant",
                     p.NVML_FI_DEV_POWER_AVERAGE: "power_average",
                     p.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: "energy",
                     p.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: "ecc"}
            name = names.get(fid)
            if name is None or h.parent is not None or name in h.spec.get("not_supported", ()):
                v.nvmlReturn = p.NVML_ERROR_NOT_SUPPORTED
                continue
            v.nvmlReturn = p.NVML_SUCCESS
            if name in ("power_instant", "power_average"):
                v.valueType = p.NVML_VALUE_TYPE_UNSIGNED_INT
                v.value.uiVal = int(self._power_mw(h, t))
            elif name == "energy":
                v.valueType = p.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                v.value.ullVal = int(self._energy_mj(h, t))
            else:
                v.valueType = p.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                v.value.ullVal = int(h.spec.get("ecc_dbe", 0))
        return values

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        t = self._enter("nvmlDeviceGetPowerUsage", h)
        self._whole(h)
        self._check(h, "power_usage")
        return int(self._power_mw(h, t))

    def nvmlDeviceGetTotalEnergyConsumption(self, h: _Handle) -> int:
        t = self._enter("nvmlDeviceGetTotalEnergyConsumption", h)
        self._whole(h)
        self._check(h, "energy")
        return int(self._energy_mj(h, t))

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h)
        self._whole(h)
        self._check(h, "ecc")
        return int(h.spec.get("ecc_dbe", 0))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", h)
        self._whole(h)
        self._check(h, "power_limit")
        return int(float(h.spec.get("power_limit_w", h.spec.get("power_max_w", 700.0))) * 1000)

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        t = self._enter("nvmlDeviceGetTemperature", h)
        self._whole(h)
        self._check(h, "temperature")
        lo = float(h.spec.get("temp_idle_c", 30.0))
        hi = float(h.spec.get("temp_max_c", 75.0))
        return int(lo + (hi - lo) * self._u(h, t) / 100.0 + 0.5)

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock_type: int) -> int:
        t = self._enter("nvmlDeviceGetClockInfo", h)
        self._whole(h)
        self._check(h, "clock")
        return 345 if self._u(h, t) < 1.0 else int(h.spec.get("sm_clock_mhz", 1980))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        t = self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        self._whole(h)
        self._check(h, "clocks_event_reasons")
        return 1 if self._u(h, t) < 1.0 else 0

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: _Handle) -> int:
        t = self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        self._whole(h)
        self._check(h, "clocks_event_reasons")
        return 1 if self._u(h, t) < 1.0 else 0

    def nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        t = self._enter("nvmlDeviceGetPcieThroughput", h)
        self._whole(h)
        self._check(h, "pcie")
        u = self._u(h, t)
        return int(u * 1024 * (1 if counter == 0 else 2))  # KB/s

    # -- GPM -------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h: _Handle) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport", h)
        s = self._p.c_nvmlGpmSupport_t()
        s.version = 1
        s.isSupportedDevice = 1 if h.gpu.spec.get("gpm", False) else 0
        return s

    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        self._enter("nvmlGpmSampleAlloc")
        return _GpmSample()

    def nvmlGpmSampleFree(self, sample: _GpmSample) -> None:
        self._enter("nvmlGpmSampleFree")

    def nvmlGpmSampleGet(self, h: _Handle, sample: _GpmSample) -> _GpmSample:
        sample.t = self._enter("nvmlGpmSampleGet", h)
        if not h.spec.get("gpm", False):
            self._raise(self._p.NVML_ERROR_NOT_SUPPORTED)
        sample.handle = h
        return sample

    def nvmlGpmMigSampleGet(self, h: _Handle, gi: int, sample: _GpmSample) -> _GpmSample:
        sample.t = self._enter("nvmlGpmMigSampleGet", h)
        if not h.spec.get("gpm", False):
            self._raise(self._p.NVML_ERROR_NOT_SUPPORTED)
        found = [m for m in h.mig if int(m.spec["gi"]) == int(gi)]
        if not found:
            self._raise(self._p.NVML_ERROR_NOT_FOUND)
        sample.handle = found[0]
        return sample

    def nvmlGpmMetricsGet(self, req: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        s1: _GpmSample = req.sample1 if isinstance(req.sample1, _GpmSample) else _GpmSample()
        s2: _GpmSample = req.sample2 if isinstance(req.sample2, _GpmSample) else _GpmSample()
        if s1.t is None or s2.t is None or s2.handle is None or s1.handle is not s2.handle:
            self._raise(self._p.NVML_ERROR_INVALID_ARGUMENT)
        assert s2.handle is not None and s2.t is not None
        u = self._u(s2.handle, s2.t)
        tensor = float(s2.handle.gpu.spec.get("tensor_ratio", 0.6))
        derived = {1: u, 2: 0.9 * u, 3: 0.4 * u, 5: tensor * u, 10: 0.3 * u,
                   20: u, 21: 2.0 * u, 60: 0.1 * u, 61: 0.1 * u}
        for k in range(int(req.numMetrics)):
            m = req.metrics[k]
            value = derived.get(int(m.metricId))
            if value is None:
                m.nvmlReturn = self._p.NVML_ERROR_NOT_SUPPORTED
                continue
            m.nvmlReturn = self._p.NVML_SUCCESS
            m.value = value
        return req

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            def missing(*args: Any) -> Any:
                raise self._p.NVMLError(self._p.NVML_ERROR_FUNCTION_NOT_FOUND)
            return missing
        raise AttributeError(name)
