"""dcgm-exporter /metrics text into the sample table, on the real captures."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from gpuaudit.errors import InputError
from gpuaudit.measure.fleet.dcgm import parse_metrics_text

DCGM = Path(__file__).parents[1] / "data" / "dcgm"
TS = 1_700_000_000_000_000_000


def parse(text: str, host: str = "node"):
    return parse_metrics_text(text, ts_ns=TS, default_host=host, where="test")


def read(name: str) -> str:
    return (DCGM / name).read_text()


def test_l4_units_identity_and_unused_metrics_noted():
    table, notes = parse(read("l4_kops_conformance.prom"))
    row = table.to_pylist()[0]
    assert table.num_rows == 1
    assert row["host"] == "i-030791dc5a37cd257"
    assert row["gpu_uuid"] == "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
    assert row["gpu_model"] == "NVIDIA L4"
    assert row["energy_j"] == pytest.approx(4742776 / 1000)  # mJ counter -> J
    assert row["mem_total_mib"] == 22563 + 0 + 470  # free + used + reserved
    assert row["util_gpu_pct"] == 0.0 and row["gr_engine_active"] == 0.0
    assert row["pod"] is None and row["gpu_share"] is None
    assert any("DCGM_FI_DEV_ENC_UTIL" in n.reason for n in notes)


def test_mig_instances_get_their_own_series_and_no_gpu_util():
    table, _ = parse(read("a100_mig_1g5gb_nvidia_docs.prom"))
    rows = {r["gpu_uuid"]: r for r in table.to_pylist()}
    parent = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"
    mig = rows[f"{parent}/gi13"]
    assert mig["mig_profile"] == "1g.5gb"
    assert mig["util_gpu_pct"] is None
    assert mig["gr_engine_active"] == pytest.approx(0.995687, rel=1e-6)
    assert rows[parent]["mig_profile"] is None


def test_old_exporter_blank_pod_and_sentinel():
    table, notes = parse(read("readme_k8s_snippet_old_exporter.prom"), host="fallback")
    row = table.to_pylist()[0]
    assert row["pod"] is None and row["namespace"] is None  # pod="" is "no pod"
    assert row["host"] == "fallback"  # no Hostname label
    assert any("sentinel" in n.reason and n.count == 1 for n in notes)


def test_sentinel_in_a_kept_metric_is_null_and_counted():
    text = read("readme_k8s_snippet_old_exporter.prom").replace(
        "DCGM_FI_DEV_SM_CLOCK{", "DCGM_FI_DEV_GPU_TEMP{").replace(" 139\n",
                                                                  " 9223372036854775794\n")
    table, notes = parse(text)
    assert table.column("temp_c").null_count == 1
    assert sum(n.count for n in notes if "sentinel" in n.reason) >= 1


def test_lowercase_names_exported_pod_and_time_slicing():
    base = read("l40s_upcloud_conformance.prom").replace("Hostname=", "hostname=").replace(
        "UUID=", "uuid=")
    lines = [ln for ln in base.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    a = lines[0].replace("}", ',exported_pod="a",exported_namespace="ns",pod="exp",'
                         'namespace="gpu-operator"}')
    b = lines[0].replace("}", ',exported_pod="b",exported_namespace="ns",pod="exp",'
                         'namespace="gpu-operator"}')
    table, _ = parse(a + "\n" + b + "\n")
    assert table.num_rows == 2
    assert sorted(table.column("pod").to_pylist()) == ["a", "b"]
    assert set(table.column("host").to_pylist()) == {"gpu1-wl8sg"}
    assert pc.sum(table.column("gpu_share")).as_py() == pytest.approx(1.0)


def test_unheld_gpu_with_exporter_pod_labels_is_not_a_workload():
    line = next(ln for ln in read("l4_kops_conformance.prom").splitlines()
            if ln.startswith("DCGM_FI_DEV_GPU_UTIL{"))
    line = line.replace("}", ',pod="nvidia-dcgm-exporter-x1",container="nvidia-dcgm-exporter"}')
    table, _ = parse(line + "\n")
    assert table.column("pod").to_pylist() == [None]


def test_unknown_metric_names_are_listed_not_fatal():
    text = read("l4_kops_conformance.prom") + 'my_custom_metric{UUID="x"} 3\n'
    table, notes = parse(text)
    assert table.num_rows == 1
    assert any("my_custom_metric" in n.reason for n in notes)


def test_series_without_uuid_is_an_error_naming_the_metric():
    with pytest.raises(InputError, match="DCGM_FI_DEV_GPU_UTIL"):
        parse('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 5\n')


@pytest.mark.parametrize(("metric", "column", "bad"), [
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "clocks_event_reasons", "-5"),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "clocks_event_reasons", "4.5"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_dbe_total", "-1"),
    ("DCGM_FI_DEV_XID_ERRORS", "xid", "43.25"),
])
def test_a_bitmask_counter_or_code_that_is_not_whole_is_null_and_counted(
        metric: str, column: str, bad: str) -> None:
    """A negative or fractional reading (a recording rule's average, a bad relabel) of an
    integer column: nulled with a note naming the column, never truncated, wrapped or a
    crash (a negative bitmask made the uint64 cast fail)."""
    rows = [f'{metric}{{gpu="{i}",UUID="GPU-{i}",modelName="NVIDIA H100"}} {v}'
            for i, v in enumerate(["8", bad, "0"])]
    table, notes = parse("\n".join(rows) + "\n")
    got = {r["gpu_uuid"]: r[column] for r in table.to_pylist()}
    assert got["GPU-1"] is None
    assert got["GPU-0"] == 8
    assert got["GPU-2"] == (None if column == "xid" else 0)  # XID 0 is "no error"
    note = [n for n in notes if "not a whole number" in n.reason]
    assert len(note) == 1 and note[0].count == 1 and note[0].column == column
    assert note[0].where == f"test: {column}"
