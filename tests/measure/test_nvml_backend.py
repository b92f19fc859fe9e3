"""NvmlBackend against the pure-Python FakeNvml: units, probing, error translation, visibility."""

from __future__ import annotations

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuaudit.errors import SourceUnavailableError
from gpuaudit.measure.live.fake_nvml import FakeNvml, pattern_value
from gpuaudit.measure.live.nvml import (
    Device,
    FunctionNotFoundError,
    GpuLostError,
    NotSupportedError,
    NvmlBackend,
    NvmlError,
    select_visible,
    translate,
)


def _open(scenario: dict, **kw: object) -> tuple[NvmlBackend, list[Device]]:
    b = FakeNvml.backend(scenario, **kw)
    return b, b.open()


def test_units_are_converted_once() -> None:
    b, devs = _open({"gpus": [{"pattern": {"kind": "constant", "value": 50},
                               "power_idle_w": 100, "power_max_w": 500,
                               "memory_total_mib": 1024, "power_limit_w": 450}]})
    r = b.read(devs[0])
    assert r["util_gpu_pct"] == 50.0
    assert r["power_w"] == pytest.approx(300.0)          # mW -> W
    assert r["power_limit_w"] == pytest.approx(450.0)
    assert r["mem_total_mib"] == pytest.approx(1024.0)   # bytes -> MiB
    assert 0 < r["mem_used_mib"] < 1024
    e1 = r["energy_j"]
    r2 = b.read(devs[0])
    assert r2["energy_j"] >= e1                          # mJ counter -> J, monotonic
    b.close()


def test_not_supported_is_null_and_probed_once() -> None:
    fake = FakeNvml({"gpus": [{"not_supported": ["temperature", "power_instant"],
                               "pattern": {"kind": "constant", "value": 10}}]})
    b = NvmlBackend(fake, visible=None)
    dev = b.open()[0]
    first = b.read(dev)
    assert "temp_c" not in first
    assert first["power_w"] == pytest.approx(70 + 630 * 0.1)  # from POWER_AVERAGE instead
    calls = fake.calls
    b.read(dev)
    per_read = fake.calls - calls
    calls = fake.calls
    b.read(dev)
    assert fake.calls - calls == per_read  # the unsupported call is not retried
    assert b.warnings == []


def test_function_not_found_warns_once_and_is_null() -> None:
    b, devs = _open({"gpus": [{}, {}], "missing": ["nvmlDeviceGetEnforcedPowerLimit"]})
    for _ in range(3):
        for d in devs:
            assert "power_limit_w" not in b.read(d)
    assert len(b.warnings) == 1
    assert "nvmlDeviceGetEnforcedPowerLimit" in b.warnings[0]


def test_old_driver_clock_reasons_fall_back_silently() -> None:
    b, devs = _open({"gpus": [{}], "missing": ["nvmlDeviceGetCurrentClocksEventReasons"]})
    assert b.read(devs[0])["clocks_event_reasons"] == 1  # idle bit from the old name
    assert b.warnings == []


def test_gpm_needs_two_samples_and_gives_ratios() -> None:
    b, devs = _open({"gpus": [{"gpm": True, "pattern": {"kind": "constant", "value": 80}}]})
    assert "sm_active" not in b.read(devs[0])
    r = b.read(devs[0])
    assert r["sm_active"] == pytest.approx(0.72)
    assert r["tensor_active"] == pytest.approx(0.48)
    assert r["gr_engine_active"] == pytest.approx(0.8)
    assert r["pcie_rx_bytes_per_s"] == pytest.approx(160 * 1048576)
    for col in ("sm_active", "sm_occupancy", "tensor_active", "dram_active"):
        assert 0.0 <= r[col] <= 1.0


def test_no_gpm_leaves_profiling_columns_null() -> None:
    b, devs = _open({"gpus": [{"gpm": False}]})
    b.read(devs[0])
    assert "sm_active" not in b.read(devs[0])


def test_mig_instances_are_series_of_their_own() -> None:
    b, devs = _open({"gpus": [{"gpm": True, "mig": [
        {"profile": "3g.40gb", "pattern": {"kind": "constant", "value": 40}},
        {"profile": "1g.10gb"}]}]})
    migs = [d for d in devs if d.parent_uuid]
    assert [d.mig_profile for d in migs] == ["3g.40gb", "1g.10gb"]
    assert all(d.uuid.startswith("MIG-") and d.index == 0 for d in migs)
    b.read(migs[0])
    r = b.read(migs[0])
    assert "util_gpu_pct" not in r            # NotSupported on MIG, as on real hardware
    assert r["gr_engine_active"] == pytest.approx(0.4)
    assert r["mem_total_mib"] == pytest.approx(9984)


