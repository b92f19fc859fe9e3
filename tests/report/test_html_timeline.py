"""The timeline the HTML report and terminal sparklines draw: properties of classify/timeline."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.classify import classify
from gpuaudit.classify.timeline import resample_mean, timeline_for
from gpuaudit.report.progress import progress
from gpuaudit.schema import Recording, build_table


def _table(utils: list[list[float | None]], gaps: list[int]) -> pa.Table:
    ts, uuid, u = [], [], []
    for g, series in enumerate(utils):
        t = 0
        for i, v in enumerate(series):
            t += 1 + (gaps[i % len(gaps)] if gaps else 0)
            ts.append(t * 1_000_000_000)
            uuid.append(f"GPU-{g}")
            u.append(v)
    order = np.argsort(np.array(ts), kind="stable")
    return build_table({
        "ts": pa.array(np.array(ts)[order], pa.timestamp("ns", tz="UTC")),
        "host": ["h"] * len(ts),
        "gpu_uuid": [uuid[i] for i in order],
        "util_gpu_pct": pa.array([u[i] for i in order], pa.float32()),
    })


series = st.lists(st.one_of(st.none(), st.floats(0, 100, width=32)), min_size=1, max_size=60)


@settings(max_examples=40, deadline=None)
@given(st.lists(series, min_size=1, max_size=3), st.lists(st.integers(0, 5), max_size=4),
       st.integers(1, 50), st.integers(1, 7))
def test_timeline_agrees_with_the_phase_engine(utils: list[list[float | None]],
                                               gaps: list[int], buckets: int,
                                               chunk: int) -> None:
    table = _table(utils, gaps)
    usage = classify(Recording(table=table, source="t", origin="t", interval_s=1.0))
    # any batching of the stream gives the same timeline
    whole = timeline_for(Recording(table=table, source="t", origin="t", interval_s=1.0), usage,
                         max_buckets=buckets)
    chunked = Recording(table=pa.Table.from_batches(table.to_batches(max_chunksize=chunk)),
                        source="t", origin="t", interval_s=1.0)
    parts = timeline_for(chunked, usage, max_buckets=buckets)
    assert whole is not None and parts is not None
    assert np.allclose(whole.hist_s, parts.hist_s)
    assert np.array_equal(np.isnan(whole.util_pct), np.isnan(parts.util_pct))
    # the histogram holds exactly the observed time the phase engine counted
    assert abs(whole.hist_s.sum() - usage.overall().observed_s) < 1e-6
    assert whole.buckets <= buckets
    u = whole.util_pct[~np.isnan(whole.util_pct)]
    assert ((u >= 0) & (u <= 100 + 1e-4)).all()
    assert ((whole.phase >= 0) == ~np.isnan(whole.util_pct)).all()
    d = whole.to_dict()
    assert len(d["gpus"]) == len(utils) and all(len(g["util_pct"]) == d["buckets"]
                                                for g in d["gpus"])


@given(st.lists(st.one_of(st.none(), st.floats(0, 100)), max_size=300), st.integers(1, 80))
def test_resample_mean_keeps_range_and_length(values: list[float | None], n: int) -> None:
    out = resample_mean(values, n)
    assert len(out) == min(len(values), n)
    real = [v for v in values if v is not None]
    for v in out:
        assert v is None or (min(real) - 1e-9 <= v <= max(real) + 1e-9)


def test_terminal_report_draws_sparklines() -> None:
    from test_html_report import synthetic_table

    from gpuaudit.api import audit

    text = audit(synthetic_table(600), price="1").render("terminal")
    assert "Utilization over time" in text
    lines = [ln for ln in text.splitlines() if "GPU-0001" in ln and "█" in ln]
    assert lines and "▁" in lines[0]  # the bursty GPU bounces between idle and busy


def test_progress_is_silent_off_a_tty_and_draws_when_forced() -> None:
    quiet = io.StringIO()
    with progress("x", total=3, stream=quiet) as advance:
        advance(3)
    assert quiet.getvalue() == ""
    loud = io.StringIO()
    with progress("importing", total=10, stream=loud, force=True) as advance:
        advance(10)
    assert "importing" in loud.getvalue()
