"""What gpuaudit sends to a tracker, without the tracker: the summary of a real recording
(nanoGPT on 8x H100, bundled), the downsampled series (property-tested), the GPU-less tags,
the lazy imports and the message naming a missing extra."""

from __future__ import annotations

import math
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gpuaudit
from gpuaudit.api import audit
from gpuaudit.errors import MissingExtraError
from gpuaudit.integrate.tracker_runs import make_trackers
from gpuaudit.integrate.trackers import (
    PREFIX,
    downsample,
    nothing_sampled,
    require,
    summarize,
)

NANOGPT = Path(gpuaudit.__file__).parent / "data" / "nanogpt_8xh100.parquet"
HEAVY = ("mlflow", "wandb", "torch", "lightning", "pytorch_lightning", "transformers")


@pytest.fixture(scope="module")
def nanogpt() -> tuple[object, pa.Table]:
    table = pq.read_table(NANOGPT)
    return audit(NANOGPT, counts={"tokens": 1e9, "samples": 2e5}), table


def test_summary_of_a_real_recording(nanogpt: tuple[object, pa.Table]) -> None:
    report, table = nanogpt
    s = summarize(report, labels={"team": "nlp"}, samples=table, max_points=300)
    m, total = s.metrics, report.cost.total  # type: ignore[attr-defined]
    assert m[f"{PREFIX}/cost_usd"] == float(total.observed_cost)
    assert m[f"{PREFIX}/waste_usd"] == float(total.waste)
    assert m[f"{PREFIX}/effective_gpu_hours"] == float(total.effective_gpu_hours)
    assert m[f"{PREFIX}/gpus"] == 8
    assert math.isclose(m[f"{PREFIX}/usd_per_token"] * 1e9, float(total.observed_cost),
                        rel_tol=1e-9)
    shares = [m[f"{PREFIX}/share_pct/{p}"]
              for p in ("idle", "underutilized", "productive", "compute_bound")]
    assert math.isclose(sum(shares), 100.0, rel_tol=1e-12)
    # ~40 s idle before and after ~3.5 min at 100 %: both phases are there
    assert shares[0] > 5 and shares[3] > 50
    assert s.tags[f"{PREFIX}.sampled"] == "true" and s.tags[f"{PREFIX}.label.team"] == "nlp"
    assert s.html is not None and "<html" in s.html.lower()
    doc_recs = report.to_dict()["recommendations"]  # type: ignore[attr-defined]
    assert [r["id"] for r in s.recommendations] == [r["id"] for r in doc_recs[:10]]
    table_rows = [ln for ln in s.recommendations_md.splitlines() if ln.startswith("| ")]
    assert len(table_rows) == 1 + len(s.recommendations)  # header + one row each
    assert s.series is not None and 0 < len(s.series) <= 300
    assert set(s.series.columns) == {f"gpu{i}/{c}" for i in range(8)
                                     for c in ("util_gpu_pct", "power_w")}  # no memory column


def test_nothing_sampled_says_why() -> None:
    s = nothing_sampled("NVML: libnvidia-ml.so.1 not found", labels={"team": "x"},
                        exit_code=0, counts={"samples": 64.0, "tokens": 0.0})
    assert not s.sampled
    assert s.tags[f"{PREFIX}.not_sampled_reason"] == "NVML: libnvidia-ml.so.1 not found"
    assert s.tags[f"{PREFIX}.exit_code"] == "0"
    assert s.metrics == {f"{PREFIX}/samples": 64.0}  # counted work, no invented GPU zeros
    assert s.html is None and s.series is None


def _table(ts_s: list[float], gpu: list[int], util: list[float | None]) -> pa.Table:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    ts = pa.array([int((t0 + t) * 1e9) for t in ts_s], pa.timestamp("ns", tz="UTC"))
    return pa.table({"ts": ts, "gpu_uuid": [f"GPU-{g}" for g in gpu],
                     "gpu_index": pa.array(gpu, pa.int16()),
                     "util_gpu_pct": pa.array(util, pa.float32())})


rows = st.lists(st.tuples(st.floats(0, 1e5, allow_nan=False), st.integers(0, 3),
                          st.one_of(st.none(), st.floats(0, 100, width=32))),
                min_size=1, max_size=300)