def test_gpu_lost_raises_gpu_lost() -> None:
    clock = [100.0]
    b = NvmlBackend(FakeNvml({"gpus": [{"lost_at_s": 5.0}]}, clock=lambda: clock[0]),
                    visible=None)
    devs = b.open()
    b.read(devs[0])
    clock[0] += 5.0
    with pytest.raises(GpuLostError) as info:
        b.read(devs[0])
    assert devs[0].uuid in (info.value.where or "")


def test_gpu_lost_before_start_is_skipped_with_a_note() -> None:
    b, devs = _open({"gpus": [{"lost_at_s": 0.0}, {}]})
    assert [d.index for d in devs] == [1]
    assert any("GPU index 0" in n for n in b.notes)


@pytest.mark.parametrize(("scenario", "needle"), [
    ({"missing": ["nvmlInit"]}, "libnvidia-ml.so.1"),
    ({"driver_not_loaded": True}, "Driver Not Loaded"),
    ({"gpus": []}, "no GPU"),
])
def test_unavailable_is_one_clear_error(scenario: dict, needle: str) -> None:
    with pytest.raises(SourceUnavailableError) as info:
        FakeNvml.backend(scenario).open()
    assert needle in str(info.value)
    assert info.value.fix


def test_cuda_visible_devices_empty_hides_all() -> None:
    with pytest.raises(SourceUnavailableError, match="CUDA_VISIBLE_DEVICES"):
        FakeNvml.backend({"gpus": [{}]}, visible="").open()


def test_visible_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    b = NvmlBackend(FakeNvml({"gpus": [{}, {}, {}]}))
    assert [d.index for d in b.open()] == [1]


@pytest.mark.parametrize(("code", "cls"), [
    (pynvml.NVML_ERROR_NOT_SUPPORTED, NotSupportedError),
    (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, FunctionNotFoundError),
    (pynvml.NVML_ERROR_GPU_IS_LOST, GpuLostError),
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, SourceUnavailableError),
    (pynvml.NVML_ERROR_UNKNOWN, NvmlError),
])
def test_translate_maps_codes(code: int, cls: type) -> None:
    err = translate(pynvml.NVMLError(code), "nvmlDeviceGetX")
    assert isinstance(err, cls)


# -- CUDA_VISIBLE_DEVICES --------------------------------------------------------------------
def _fleet(n: int, mig_on: set[int]) -> list[Device]:
    out: list[Device] = []
    for i in range(n):
        uuid = f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}"
        out.append(Device(uuid, i, "X"))
        if i in mig_on:
            for g in (1, 2):
                out.append(Device(f"MIG-{i:04x}{g:04x}-dddd", i, "X", "1g.10gb", uuid, g))
    return out


def test_visible_forms() -> None:
    devs = _fleet(4, {2})
    pick = lambda spec: [d.uuid for d in select_visible(devs, spec)[0]]  # noqa: E731
    assert pick(None) == [d.uuid for d in devs]
    assert pick("3,0") == [devs[5].uuid, devs[0].uuid]
    assert pick("GPU-00000001") == [devs[1].uuid]                 # unique prefix
    assert pick("MIG-00020002-dddd") == [devs[4].uuid]
    assert pick(f"MIG-{devs[2].uuid}/1/0") == [devs[3].uuid]     # old MIG form
    assert pick("2") == [devs[2].uuid, devs[3].uuid, devs[4].uuid]  # GPU brings its MIGs
    sel, notes = select_visible(devs, "0,9,1")                    # CUDA stops at a bad entry
    assert [d.index for d in sel] == [0] and notes


@given(st.integers(1, 6), st.sets(st.integers(0, 5)),
       st.lists(st.integers(-1, 7), max_size=6))
def test_visible_selection_is_a_duplicate_free_subset(n: int, mig: set[int],
                                                      idx: list[int]) -> None:
    devs = _fleet(n, mig)
    sel, _ = select_visible(devs, ",".join(map(str, idx)))
    assert len({d.uuid for d in sel}) == len(sel)
    assert set(sel) <= set(devs)
    valid_prefix = []
    for i in idx:
        if not 0 <= i < n:
            break
        valid_prefix.append(i)
    assert {d.index for d in sel} == set(valid_prefix)


@given(st.floats(0, 1e4, allow_nan=False),
       st.sampled_from(["constant", "square", "sawtooth", "steps"]))
def test_patterns_stay_in_their_range(t: float, kind: str) -> None:
    p = {"kind": kind, "low": 10, "high": 90, "value": 42, "values": [5, 50, 95],
         "period_s": 0.7, "step_s": 0.3}
    v = pattern_value(p, t)
    assert 5 <= v <= 95
