"""CPU beside the GPU (issue 21): the host's and the workload's CPU busy share per GPU, over
the whole run and over the GPU's idle and busy seconds apart, equal the means counted by hand
whatever the batch size and however the file is cut into row-group ranges; the idle and busy
means weighted by their seconds recombine to the overall mean; the timeline carries them."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from coretables import series_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.classify import classify, parallel
from gpuaudit.errors import SampleTableError
from gpuaudit.measure.files import open_samples
from gpuaudit.measure.parquet_io import write_recording
from gpuaudit.schema import Recording, build_table, validate

_CPU = st.one_of(st.none(), st.floats(0.0, 100.0, allow_nan=False, width=32))


@st.composite
def runs(draw: st.DrawFn) -> tuple[dict[str, list[float]], dict[str, dict[str, list[object]]]]:
    util: dict[str, list[float]] = {}
    host: dict[str, list[object]] = {}
    proc: dict[str, list[object]] = {}
    for g in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 40))
        uuid = f"GPU-{g}"
        util[uuid] = draw(st.lists(st.sampled_from([0.0, 5.0, 9.9, 10.0, 50.0, 95.0]),
                                   min_size=n, max_size=n))
        host[uuid] = draw(st.lists(_CPU, min_size=n, max_size=n))
        proc[uuid] = draw(st.lists(_CPU, min_size=n, max_size=n))
    return util, {"host_cpu_util_pct": host, "proc_cpu_util_pct": proc}


def _mean(vals: list[object], keep: list[bool]) -> tuple[float | None, float]:
    """Mean of the measured values where ``keep`` (each row stands 1 s) and its seconds."""
    xs = [float(np.float32(v)) for v, k in zip(vals, keep) if k and v is not None]  # type: ignore[arg-type]
    return (sum(xs) / len(xs) if xs else None), float(len(xs))


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.integers(1, 7), st.integers(1, 4), st.sampled_from([3, 1 << 20]))
def test_cpu_means_equal_the_hand_count_and_recombine(data, rows_per_group, parts, batch_rows):
    util, extra = data
    table = series_table(util, interval_s=1.0, extra=extra)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.parquet"
        write_recording(Recording(table=table, source="test", origin="test", interval_s=1.0),
                        path, row_group_rows=rows_per_group)
        old = parallel._start
        parallel._start = lambda *a, **k: None  # ranges stitched in this process
        try:
            usage = classify(open_samples(path, batch_rows=batch_rows), workers=parts)
        finally:
            parallel._start = old
    for s in usage.series:
        u = util[s.gpu_uuid]
        everywhere = [True] * len(u)
        idle = [x < 10 for x in u]
        busy = [x >= 10 for x in u]
        for col in ("host_cpu_util_pct", "proc_cpu_util_pct"):
            vals = extra[col][s.gpu_uuid]
            whole, t_all = _mean(vals, everywhere)
            m_idle, t_idle = _mean(vals, idle)
            m_busy, t_busy = _mean(vals, busy)
            assert _close(getattr(s, col), whole), (col, getattr(s, col), whole)
            assert _close(getattr(s, f"{col}_while_idle"), m_idle), col
            assert _close(getattr(s, f"{col}_while_busy"), m_busy), col
            # the idle and busy means weighted by their seconds recombine to the whole
            got = getattr(s, col)
            if got is None:
                assert getattr(s, f"{col}_while_idle") is None
                assert getattr(s, f"{col}_while_busy") is None
                continue
            parts_sum = ((getattr(s, f"{col}_while_idle") or 0.0) * t_idle
                         + (getattr(s, f"{col}_while_busy") or 0.0) * t_busy)
            assert parts_sum / (t_idle + t_busy) == pytest.approx(got, rel=1e-9, abs=1e-9)
            assert t_idle + t_busy == t_all


def test_gpu_idle_while_the_host_is_busy_shows_on_series_and_timeline() -> None:
    # a host step: 3 s of GPU idle with the CPUs at 95 %, 5 s busy with them at 20 %
    util = ([95.0] * 5 + [0.0] * 3) * 20
    host = ([20.0] * 5 + [95.0] * 3) * 20
    proc = ([12.0] * 5 + [90.0] * 3) * 20
    table = series_table({"g": util, "quiet": [95.0] * len(util)},
                         extra={"host_cpu_util_pct": {"g": host, "quiet": [None] * len(util)},
                                "proc_cpu_util_pct": {"g": proc, "quiet": [None] * len(util)}})
    usage = classify(Recording(table=table, source="test", origin="test", interval_s=1.0))
    by = {s.gpu_uuid: s for s in usage.series}
    g = by["g"]
    assert g.host_cpu_util_pct_while_idle == pytest.approx(95.0)
    assert g.host_cpu_util_pct_while_busy == pytest.approx(20.0)
    assert g.host_cpu_util_pct == pytest.approx((5 * 20 + 3 * 95) / 8)
    assert g.proc_cpu_util_pct_while_idle == pytest.approx(90.0)
    q = by["quiet"]  # never measured: None, never 0
    assert q.host_cpu_util_pct is None and q.host_cpu_util_pct_while_idle is None
    assert q.proc_cpu_util_pct is None
    tl = usage.timeline
    assert tl is not None
    row = tl.gpu_uuids.index("g")
    for name in ("host_cpu_util_pct", "proc_cpu_util_pct", "host_cpu_util_pct_while_idle",
                 "host_cpu_util_pct_while_busy"):
        assert name in tl.signals
    idle_b = tl.signals["host_cpu_util_pct_while_idle"][row]
    assert np.nanmin(idle_b) == pytest.approx(95.0) and np.nanmax(idle_b) == pytest.approx(95.0)
    whole = tl.signals["host_cpu_util_pct"][row]
    w = tl.observed_s[row]
    assert float(np.nansum(whole * w) / w[~np.isnan(whole)].sum()) == pytest.approx(
        g.host_cpu_util_pct)
    assert np.isnan(tl.signals["host_cpu_util_pct"][tl.gpu_uuids.index("quiet")]).all()


@pytest.mark.parametrize("col", ["host_cpu_util_pct", "proc_cpu_util_pct"])
@pytest.mark.parametrize("value", [-1.0, 100.5, 250.0])
def test_cpu_out_of_range_is_refused_by_name(col: str, value: float) -> None:
    table = build_table({
        "ts": pa.array([1, 2], pa.int64()).cast(pa.timestamp("ns", "UTC")),
        "host": ["h", "h"], "gpu_uuid": ["g", "g"], col: [50.0, value]})
    with pytest.raises(SampleTableError, match=col) as exc:
        validate(table, source="t.csv")
    assert exc.value.fix


def test_an_older_recording_without_cpu_columns_still_reads(tmp_path: Path) -> None:
    table = series_table({"g": [50.0, 60.0, 0.0]})
    old = table.drop_columns(["host_cpu_util_pct", "proc_cpu_util_pct"])
    import pyarrow.parquet as pq

    pq.write_table(old.replace_schema_metadata({b"gpuaudit.version": b"0.9",
                                                b"gpuaudit.source": b"nvml",
                                                b"gpuaudit.origin": b"an older run",
                                                b"gpuaudit.interval_s": b"1"}),
                   tmp_path / "old.parquet")
    src = open_samples(tmp_path / "old.parquet")
    batches = list(src.batches())
    assert src.origin == "an older run" and src.source == "nvml"
    got = pa.Table.from_batches(batches)
    assert got.column("host_cpu_util_pct").null_count == 3
    assert classify(open_samples(tmp_path / "old.parquet")).series[0].host_cpu_util_pct is None


def test_reports_show_the_cpu_where_measured() -> None:
    from gpuaudit.api import audit
    from gpuaudit.report.json import to_dict
    from gpuaudit.report.terminal import render_terminal

    util = ([95.0] * 5 + [0.0] * 3) * 10
    host = ([20.0] * 5 + [95.0] * 3) * 10
    table = series_table({"g": util, "h": util},
                         extra={"host_cpu_util_pct": {"g": host, "h": [None] * len(util)},
                                "proc_cpu_util_pct": {"g": host, "h": [None] * len(util)}})
    r = audit(Recording(table=table, source="test", origin="test", interval_s=1.0),
              price="2.00")
    gpus = {g["gpu_uuid"]: g for g in to_dict(r)["gpus"]}
    assert gpus["g"]["cpu"]["host_cpu_util_pct_while_idle"] == pytest.approx(95.0)
    assert gpus["g"]["cpu"]["host_cpu_util_pct_while_busy"] == pytest.approx(20.0)
    assert gpus["h"]["cpu"] is None  # not measured: null, never 0
    text = render_terminal(r, width=160)
    assert "CPU beside the GPUs" in text and "95% while this GPU idles" in text
