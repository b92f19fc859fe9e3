"""A saved dcgm-exporter page (`curl :9400/metrics > node.prom`) given to `gpuaudit report` is
read with scrape's parser, one sample per GPU (issue 26 part 3); another Prometheus page is a
clear error naming `gpuaudit scrape`. The pages are real captures (tests/data/dcgm/README.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuaudit.measure.files.reader import open_samples

DATA = Path(__file__).parents[1] / "data" / "dcgm"


def _gpus_on_page(text: str) -> set[str]:
    return set(re.findall(r'^DCGM_FI_DEV_GPU_UTIL\{[^}]*UUID="([^"]+)"', text, re.MULTILINE))


@pytest.mark.parametrize("name", ["l4_kops_conformance.prom", "l40s_upcloud_conformance.prom",
                                  "grid_a100_40c_vks_conformance.prom"])
def test_report_reads_a_saved_dcgm_page(name: str) -> None:
    page = DATA / name
    p = subprocess.run([sys.executable, "-m", "gpuaudit.cli", "report", str(page), "--format",
                        "json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    uuids = {g["gpu_uuid"] for g in doc["gpus"]}
    assert uuids == _gpus_on_page(page.read_text())  # every GPU on the page, no other
    notes = " ".join(n["reason"] for n in doc["source"]["notes"])
    assert "one dcgm-exporter page is a snapshot: one sample per GPU" in notes
    assert "gpuaudit scrape" in notes
    assert "/gpuaudit-" not in p.stdout  # notes name the page, not a scratch copy
    for n in doc["source"]["notes"]:
        assert n.get("where") is None or str(page) in n["where"], n


def test_one_sample_per_gpu_with_the_page_values() -> None:
    page = DATA / "l4_kops_conformance.prom"
    table = open_samples(page).to_recording().table
    util = re.search(r'^DCGM_FI_DEV_GPU_UTIL\{[^}]*\} (\S+)$', page.read_text(), re.MULTILINE)
    assert util is not None
    assert table.num_rows == 1
    assert table.column("util_gpu_pct")[0].as_py() == float(util.group(1))
    assert table.column("gpu_model")[0].as_py() == "NVIDIA L4"


def test_a_prometheus_page_without_dcgm_series_says_what_to_do(tmp_path: Path) -> None:
    page = tmp_path / "node.prom"
    page.write_text("# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\n"
                    "node_load1 0.42\n")
    p = subprocess.run([sys.executable, "-m", "gpuaudit.cli", "report", str(page)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert p.stderr.startswith("error:") and "Traceback" not in p.stderr
    assert "no DCGM_FI_* metric" in p.stderr and "gpuaudit scrape" in p.stderr
    assert str(page) in p.stderr  # the page, not a scratch copy of it


def test_a_gzipped_page_is_read(tmp_path: Path) -> None:
    import gzip

    page = tmp_path / "node.prom.gz"
    page.write_bytes(gzip.compress((DATA / "l4_kops_conformance.prom").read_bytes()))
    table = open_samples(page).to_recording().table
    assert table.num_rows == 1 and table.column("gpu_model")[0].as_py() == "NVIDIA L4"
