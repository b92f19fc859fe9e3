"""The real pynvml binding against the compiled fake libnvidia-ml.so.1 (fakenvml.c).

Same scenarios through both doubles must read the same, so the pure-Python FakeNvml that users
test with stays faithful to what pynvml + a C library return.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpuaudit.measure.live.fake_nvml import SCENARIO_ENV, FakeNvml, build_fake_library
from gpuaudit.measure.live.nvml import _FIELDS_KEY, GpuLostError, NvmlBackend, load_library
from gpuaudit.measure.live.sampler import Sampler

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (scripts/test "
                                "installs it) to build the fake libnvidia-ml")


@pytest.fixture(scope="module")
def fakelib(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    lib = build_fake_library(tmp_path_factory.mktemp("fakenvml"))
    load_library(lib)
    yield lib
    with pynvml.libLoadLock:  # leave pynvml as we found it
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()


def _scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict) -> None:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv(SCENARIO_ENV, str(path))


PARITY = {
    "driver_version": "535.104.05",
    "missing": ["nvmlDeviceGetTotalEccErrors"],
    "gpus": [
        {"name": "NVIDIA H200", "gpm": True, "memory_total_mib": 143771,
         "pattern": {"kind": "constant", "value": 63}, "power_limit_w": 700, "ecc_dbe": 2},
        {"name": "NVIDIA A100-SXM4-40GB", "not_supported": ["fields", "temperature"],
         "pattern": {"kind": "constant", "value": 0}},
        {"name": "NVIDIA A100-SXM4-80GB", "gpm": True,
         "mig": [{"profile": "3g.40gb", "pattern": {"kind": "constant", "value": 30}},
                 {"profile": "4g.40gb", "gi": 5}]},
    ],
}
_EXACT = ("util_gpu_pct", "util_mem_pct", "mem_total_mib", "power_w", "power_limit_w",
          "temp_c", "sm_clock_mhz", "clocks_event_reasons", "ecc_dbe_total", "sm_active",
          "tensor_active", "gr_engine_active", "pcie_tx_bytes_per_s")


def test_c_library_and_python_fake_agree(fakelib: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _scenario(tmp_path, monkeypatch, PARITY)
    real = NvmlBackend(visible=None)  # the real pynvml module
    devs_c = real.open()
    fake = FakeNvml.backend(PARITY)
    devs_py = fake.open()
    assert devs_c == devs_py
    assert real.driver_version == "535.104.05"
    for _ in range(2):  # the second reading has GPM rates
        for dc, dp in zip(devs_c, devs_py):
            rc, rp = real.read(dc), fake.read(dp)
            assert set(rc) == set(rp), dc.uuid
            for col in _EXACT:
                if col in rp:
                    assert rc[col] == pytest.approx(rp[col]), (dc.uuid, col)
    # GPU 1 has no field API, so its ECC falls back to the missing single call: one warning
    assert real.warnings == fake.warnings
    assert len(real.warnings) == 1 and "nvmlDeviceGetTotalEccErrors" in real.warnings[0]
    real.close()
    fake.close()


def test_real_binding_function_not_found_and_not_supported(
        fakelib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _scenario(tmp_path, monkeypatch, {"missing": ["nvmlGpmQueryDeviceSupport"], "gpus": [
        {"gpm": True, "not_supported": ["utilization"]}]})
    b = NvmlBackend(visible=None)
    dev = b.open()[0]
    r1, r2 = b.read(dev), b.read(dev)
    assert "util_gpu_pct" not in r2 and "sm_active" not in r2
    assert r1["power_w"] > 0
    assert len(b.warnings) == 1 and "nvmlGpmQueryDeviceSupport" in b.warnings[0]
    b.close()


def test_lost_gpu_through_real_binding_is_an_event(
        fakelib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _scenario(tmp_path, monkeypatch, {"gpus": [
        {"pattern": {"kind": "square", "period_s": 0.05}},
        {"lost_at_s": 0.15}]})
    s = Sampler(NvmlBackend(visible=None), interval_s=0.01, flush_s=0.05)
    s.start()
    lost_uuid = s.devices[1].uuid
    deadline = 0
    import time
    while not s.extras.events and deadline < 300:
        time.sleep(0.01)
        deadline += 1
    time.sleep(0.1)
    rec = s.stop()
    assert any("lost" in e and lost_uuid in e for e in rec.events)
    per = rec.table.group_by("gpu_uuid").aggregate([("ts", "count"), ("ts", "max")])
    counts = dict(zip(per.column("gpu_uuid").cast("string").to_pylist(),
                      per.column("ts_count").to_pylist()))
    assert counts[s.devices[0].uuid] > counts.get(lost_uuid, 0)  # the other GPU kept going


def test_gpu_lost_error_class(fakelib: Path, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    _scenario(tmp_path, monkeypatch, {"gpus": [{"lost_at_s": 0.0}]})
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetUtilizationRates(h)
    finally:
        pynvml.nvmlShutdown()
    assert GpuLostError  # the backend maps this class (see test_nvml_backend)


def test_the_field_values_request_built_once_reads_as_pynvml_s_own_call(
        fakelib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the probe the field values are read through one array built at the probe
    (issue 27: pynvml's wrapper builds it per call, an exception per field id). Every tick
    reads what pynvml's own call reads, and a GPU lost in that call is a lost GPU."""
    _scenario(tmp_path, monkeypatch, {"gpus": [
        {"pattern": {"kind": "square", "period_s": 0.02}, "ecc_dbe": 3},
        {"not_supported": ["utilization", "memory", "power_instant"], "lost_at_s": 0.3}]})
    b = NvmlBackend(visible=None)
    devices = b.open()
    try:
        for d in devices:
            b.read(d)  # the probe
        states = [b._states[d.uuid] for d in devices]
        assert all(st.prepared.get(_FIELDS_KEY) is not None for st in states)
        for _ in range(20):
            for d, st in zip(devices, states):
                ours = [(v.fieldId, v.nvmlReturn, v.valueType, v.value.ullVal)
                        for v in st.prepared[_FIELDS_KEY]()]
                theirs = [(v.fieldId, v.nvmlReturn, v.valueType, v.value.ullVal) for v in
                          pynvml.nvmlDeviceGetFieldValues(st.handle, list(st.fields))]
                # (power moves with time: the fields and their codes and types are equal,
                # and energy/ECC, whose values are whole counters here, within a tick)
                assert [x[:3] for x in ours] == [x[:3] for x in theirs]
                assert b.read(d)["ecc_dbe_total" if d is devices[0] else "energy_j"] >= 0
        import time
        time.sleep(0.35)
        with pytest.raises(GpuLostError) as e:
            b.read(devices[1])  # utilization and memory disabled: the field call is first
        assert e.value.call == "nvmlDeviceGetFieldValues"
    finally:
        b.close()


