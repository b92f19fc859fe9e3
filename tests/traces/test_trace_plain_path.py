"""`gpuaudit trace` classifies the trace's own columns, without an Arrow recording (issue 27).

The report must equal the one the sample-table path gives (the trace written into a
Recording and audited), on every real trace and in every format; classify's plain-column
path must equal its Arrow path on any series (hypothesis), lags and timeline included; and
the command must load neither pyarrow nor pandas.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.api.audit import audit
from gpuaudit.api.compose import Report
from gpuaudit.api.trace import trace, trace_extra
from gpuaudit.classify import classify
from gpuaudit.classify.columns import SeriesColumns, classify_columns
from gpuaudit.classify.usage import CellColumns, Usage, arrow_cells
from gpuaudit.schema import Recording, build_table

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
REAL = ["a100_1rank_ddp_nccl.json.gz", "v100_1rank_ns_resolution.json.gz", "two_ranks",
        "mi250_rocm_minitoy.json.gz"]
NS = 1_000_000_000


def _arrow_path(path: Path, hta_compat: bool, **pricing: Any) -> Report:
    rec, extra, evidence = trace_extra([path], hta_compat=hta_compat)
    return audit(rec, findings=evidence, extra={"trace": extra}, **pricing)


def _doc(r: Report) -> dict[str, Any]:
    d = r.to_dict()
    d.pop("generated_at")
    return d


@pytest.mark.parametrize("hta_compat", [False, True])
@pytest.mark.parametrize("name", REAL)
def test_report_equals_the_recordings_on_every_real_trace(name: str, hta_compat: bool) -> None:
    path = DATA / name
    plain = trace(path, hta_compat=hta_compat, price="2.5")
    arrow = _arrow_path(path, hta_compat, price="2.5")
    assert isinstance(plain.usage.cells, CellColumns)
    assert _doc(plain) == _doc(arrow)
    for fmt in ("terminal", "markdown", "html"):
        a, b = plain.render(fmt), arrow.render(fmt)
        if fmt == "html":  # its footer states when it was written
            a, b = (x.replace(x[x.find("generated"):x.find("generated") + 60], "")
                    for x in (a, b))
        assert a == b, fmt
    _same_usage(plain.usage, arrow.usage)


def test_report_without_a_price_uses_the_traces_gpu_model() -> None:
    path = DATA / "a100_1rank_ddp_nccl.json.gz"
    assert _doc(trace(path, hta_compat=True)) == _doc(_arrow_path(path, True))


def _same_usage(plain: Usage, arrow: Usage) -> None:
    """Every field of the two usages equal (cells as tables, timelines array by array)."""
    assert arrow_cells(plain.cells).equals(arrow.cells.select(arrow_cells(plain.cells)
                                                              .column_names))
    for f in ("by", "series", "patterns", "window_start", "window_end", "interval_s", "cap_s",
              "source", "origin", "notes", "events", "findings", "job_patterns",
              "onset_lags"):
        assert getattr(plain, f) == getattr(arrow, f), f
    assert (plain.timeline is None) == (arrow.timeline is None)
    if plain.timeline is not None and arrow.timeline is not None:
        assert plain.timeline.to_dict() == arrow.timeline.to_dict()
        for f in ("util_pct", "phase", "observed_s", "hist_s", "phase_s"):
            np.testing.assert_array_equal(getattr(plain.timeline, f),
                                          getattr(arrow.timeline, f), err_msg=f)
    assert plain.overall() == arrow.overall()
    assert plain.per_gpu() == arrow.per_gpu()


def test_trace_command_loads_neither_pyarrow_nor_pandas(tmp_path: Path) -> None:
    """The module set of `gpuaudit trace FILE --hta-compat` (as HTA is compared with): numpy
    (the loader's columns), msgspec (its parser) and rich (the terminal report), nothing of
    Arrow, pandas or DuckDB."""
    out = tmp_path / "r.txt"
    code = ("import sys, json\nfrom gpuaudit.cli import run_argv\n"
            f"rc = run_argv(['trace', {str(DATA / 'v100_1rank_ns_resolution.json.gz')!r}, "
            f"'--hta-compat', '-o', {str(out)!r}])\n"
            "print(json.dumps([rc, sorted({m.split('.')[0] for m in sys.modules})]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    rc, mods = json.loads(p.stdout.strip().splitlines()[-1])
    assert rc == 0, p.stderr
    heavy = {"pyarrow", "pandas", "duckdb", "httpx", "pynvml", "prometheus_client", "scipy"}
    assert not heavy & set(mods), sorted(heavy & set(mods))
    assert {"numpy", "msgspec", "rich"} <= set(mods)
    assert "Profiler trace" in out.read_text()


def test_json_trace_report_renders_without_rich(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = ("import sys, json\nfrom gpuaudit.cli import run_argv\n"
            f"rc = run_argv(['trace', {str(DATA / 'two_ranks')!r}, '--price', '3', "
            f"'--format', 'json', '-o', {str(out)!r}])\n"
            "print(json.dumps([rc, sorted({m.split('.')[0] for m in sys.modules})]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    rc, mods = json.loads(p.stdout.strip().splitlines()[-1])
    assert rc == 0, p.stderr
    assert not {"pyarrow", "pandas", "rich"} & set(mods)
    assert json.loads(out.read_text())["extra"]["trace"]["kind"] == "kineto"


# -- classify's plain-column path equals its Arrow path on any series ------------------------

@st.composite
def _series(draw: st.DrawFn) -> tuple[list[SeriesColumns], float]:
    interval_s = draw(st.sampled_from([0.05, 0.1, 1.0]))
    n_gpus = draw(st.integers(1, 4))
    same_host = draw(st.booleans())
    out = []
    for g in range(n_gpus):
        n = draw(st.integers(1, 40))
        steps = draw(st.lists(st.integers(1, int(4 * interval_s * NS)), min_size=n,
                              max_size=n))
        t0 = 1_700_000_000 * NS + draw(st.integers(0, 3 * NS))
        ts = t0 + np.cumsum(np.array(steps, dtype=np.int64)) - steps[0]
        util = draw(st.lists(st.one_of(st.sampled_from([0.0, 100.0, 5.0, 50.0, 80.0, 95.0]),
                                       st.floats(0, 100, width=32), st.just(float("nan"))),
                             min_size=n, max_size=n))
        end = draw(st.one_of(st.none(), st.integers(1, int(3 * interval_s * NS))))
        out.append(SeriesColumns(
            gpu_uuid=f"gpu-{g}", host="h1" if same_host else f"h{g}",
            gpu_model=draw(st.sampled_from([None, "NVIDIA H100 80GB HBM3"])),
            mig_profile=None, ts_ns=ts, util_pct=np.array(util, dtype=np.float32),
            end_ns=None if end is None else int(ts[-1]) + end))
    return out, interval_s


def _recording(series: list[SeriesColumns], interval_s: float) -> Recording:
    cols: dict[str, Any] = {
        "ts": pa.array(np.concatenate([s.ts_ns for s in series]),
                       pa.timestamp("ns", tz="UTC")),
        "host": [s.host for s in series for _ in range(s.ts_ns.shape[0])],
        "gpu_uuid": [s.gpu_uuid for s in series for _ in range(s.ts_ns.shape[0])],
        "gpu_model": [s.gpu_model for s in series for _ in range(s.ts_ns.shape[0])],
        "util_gpu_pct": pa.array(np.concatenate([s.util_pct for s in series]),
                                 mask=np.isnan(np.concatenate([s.util_pct for s in series]))),
    }
    return Recording(table=build_table(cols), source="test", origin="plain vs arrow",
                     interval_s=interval_s,
                     series_end_ns={s.gpu_uuid: s.end_ns for s in series
                                    if s.end_ns is not None})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_series())
def test_classify_columns_equals_classify_of_the_same_table(
        drawn: tuple[list[SeriesColumns], float]) -> None:
    series, interval_s = drawn
    plain = classify_columns(series, interval_s=interval_s, source="test",
                             origin="plain vs arrow")
    arrow = classify(_recording(series, interval_s))
    _same_usage(plain, arrow)


def test_a_late_rank_on_one_host_gets_its_onset_lag() -> None:
    """Two GPUs of one job (one host), the second starting each step 30 ms late: the plain
    path measures the same lag as the Arrow path (classify.lag)."""
    period, n = 200_000_000, 60
    t0 = 1_700_000_000 * NS
    series = []
    for g, shift in enumerate((0, 30_000_000)):
        starts = t0 + shift + period * np.arange(n, dtype=np.int64)
        ts = np.stack([starts, starts + 120_000_000], axis=1).ravel()
        util = np.tile(np.array([100.0, 0.0], dtype=np.float32), n)
        series.append(SeriesColumns(f"gpu-{g}", "node-0", None, None, ts, util,
                                    int(ts[-1]) + 80_000_000))
    plain = classify_columns(series, interval_s=0.1, source="test", origin="lag")
    arrow = classify(_recording(series, 0.1))
    assert plain.onset_lags == arrow.onset_lags
    late = {x.gpu_uuid: x for x in plain.onset_lags}["gpu-1"]
    assert late.median_lag_s == pytest.approx(0.03)
