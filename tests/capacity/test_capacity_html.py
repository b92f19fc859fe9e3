"""The capacity report's HTML in real headless Chromium: it parses, the tables are there, and
workload names stay text (escaped), never markup."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from gpuaudit.cli import main
from gpuaudit.schema import build_table

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--mute-audio"]
pytestmark = pytest.mark.slow


def _dom(path: Path) -> str:
    profile = tempfile.mkdtemp(prefix="gpuaudit-chromium-")
    try:
        out = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                              path.as_uri()], capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_simulate_html_in_chromium(tmp_path: Path):
    import pyarrow as pa

    n, steps = 4, 30
    ts = (1_704_067_200 + np.repeat(np.arange(steps), n) * 60) * 1_000_000_000
    evil = "<img src=x onerror=alert(1)>"
    table = build_table({
        "ts": pa.array(ts, pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
        "host": ["h"] * (n * steps), "gpu_uuid": [f"GPU-{g}" for g in range(n)] * steps,
        "gpu_model": ["NVIDIA H100 80GB HBM3"] * (n * steps),
        "util_gpu_pct": pa.array(np.full(n * steps, 8.0), pa.float32()),
        "mem_used_mib": pa.array(np.full(n * steps, 3000.0), pa.float32()),
        "namespace": [evil, "b", "b", "c"] * steps,
    })
    src = tmp_path / "f.parquet"
    pq.write_table(table, src)
    html = tmp_path / "s.html"
    assert main(["simulate", str(src), "--gpu-model", "H100", "--by", "namespace",
                 "--format", "html", "-o", str(html)]) == 0
    dom = _dom(html)
    assert "<h2>Consolidation simulation</h2>" in dom
    assert dom.count("<table>") >= 2
    assert "<img" not in dom and "&lt;img src=x onerror=alert(1)&gt;" in dom