def test_the_getters_prepared_after_the_probe_read_as_pynvml_s_wrappers(
        fakelib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the second reading on, the tick's getters run through the binding's function
    pointers with their outputs built once; each gives what pynvml's wrapper gives."""
    _scenario(tmp_path, monkeypatch, {"gpus": [
        {"pattern": {"kind": "constant", "value": 41}, "power_limit_w": 350,
         "memory_total_mib": 81559}]})
    b = NvmlBackend(visible=None)
    (d,) = b.open()
    try:
        def steady(reading: dict) -> dict:  # (the energy counter runs on)
            return {k: v for k, v in reading.items() if k != "energy_j"}

        first = steady(b.read(d))  # the probe
        assert steady(b.read(d)) == first  # (constant scenario) prepared during this one
        st = b._states[d.uuid]
        assert st.prepared and all(fn is not None for fn in st.prepared.values())
        assert {k[0] for k in st.prepared} == {
            "nvmlDeviceGetFieldValues", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTemperature",
            "nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons"}
        getters = {k: fn for k, fn in st.prepared.items() if k != _FIELDS_KEY}
        for (name, *inputs), fn in getters.items():
            ours, theirs = fn(), getattr(pynvml, name)(st.handle, *inputs)
            if hasattr(theirs, "_fields_"):
                ours = [getattr(ours, f[0]) for f in theirs._fields_]
                theirs = [getattr(theirs, f[0]) for f in theirs._fields_]
            assert ours == theirs, name
        assert steady(b.read(d)) == first  # and the reading they make is the wrappers' one
    finally:
        b.close()