@given(rows, st.integers(1, 50))
def test_downsample_bounds(data: list[tuple[float, int, float | None]], max_points: int) -> None:
    ts, gpu, util = (list(x) for x in zip(*data))
    s = downsample(_table(ts, gpu, util), max_points, columns=("util_gpu_pct",))
    assert 1 <= len(s) <= min(max_points, len(data))
    assert np.all(np.diff(s.elapsed_s) > 0)
    assert np.all(np.diff(s.ts_ms) >= 0)
    assert s.elapsed_s[0] >= -1e-6 and s.elapsed_s[-1] <= max(ts) - min(ts) + 1e-3
    for g in set(gpu):
        seen = [u for gg, u in zip(gpu, util) if gg == g and u is not None]
        name = f"gpu{g}/util_gpu_pct"
        if not seen:
            assert name not in s.columns  # never a fake 0
            continue
        col = s.columns[name]
        vals = col[~np.isnan(col)]
        assert len(vals) >= 1
        assert vals.min() >= min(seen) - 1e-3 and vals.max() <= max(seen) + 1e-3


def test_downsample_keeps_every_point_under_the_cap() -> None:
    s = downsample(_table([0, 1, 2, 3], [0, 0, 0, 0], [10, None, 30, 40]), 100,
                   columns=("util_gpu_pct",))
    assert list(s.elapsed_s) == [0, 1, 2, 3]
    col = s.columns["gpu0/util_gpu_pct"]
    assert col[0] == 10 and math.isnan(col[1]) and list(col[2:]) == [30, 40]


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what Python does for a missing package
    with pytest.raises(MissingExtraError) as err:
        make_trackers(mlflow=True)
    assert "pip install 'gpuaudit[mlflow]'" in str(err.value)
    assert isinstance(err.value, ImportError)
    with pytest.raises(ImportError, match=r"gpuaudit\[mlflow\]"):
        gpuaudit.monitor(mlflow=True)
    with pytest.raises(MissingExtraError, match=r"gpuaudit\[hf\]"):
        require("gpuaudit_no_such_module", "hf", "HFCallback")


def test_run_cli_missing_extra_fails_before_the_job(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    args = ["run", "--mlflow", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    code = ("import sys; sys.modules['mlflow'] = None  # as if not installed\n"
            f"from gpuaudit.cli import main; sys.exit(main({args!r}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.startswith("error: logging to MLflow needs the 'mlflow' package")
    assert "fix: pip install 'gpuaudit[mlflow]'" in p.stderr
    assert not marker.exists()


def test_core_import_stays_light() -> None:
    code = ("import sys, gpuaudit, gpuaudit.monitor, gpuaudit.integrate, "
            "gpuaudit.integrate.trackers, gpuaudit.cli.run\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, check=True)
    assert p.stdout.strip() == "[]"


@pytest.mark.parametrize(("attr", "blocked", "extra"), [
    ("LightningCallback", ("lightning", "lightning.pytorch", "pytorch_lightning"), "lightning"),
    ("HFCallback", ("transformers",), "hf"),
    ])
def test_callbacks_name_their_extra(monkeypatch: pytest.MonkeyPatch, attr: str,
                                    blocked: tuple[str, ...], extra: str) -> None:
    import gpuaudit.integrate

    for name in blocked:  # what Python does for a package that is not installed
        monkeypatch.setitem(sys.modules, name, None)
    for mod in ("gpuaudit.integrate.lightning_callback", "gpuaudit.integrate.hf_callback"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    monkeypatch.delitem(vars(gpuaudit.integrate), attr, raising=False)
    with pytest.raises(MissingExtraError) as err:
        getattr(gpuaudit.integrate, attr)
    assert f"pip install 'gpuaudit[{extra}]'" in str(err.value)


def test_wandb_resume_waits_for_the_next_second():
    # W&B names a run's local folder by the second of its init: resuming the workload's run
    # id within that second shared the folder and lost the workload's records
    import time

    from gpuaudit.integrate.wandb_tracker import _next_second

    for _ in range(3):
        before = time.time()
        _next_second()
        after = time.time()
        assert int(after) > int(before)
