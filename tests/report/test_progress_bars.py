"""The Prometheus client's progress hook is drawn by the report layer, on stderr."""

from __future__ import annotations

from gpuaudit.report.progress import progress_bars


def test_bars_count_what_each_query_reports(capsys):
    hook, stop = progress_bars()
    first = hook("query_range DCGM_FI_DEV_GPU_UTIL", 3)
    second = hook("pushdown phases", 2)
    first(2)
    second(1)
    first(1)
    stop()
    err = capsys.readouterr().err
    assert "query_range DCGM_FI_DEV_GPU_UTIL" in err and "3/3" in err
    assert "pushdown phases" in err and "1/2" in err
