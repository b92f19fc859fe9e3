"""NVML backend: reads every visible GPU and MIG instance through nvidia-ml-py (``pynvml``).

The backend is injected into :class:`gpuaudit.measure.live.sampler.Sampler`. It takes a module-like
``lib`` exposing the pynvml functions it uses; the default is the real ``pynvml`` (which loads
``libnvidia-ml.so.1``), and :class:`gpuaudit.measure.live.fake_nvml.FakeNvml` is a pure-Python
double with the same surface, so every path below runs without a GPU.

What is read, per device and sample (NVML call -> sample-table column):

* ``nvmlDeviceGetUtilizationRates`` -> ``util_gpu_pct``, ``util_mem_pct``
* ``nvmlDeviceGetMemoryInfo`` (bytes) -> ``mem_used_mib``, ``mem_total_mib``
* ``nvmlDeviceGetFieldValues`` batched: ``NVML_FI_DEV_POWER_INSTANT`` (mW, preferred) or
  ``NVML_FI_DEV_POWER_AVERAGE`` (mW) -> ``power_w``; ``NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION``
  (mJ) -> ``energy_j``; ``NVML_FI_DEV_ECC_DBE_VOL_TOTAL`` -> ``ecc_dbe_total``. Where the
  field API lacks one, the single calls ``nvmlDeviceGetPowerUsage``,
  ``nvmlDeviceGetTotalEnergyConsumption`` and ``nvmlDeviceGetTotalEccErrors`` stand in.
* ``nvmlDeviceGetEnforcedPowerLimit`` (mW) -> ``power_limit_w``
* ``nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)`` -> ``temp_c``
* ``nvmlDeviceGetClockInfo(NVML_CLOCK_SM)`` -> ``sm_clock_mhz``
* ``nvmlDeviceGetCurrentClocksEventReasons`` (older drivers:
  ``nvmlDeviceGetCurrentClocksThrottleReasons``) -> ``clocks_event_reasons``
* Hopper+ GPM (``nvmlGpmSampleGet`` / ``nvmlGpmMigSampleGet`` + ``nvmlGpmMetricsGet`` over
  the previous and the current sample): SM util, SM occupancy, any-tensor util, DRAM bandwidth
  util, graphics util (percent -> ratio 0..1), PCIe and NVLink TX/RX (MiB/s -> bytes/s).
* ``nvmlDeviceGetPcieThroughput`` (KB/s) only when asked for (``pcie_throughput=True``):
  the driver measures it over 20 ms per call, too slow for a 10 Hz loop over many GPUs.

Support is probed once per device and reader: ``NVMLError_NotSupported`` disables a reader
for that device (its columns stay null); ``NVMLError_FunctionNotFound`` (driver older than
the binding) disables it everywhere and adds one warning. NVML errors are translated in one
place, :func:`translate`, into :class:`NvmlError` subclasses (``raise ... from e``).
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import EllipsisType
from typing import Any

from gpuaudit.errors import GpuauditError, SourceUnavailableError

__all__ = [
    "READ_COLUMNS",
    "Device",
    "FunctionNotFoundError",
    "GpuLostError",
    "NotSupportedError",
    "NvmlBackend",
    "NvmlError",
    "load_library",
    "select_visible",
    "translate",
]

#: Columns a backend fills per device and sample (identity columns come from :class:`Device`).
READ_COLUMNS: tuple[str, ...] = (
    "util_gpu_pct", "util_mem_pct", "mem_used_mib", "mem_total_mib", "power_w",
    "power_limit_w", "temp_c", "sm_clock_mhz", "energy_j", "clocks_event_reasons",
    "sm_active", "sm_occupancy", "tensor_active", "dram_active", "gr_engine_active",
    "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s", "ecc_dbe_total",
)
INT_COLUMNS = frozenset({"clocks_event_reasons", "ecc_dbe_total"})

Reading = dict[str, "float | int | None"]

# NVML constants (nvml.h); repeated here so this module imports without pynvml installed.
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_NOT_FOUND = 6
_ERR_DRIVER_NOT_LOADED = 9
_ERR_LIBRARY_NOT_FOUND = 12
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_ERR_LIB_RM_VERSION_MISMATCH = 18
_ERR_UNINITIALIZED = 1

FI_ECC_DBE_VOL_TOTAL = 4
FI_TOTAL_ENERGY = 83
FI_POWER_AVERAGE = 185
FI_POWER_INSTANT = 186
_FIELDS = (FI_POWER_INSTANT, FI_POWER_AVERAGE, FI_TOTAL_ENERGY, FI_ECC_DBE_VOL_TOTAL)

GPM_GRAPHICS_UTIL = 1
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10
GPM_PCIE_TX_PER_SEC = 20
GPM_PCIE_RX_PER_SEC = 21
GPM_NVLINK_TOTAL_RX_PER_SEC = 60
GPM_NVLINK_TOTAL_TX_PER_SEC = 61
#: GPM metric id -> (column, scale). Percent metrics become ratios, MiB/s become bytes/s.
GPM_METRICS: dict[int, tuple[str, float]] = {
    GPM_SM_UTIL: ("sm_active", 0.01),
    GPM_SM_OCCUPANCY: ("sm_occupancy", 0.01),
    GPM_ANY_TENSOR_UTIL: ("tensor_active", 0.01),
    GPM_DRAM_BW_UTIL: ("dram_active", 0.01),
    GPM_GRAPHICS_UTIL: ("gr_engine_active", 0.01),
    GPM_PCIE_TX_PER_SEC: ("pcie_tx_bytes_per_s", 1048576.0),
    GPM_PCIE_RX_PER_SEC: ("pcie_rx_bytes_per_s", 1048576.0),
    GPM_NVLINK_TOTAL_TX_PER_SEC: ("nvlink_tx_bytes_per_s", 1048576.0),
    GPM_NVLINK_TOTAL_RX_PER_SEC: ("nvlink_rx_bytes_per_s", 1048576.0),
}
_GPM_COLUMNS = tuple(GPM_METRICS.values())
#: the getters a tick calls with a handle, fixed unsigned inputs and one output, by the
#: output's C type (a ctypes scalar, whose value is returned, or the binding's structure,
#: returned as it is): pynvml's own wrappers of the same name take and give the same
_GETTER_OUTPUTS = {
    "nvmlDeviceGetUtilizationRates": "c_nvmlUtilization_t",
    "nvmlDeviceGetMemoryInfo": "c_nvmlMemory_t",
    "nvmlDeviceGetEnforcedPowerLimit": "c_uint",
    "nvmlDeviceGetTemperature": "c_uint",
    "nvmlDeviceGetClockInfo": "c_uint",
    "nvmlDeviceGetCurrentClocksEventReasons": "c_ulonglong",
}
#: the field-value call's key among a device's prepared calls (its inputs: the probed fields)
_FIELDS_KEY = ("nvmlDeviceGetFieldValues",)
_GPM_METRICS_GET_VERSION = 1
#: Read and set a numeric field of a binding's structure. pynvml's structures override
#: ``__getattribute__`` and ``__setattr__`` in Python (to convert between bytes and str) and
#: a tick touches ~50 fields per GPU; the plain lookup gives the same numbers at a fraction
#: of the cost (issue 27: the sampler's CPU per tick).
_get = object.__getattribute__
_set = object.__setattr__
_MIB = 1048576.0


class NvmlError(GpuauditError):
    """An NVML call failed; ``code`` is the NVML return code, ``call`` the function."""

    def __init__(self, what: str, *, code: int, call: str, where: str | None = None,
                 fix: str | None = None) -> None:
        self.code = code
        self.call = call
        super().__init__(what, where=where, fix=fix)


class NotSupportedError(NvmlError):
    """NVML_ERROR_NOT_SUPPORTED: this device cannot report this value (a null, not an error)."""


class FunctionNotFoundError(NvmlError):
    """NVML_ERROR_FUNCTION_NOT_FOUND: the driver is older than the binding."""


class GpuLostError(NvmlError):
    """NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus; recorded as an event."""


class NvmlUnavailableError(SourceUnavailableError):
    """NVML cannot be used at all: no binding, no libnvidia-ml, no driver, no visible GPU."""


def translate(exc: BaseException, call: str, where: str | None = None) -> GpuauditError:
    """Map a ``pynvml.NVMLError`` (anything with an int ``value``) to one of our errors.

    This is the one place NVML return codes are interpreted.
    """
    code = int(getattr(exc, "value", -1))
    text = _describe(exc)
    if code == _ERR_NOT_SUPPORTED:
        return NotSupportedError(f"{call}: not supported", code=code, call=call, where=where)
    if code == _ERR_FUNCTION_NOT_FOUND:
        return FunctionNotFoundError(
            f"{call} is not in this driver's libnvidia-ml", code=code, call=call, where=where,
            fix="upgrade the NVIDIA driver to read this value; it is recorded as empty",
        )
    if code == _ERR_GPU_IS_LOST:
        return GpuLostError(f"GPU is lost ({call})", code=code, call=call, where=where,
                            fix="check dmesg for Xid 79 and the GPU's power and seating")
    if code == _ERR_LIBRARY_NOT_FOUND:
        return NvmlUnavailableError(
            "no NVIDIA driver: libnvidia-ml.so.1 (NVML, installed with the driver) was not "
            "found", where=where, fix=_INIT_FIX[code])
    if code in (_ERR_DRIVER_NOT_LOADED, _ERR_LIB_RM_VERSION_MISMATCH):
        return NvmlUnavailableError(f"{call}: {text}", where=where, fix=_INIT_FIX.get(code))
    if code == _ERR_NO_PERMISSION:
        return NvmlError(f"{call}: insufficient permissions", code=code, call=call,
                         where=where, fix="run as a user allowed to query this value")
    return NvmlError(f"{call} failed: {text} (NVML error {code})", code=code, call=call,
                     where=where)


_INIT_FIX = {
    _ERR_LIBRARY_NOT_FOUND: "install the NVIDIA driver (libnvidia-ml.so.1 ships with it) or "
    "run where one is installed; in a container, use the NVIDIA container toolkit "
    "(--gpus all)",
    _ERR_DRIVER_NOT_LOADED: "load the NVIDIA kernel driver (nvidia-smi should work first)",
    _ERR_LIB_RM_VERSION_MISMATCH: "the user-space libnvidia-ml and the kernel driver differ: "
    "reboot or reload the driver after an upgrade",
}


def _describe(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # pynvml's __str__ calls into the library, which may be gone
        return type(exc).__name__


def load_library(path: str | os.PathLike[str]) -> None:
    """Point pynvml at a specific ``libnvidia-ml`` (pynvml itself only tries the default name).

    pynvml keeps the loaded library in the module global ``nvmlLib`` and caches function
    pointers; both are replaced here. Used by the tests to load the fake library, and useful
    where the driver's library lives off the loader path.
    """
    import pynvml

    lib = ctypes.CDLL(os.fspath(path))
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()


@dataclass(frozen=True)
class Device:
    """One time series: a whole GPU or a MIG instance, identified by UUID."""

    uuid: str
    index: int
    model: str | None
    mig_profile: str | None = None
    parent_uuid: str | None = None
    gi_id: int | None = None


@dataclass
class _State:
    """What the backend knows about one device: handles, probed support, GPM samples."""

    device: Device
    handle: Any
    parent_handle: Any = None
    probed: bool = False
    disabled: set[str] = field(default_factory=set)
    fields: tuple[int, ...] = _FIELDS
    gpm_prev: Any = None
    gpm_cur: Any = None
    gpm_req: Any = None
    #: each GPM metric's (nvmlReturn, value) in the request's memory, read in one unpack
    gpm_layout: struct.Struct | None = None
    lost: bool = False
    #: after the probe: (function, inputs) -> its call prepared once (the getters: see
    #: NvmlBackend._tick_call; the field values: _r_fields); None where it cannot be (the
    #: binding is called as it is)
    prepared: dict[tuple[Any, ...], Callable[[], Any] | None] = field(default_factory=dict)


_MIG_PROFILE = re.compile(r"MIG\s+(\S+)")


class NvmlBackend:
    """Reads GPUs through pynvml (or a module-like double with the same functions).

    ``visible`` is a ``CUDA_VISIBLE_DEVICES`` value (default: the environment's); ``None``
    means every GPU. ``library_path`` loads a specific libnvidia-ml first.
    """

    source = "nvml"

    def __init__(
        self,
        lib: Any = None,
        *,
        visible: str | EllipsisType | None = ...,
        library_path: str | None = None,
        pcie_throughput: bool = False,
    ) -> None:
        self._lib = lib
        self._visible: str | None = (
            os.environ.get("CUDA_VISIBLE_DEVICES") if isinstance(visible, EllipsisType)
            else visible
        )
        self._library_path = library_path
        self._pcie_throughput = pcie_throughput
        self._states: dict[str, _State] = {}
        self._missing_functions: set[str] = set()
        self.warnings: list[str] = []
        self.notes: list[str] = []
        self.driver_version: str | None = None
        self._open = False
        self._err: Any = Exception

    # Pickling for the sampling process: the real pynvml module does not pickle, so it is
    # imported again on the other side.
    def __getstate__(self) -> dict[str, Any]:
        if self._open:
            raise RuntimeError("an open NvmlBackend cannot be sent to another process")
        state = self.__dict__.copy()
        if getattr(self._lib, "__name__", None) == "pynvml":
            state["_lib"] = None
        state["_err"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._err = Exception

    # -- the one place NVML is called ----------------------------------------------------
    def _call(self, name: str, *args: Any, where: str | None = None) -> Any:
        if name in self._missing_functions:
            raise FunctionNotFoundError(f"{name} missing", code=_ERR_FUNCTION_NOT_FOUND,
                                        call=name, where=where)
        fn: Callable[..., Any] | None = getattr(self._lib, name, None)
        if fn is None:
            raise FunctionNotFoundError(f"the NVML binding has no {name}",
                                        code=_ERR_FUNCTION_NOT_FOUND, call=name, where=where)
        try:
            return fn(*args)
        except self._err as exc:
            raise translate(exc, name, where) from exc

    def _tick_call(self, st: _State, name: str, *inputs: int) -> Any:
        """``name(handle, *inputs)`` of ``st``'s device, as :meth:`_call` gives it. From the
        first reading after the probe on, a getter of :data:`_GETTER_OUTPUTS` is called
        through the binding's function pointer with its output built once, as pynvml's
        own wrapper calls it (which looks the function up under a lock and builds a fresh
        output on every call)."""
        key = (name, *inputs)
        fast = st.prepared.get(key)
        if fast is not None:
            return fast()
        value = self._call(name, st.handle, *inputs)
        if st.probed and key not in st.prepared:
            st.prepared[key] = self._prepare(name, st.handle, inputs)
        return value

    def _prepare(self, name: str, handle: Any, inputs: tuple[int, ...],
                 ) -> Callable[[], Any] | None:
        """``name``'s call with its output built once (see :meth:`_tick_call`); None: the
        binding has no pynvml internals (a double) or ``name`` is not a known getter."""
        kind_name = _GETTER_OUTPUTS.get(name)
        kind = None if kind_name is None else \
            getattr(ctypes, kind_name, None) or getattr(self._lib, kind_name, None)
        if kind is None:
            return None
        out = kind()
        args = (handle, *(ctypes.c_uint(x) for x in inputs), ctypes.byref(out))
        return self._pointer_call(name, args, out,
                                  value=issubclass(kind, ctypes._SimpleCData))

    def _pointer_call(self, name: str, args: tuple[Any, ...], out: Any, *,
                      value: bool = False) -> Callable[[], Any] | None:
        """A call of the C function ``name`` with ``args`` (built once by the caller)
        through the binding's function pointer, its return checked and translated as
        :meth:`_call` does, giving ``out`` (the output ``args`` points at; ``value``: a
        ctypes scalar's ``.value``); None: the binding has no pynvml internals (a double) or
        no such function."""
        pointer_of = getattr(self._lib, "_nvmlGetFunctionPointer", None)
        check = getattr(self._lib, "_nvmlCheckReturn", None)
        if pointer_of is None or check is None:
            return None
        try:
            fn = pointer_of(name)
        except self._err:
            return None
        err = self._err

        def call() -> Any:
            try:
                check(fn(*args))
            except err as exc:
                raise translate(exc, name) from exc
            return out.value if value else out

        return call

    def _missing(self, err: FunctionNotFoundError) -> None:
        if err.call not in self._missing_functions:
            self._missing_functions.add(err.call)
            self.warnings.append(
                f"{err.call} is not available in this NVIDIA driver (older than the "
                f"nvidia-ml-py binding); its columns are recorded as empty"
            )

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> list[Device]:
        """``nvmlInit`` and enumerate the visible devices.

        Raises :class:`NvmlUnavailableError` (a :class:`SourceUnavailableError`) naming what
        is missing: the binding, libnvidia-ml, the driver, or any visible GPU.
        """
        if self._lib is None:
            try:
                import pynvml
            except ImportError as exc:
                raise NvmlUnavailableError(
                    "the NVML binding (Python package nvidia-ml-py, module pynvml) is not "
                    "installed", fix="pip install nvidia-ml-py",
                ) from exc
            self._lib = pynvml
        self._err = getattr(self._lib, "NVMLError", Exception)
        if self._library_path:
            try:
                load_library(self._library_path)
            except OSError as exc:
                raise NvmlUnavailableError(
                    f"cannot load {self._library_path}: {exc}", where=self._library_path,
                    fix="give the path of libnvidia-ml.so.1 from the NVIDIA driver",
                ) from exc
        try:
            self._call("nvmlInit")
        except NvmlUnavailableError:
            raise
        except NvmlError as exc:
            raise NvmlUnavailableError(f"nvmlInit failed: {exc.what}",
                                       fix="check that nvidia-smi works on this machine"
                                       ) from exc
        self._open = True
        try:
            version = self._call("nvmlSystemGetDriverVersion")
            self.driver_version = version.decode() if isinstance(version, bytes) else version
        except NvmlError:
            self.driver_version = None
        devices = self._enumerate()
        selected, notes = select_visible(devices, self._visible)
        self.notes.extend(notes)
        if not selected:
            self.close()
            reason = (
                "CUDA_VISIBLE_DEVICES hides every GPU" if self._visible is not None and devices
                else "the NVIDIA driver reports no GPU"
            )
            raise NvmlUnavailableError(
                f"no GPU to sample: {reason}",
                where=f"CUDA_VISIBLE_DEVICES={self._visible!r}" if self._visible is not None
                else None,
                fix="check nvidia-smi -L and CUDA_VISIBLE_DEVICES",
            )
        keep = {d.uuid for d in selected}
        self._states = {u: s for u, s in self._states.items() if u in keep}
        return selected

    def close(self) -> None:
        """Free GPM samples and ``nvmlShutdown``; safe to call twice."""
        if not self._open:
            return
        for st in self._states.values():
            for sample in (st.gpm_prev, st.gpm_cur):
                if sample is not None:
                    try:
                        self._call("nvmlGpmSampleFree", sample)
                    except NvmlError:
                        pass
            st.gpm_prev = st.gpm_cur = None
        try:
            self._call("nvmlShutdown")
        except NvmlError:
            pass
        self._open = False

    def _enumerate(self) -> list[Device]:
        count = int(self._call("nvmlDeviceGetCount"))
        out: list[Device] = []
        for i in range(count):
            try:
                h = self._call("nvmlDeviceGetHandleByIndex", i, where=f"GPU index {i}")
                uuid = _text(self._call("nvmlDeviceGetUUID", h, where=f"GPU index {i}"))
            except (GpuLostError, NvmlError) as exc:
                if isinstance(exc, NvmlUnavailableError):
                    raise
                self.notes.append(f"GPU index {i} cannot be read ({exc.what}); not sampled")
                continue
            model = self._optional("nvmlDeviceGetName", h)
            dev = Device(uuid=uuid, index=i, model=_text(model) if model is not None else None)
            out.append(dev)
            self._states[uuid] = _State(dev, h)
            out.extend(self._enumerate_mig(dev, h))
        return out

    def _enumerate_mig(self, parent: Device, h: Any) -> list[Device]:
        mode = self._optional("nvmlDeviceGetMigMode", h)
        if not mode or int(mode[0]) != 1:
            return []
        n = int(self._optional("nvmlDeviceGetMaxMigDeviceCount", h) or 0)
        out: list[Device] = []
        for j in range(n):
            try:
                mh = self._call("nvmlDeviceGetMigDeviceHandleByIndex", h, j)
            except NvmlError as exc:
                if exc.code == _ERR_NOT_FOUND:
                    continue
                raise
            uuid = _text(self._call("nvmlDeviceGetUUID", mh))
            name = self._optional("nvmlDeviceGetName", mh)
            name_s = _text(name) if name is not None else ""
            m = _MIG_PROFILE.search(name_s)
            gi = self._optional("nvmlDeviceGetGpuInstanceId", mh)
            dev = Device(uuid=uuid, index=parent.index, model=parent.model,
                         mig_profile=m.group(1) if m else None, parent_uuid=parent.uuid,
                         gi_id=int(gi) if gi is not None else None)
            out.append(dev)
            self._states[uuid] = _State(dev, mh, parent_handle=h)
        return out

    def _optional(self, name: str, *args: Any) -> Any:
        try:
            return self._call(name, *args)
        except FunctionNotFoundError as exc:
            self._missing(exc)
            return None
        except NotSupportedError:
            return None

    # -- reading ---------------------------------------------------------------------------
    def read(self, device: Device) -> Reading:
        """One reading of every supported column of ``device``.

        Raises :class:`GpuLostError` when the GPU is gone; other failures of a single call
        leave that call's columns null for this sample.
        """
        st = self._states[device.uuid]
        where = f"GPU {device.uuid}"
        out: Reading = {}
        first = not st.probed
        for name, reader in self._readers():
            if name in st.disabled:
                continue
            try:
                reader(st, out)
            except NotSupportedError:
                st.disabled.add(name)
            except FunctionNotFoundError as exc:
                self._missing(exc)
                st.disabled.add(name)
            except GpuLostError as exc:
                st.lost = True
                raise GpuLostError(exc.what, code=exc.code, call=exc.call, where=where,
                                   fix=exc.fix) from exc
            except NvmlError as exc:
                if first:  # a probe that fails outright: treat as unsupported, say so once
                    st.disabled.add(name)
                    self.warnings.append(f"{where}: {exc.what}; {name} recorded as empty")
        st.probed = True
        return out

    def _readers(self) -> Sequence[tuple[str, Callable[[_State, Reading], None]]]:
        readers: list[tuple[str, Callable[[_State, Reading], None]]] = [
            ("utilization", self._r_util),
            ("memory", self._r_memory),
            ("fields", self._r_fields),
            ("power_usage", self._r_power_usage),
            ("energy", self._r_energy),
            ("ecc", self._r_ecc),
            ("power_limit", self._r_power_limit),
            ("temperature", self._r_temp),
            ("sm_clock", self._r_clock),
            ("clocks_event_reasons", self._r_reasons),
            ("gpm", self._r_gpm),
        ]
        if self._pcie_throughput:
            readers.append(("pcie_throughput", self._r_pcie))
        return readers

    def _r_util(self, st: _State, out: Reading) -> None:
        u = self._tick_call(st, "nvmlDeviceGetUtilizationRates")
        out["util_gpu_pct"] = float(_get(u, "gpu"))
        out["util_mem_pct"] = float(_get(u, "memory"))

    def _r_memory(self, st: _State, out: Reading) -> None:
        m = self._tick_call(st, "nvmlDeviceGetMemoryInfo")
        out["mem_used_mib"] = _get(m, "used") / _MIB
        out["mem_total_mib"] = _get(m, "total") / _MIB

    def _r_fields(self, st: _State, out: Reading) -> None:
        fast = st.prepared.get(_FIELDS_KEY)
        if fast is not None:
            values = fast()
        else:
            values = self._call("nvmlDeviceGetFieldValues", st.handle, list(st.fields))
        ok: list[int] = []
        for v in values:
            ret = int(_get(v, "nvmlReturn"))
            if ret == _ERR_GPU_IS_LOST:
                raise GpuLostError("GPU is lost (field values)", code=ret,
                                   call="nvmlDeviceGetFieldValues")
            if ret != 0:
                continue
            fid = int(_get(v, "fieldId"))
            ok.append(fid)
            val = _field_value(v)
            if fid == FI_POWER_INSTANT:
                out["power_w"] = val / 1000.0
            elif fid == FI_POWER_AVERAGE:
                out.setdefault("power_w", val / 1000.0)
            elif fid == FI_TOTAL_ENERGY:
                out["energy_j"] = val / 1000.0
            elif fid == FI_ECC_DBE_VOL_TOTAL:
                out["ecc_dbe_total"] = int(val)
        if not st.probed:
            if not ok:
                raise NotSupportedError("no field supported", code=_ERR_NOT_SUPPORTED,
                                        call="nvmlDeviceGetFieldValues")
            st.fields = tuple(ok)
            # the single calls stand in only for what the field API could not give
            if FI_POWER_INSTANT in ok or FI_POWER_AVERAGE in ok:
                st.disabled.add("power_usage")
            if FI_TOTAL_ENERGY in ok:
                st.disabled.add("energy")
            if FI_ECC_DBE_VOL_TOTAL in ok:
                st.disabled.add("ecc")
            st.prepared[_FIELDS_KEY] = self._fields_call(st)

    def _fields_call(self, st: _State) -> Callable[[], Any] | None:
        """``nvmlDeviceGetFieldValues`` of the probed fields with its request built once:
        the field ids are NVML's inputs and the rest of each entry its outputs, so one array
        serves every tick. pynvml's own wrapper builds the array per call and tries to
        unpack every field id as a (field, scope) pair, an exception per field. None: a
        binding without pynvml's internals (a double), which is called as it is."""
        entry = getattr(self._lib, "c_nvmlFieldValue_t", None)
        if entry is None:
            return None
        values = (entry * len(st.fields))()
        for i, fid in enumerate(st.fields):
            values[i].fieldId = fid
        args = (st.handle, ctypes.c_int32(len(st.fields)), ctypes.byref(values))
        return self._pointer_call("nvmlDeviceGetFieldValues", args, values)

    def _r_power_usage(self, st: _State, out: Reading) -> None:
        out["power_w"] = self._call("nvmlDeviceGetPowerUsage", st.handle) / 1000.0

    def _r_energy(self, st: _State, out: Reading) -> None:
        out["energy_j"] = self._call("nvmlDeviceGetTotalEnergyConsumption", st.handle) / 1000.0

    def _r_ecc(self, st: _State, out: Reading) -> None:
        # NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, NVML_VOLATILE_ECC = 0
        out["ecc_dbe_total"] = int(self._call("nvmlDeviceGetTotalEccErrors", st.handle, 1, 0))

    def _r_power_limit(self, st: _State, out: Reading) -> None:
        out["power_limit_w"] = self._tick_call(st, "nvmlDeviceGetEnforcedPowerLimit") / 1000.0

    def _r_temp(self, st: _State, out: Reading) -> None:
        out["temp_c"] = float(self._tick_call(st, "nvmlDeviceGetTemperature", 0))

    def _r_clock(self, st: _State, out: Reading) -> None:
        out["sm_clock_mhz"] = float(self._tick_call(st, "nvmlDeviceGetClockInfo", 1))

    def _r_reasons(self, st: _State, out: Reading) -> None:
        try:
            v = self._tick_call(st, "nvmlDeviceGetCurrentClocksEventReasons")
        except FunctionNotFoundError:
            # drivers before 535 only have the old name; not a missing feature, no warning
            v = self._call("nvmlDeviceGetCurrentClocksThrottleReasons", st.handle)
        out["clocks_event_reasons"] = int(v)

    def _r_pcie(self, st: _State, out: Reading) -> None:
        if "pcie_tx_bytes_per_s" in out:
            return
        # NVML_PCIE_UTIL_TX_BYTES = 0, RX = 1; KB/s
        out["pcie_tx_bytes_per_s"] = self._call("nvmlDeviceGetPcieThroughput", st.handle, 0) * 1024.0
        out["pcie_rx_bytes_per_s"] = self._call("nvmlDeviceGetPcieThroughput", st.handle, 1) * 1024.0

    def _r_gpm(self, st: _State, out: Reading) -> None:
        dev = st.device
        parent = st.parent_handle if dev.parent_uuid is not None else st.handle
        if not st.probed:
            support = self._call("nvmlGpmQueryDeviceSupport", parent)
            if not int(support.isSupportedDevice):
                raise NotSupportedError("GPM not supported", code=_ERR_NOT_SUPPORTED,
                                        call="nvmlGpmQueryDeviceSupport")
            st.gpm_prev = self._call("nvmlGpmSampleAlloc")
            st.gpm_cur = self._call("nvmlGpmSampleAlloc")
            st.gpm_req = self._gpm_request()
            st.gpm_layout = _gpm_layout(st.gpm_req)
            self._gpm_sample(st, parent, st.gpm_prev)
            return  # a rate needs two samples: the first reading has none
        self._gpm_sample(st, parent, st.gpm_cur)
        req = st.gpm_req
        _set(req, "sample1", st.gpm_prev)
        _set(req, "sample2", st.gpm_cur)
        self._call("nvmlGpmMetricsGet", req)
        if st.gpm_layout is not None:
            got = st.gpm_layout.unpack_from(req)
            answers: Any = zip(got[0::2], got[1::2])
        else:  # a binding whose request is not a C structure (a double): field by field
            answers = ((_get(m, "nvmlReturn"), _get(m, "value")) for m in _get(req, "metrics"))
        for (col, scale), (ret, raw) in zip(_GPM_COLUMNS, answers):
            if int(ret) != 0:
                continue
            value = float(raw) * scale
            if scale == 0.01:
                if not (0.0 <= value <= 1.005):  # out of range: unknown, not a clipped guess
                    continue
                value = min(value, 1.0)
            elif value < 0.0:
                continue
            out[col] = value
        st.gpm_prev, st.gpm_cur = st.gpm_cur, st.gpm_prev

    def _gpm_sample(self, st: _State, parent: Any, sample: Any) -> None:
        if st.device.parent_uuid is not None and st.device.gi_id is not None:
            self._call("nvmlGpmMigSampleGet", parent, st.device.gi_id, sample)
        else:
            self._call("nvmlGpmSampleGet", parent, sample)

    def _gpm_request(self) -> Any:
        cls = getattr(self._lib, "c_nvmlGpmMetricsGet_t", None)
        if cls is None:
            import pynvml

            cls = pynvml.c_nvmlGpmMetricsGet_t
        req = cls()
        req.version = _GPM_METRICS_GET_VERSION
        # what is asked is the same every tick, and NVML only reads it (metricId and
        # numMetrics are inputs; it writes each metric's nvmlReturn, value and info)
        req.numMetrics = len(GPM_METRICS)
        for k, mid in enumerate(GPM_METRICS):
            req.metrics[k].metricId = mid
        return req


def _gpm_layout(req: Any) -> struct.Struct | None:
    """A :class:`struct.Struct` reading, from a GPM metrics request's own memory, each asked
    metric's ``nvmlReturn`` (int) and ``value`` (double) in order: one unpack per tick
    instead of a ctypes view and two attribute reads per metric. The offsets are the
    binding's own (its ``ctypes`` field descriptors), none written here. None: the request
    is not a C structure laid out so (a pure-Python double)."""
    try:
        kind = type(req)
        entry = type(req.metrics[0])
        top = kind.metrics.offset
        ret, val, size = entry.nvmlReturn, entry.value, ctypes.sizeof(entry)
    except (AttributeError, TypeError, IndexError):
        return None
    if not (ret.size == 4 and val.size == 8 and ret.offset + 4 <= val.offset
            and val.offset + 8 <= size):
        return None
    one = f"{ret.offset}xi{val.offset - ret.offset - 4}xd{size - val.offset - 8}x"
    return struct.Struct(f"={top}x{one * len(GPM_METRICS)}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field_value(v: Any) -> float:
    """The value of an ``nvmlFieldValue_t`` by its ``valueType`` (nvmlValueType_t)."""
    t = int(_get(v, "valueType"))
    u = _get(v, "value")
    if t == 0:
        return float(u.dVal)
    if t == 1:
        return float(u.uiVal)
    if t == 2:
        return float(u.ulVal)
    if t == 3:
        return float(u.ullVal)
    if t == 4:
        return float(u.sllVal)
    if t == 5:
        return float(u.siVal)
    if t == 6:
        return float(u.usVal)
    return float(u.ullVal)


def select_visible(devices: Sequence[Device], spec: str | None) -> tuple[list[Device], list[str]]:
    """The devices a CUDA process would see under ``CUDA_VISIBLE_DEVICES=spec``.

    ``None`` means every device. Entries are integer indices (NVML order, i.e. as with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), ``GPU-<uuid>`` (a unique prefix is enough, as in
    CUDA), ``MIG-<uuid>`` or the older ``MIG-GPU-<uuid>/<gi>/<ci>``. As in CUDA, the list
    ends at the first entry that names no device. A whole GPU brings its MIG instances;
    a MIG instance alone never brings its parent (whose power is shared with other tenants).
    Returns the selection and notes on entries that were ignored.
    """
    if spec is None:
        return list(devices), []
    whole = [d for d in devices if d.parent_uuid is None]
    migs = [d for d in devices if d.parent_uuid is not None]
    chosen: list[Device] = []
    notes: list[str] = []
    for raw in spec.split(","):
        tok = raw.strip()
        if not tok:
            break
        found: list[Device] = []
        if re.fullmatch(r"-?\d+", tok):
            idx = int(tok)
            found = [d for d in whole if d.index == idx] if idx >= 0 else []
        elif tok.startswith("MIG-GPU-"):
            m = re.fullmatch(r"MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)", tok)
            if m:
                found = [d for d in migs
                         if d.parent_uuid is not None and d.parent_uuid.startswith(m.group(1))
                         and d.gi_id == int(m.group(2))]
        elif tok.startswith(("GPU-", "MIG-")):
            pool = whole if tok.startswith("GPU-") else migs
            found = [d for d in pool if d.uuid.lower().startswith(tok.lower())]
            if len(found) > 1:
                notes.append(f"CUDA_VISIBLE_DEVICES entry {tok!r} matches {len(found)} "
                             f"devices; none taken")
                break
        if not found:
            notes.append(f"CUDA_VISIBLE_DEVICES entry {tok!r} names no device: it and the "
                         f"entries after it are ignored, as CUDA does")
            break
        for d in found:
            group = [d] + ([m for m in migs if m.parent_uuid == d.uuid]
                           if d.parent_uuid is None else [])
            chosen.extend(g for g in group if g not in chosen)
    return chosen, notes


def describe_devices(devices: Sequence[Device]) -> Mapping[str, str]:
    """uuid -> a one-line description, for messages."""
    return {
        d.uuid: f"{d.index}: {d.model or '?'}" + (f" MIG {d.mig_profile}" if d.mig_profile else "")
        for d in devices
    }
