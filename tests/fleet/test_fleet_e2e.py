"""Fleet audits through a real Prometheus (backfilled with promtool) and its HTTP API."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pyarrow.compute as pc
import pytest

from gpuaudit.api import audit_fleet
from gpuaudit.classify import classify
from gpuaudit.classify.pushdown import pull_aggregates as _pull
from gpuaudit.classify.pushdown import usage_from_pushdown
from gpuaudit.classify.usage import PHASES
from gpuaudit.cli import main
from gpuaudit.measure.fleet.dcgm import series_id
from gpuaudit.measure.fleet.prometheus import PromClient, PrometheusSource, pod_labels
from gpuaudit.price.attribution import (
    Attributor,
    attribute_table,
    load_mapping,
)

TEAMS = Path(__file__).parents[1] / "data" / "fleet" / "teams.toml"
FIELDS = ("idle_s", "underutilized_s", "productive_s", "compute_bound_s", "busy_s",
          "underutilized_unused_s", "headroom_s", "gap_s")


def pull_aggregates(client, **kw):
    """The pushdown as the fleet audit runs it: dcgm labels decoded by measure's series_id."""
    return _pull(client, identify=series_id, **kw)


def _close(a, b, tol=1e-6):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x == pytest.approx(y, rel=tol, abs=1e-3), f


def _pushdown(prom, fleet, by=("pod",), labels_for=None):
    c = PromClient(prom)
    data = pull_aggregates(c, start_s=fleet.start_s, end_s=fleet.end_s, step_s=fleet.step_s)
    usage, daily = usage_from_pushdown(data, by=by, labels_for=labels_for)
    return usage, daily, c, data


def test_pushdown_equals_local_classify_per_gpu_and_per_pod(prom, fleet):
    truth = fleet.sample_table()
    local = classify(truth, by=["pod"], cap_intervals=1.0, interval_s=fleet.step_s)
    usage, _, _, data = _pushdown(prom, fleet)
    assert data.shared  # the time-sliced GPU was seen
    _close(usage.overall(), local.overall())
    mine = dict(usage.grouped(("gpu_uuid", "pod")))
    theirs = dict(local.grouped(("gpu_uuid", "pod")))
    assert set(mine) == set(theirs)
    for k in theirs:
        for f in FIELDS[:-1]:  # gaps are spread over a GPU's cells, not given to one pod
            assert getattr(mine[k], f) == pytest.approx(getattr(theirs[k], f), abs=1e-3), (k, f)
    # the default cap (3 intervals) differs only around the scrape gap: 2 intervals per GPU
    default = classify(truth, by=["pod"], interval_s=fleet.step_s)
    diff = abs(default.overall().observed_s - usage.overall().observed_s)
    assert diff <= 2 * fleet.step_s * len({s.uuid for s in fleet.series})


def test_pushdown_patterns_bound_the_local_ones(prom, fleet):
    """Idle runs from two-step windows are never fewer than the engine's (one more at most
    per series start or end), so the mean idle run stays a lower bound of the longest; the
    step change differs only by the pairs across pod switches and gaps (at most 100 each)."""
    local = classify(fleet.sample_table(), by=["pod"], cap_intervals=1.0,
                     interval_s=fleet.step_s)
    usage, _, _, data = _pushdown(prom, fleet)
    theirs = {s.gpu_uuid: s for s in local.series}
    shared = {s.uuid for s in fleet.series if s.share is not None}
    checked = 0
    for mine in usage.series:
        if mine.gpu_uuid in shared:
            continue  # the engine reads a time-sliced GPU's pods as one interleaved sequence
        ref = theirs[mine.gpu_uuid]
        bounds = len(mine.pods) + 2 * len(data.chunks)
        assert ref.idle_runs <= mine.idle_runs <= ref.idle_runs + bounds, mine.gpu_uuid
        assert mine.max_idle_run_s <= ref.max_idle_run_s
        assert mine.mean_abs_step_pct == pytest.approx(ref.mean_abs_step_pct,
                                                       abs=100.0 * bounds / mine.samples)
        checked += 1
    assert checked >= 10


def test_threshold_queries_for_straddling_gpus_only_give_the_same_answers(prom, fleet):
    kw = {"start_s": fleet.start_s, "end_s": fleet.end_s, "step_s": fleet.step_s}
    narrow = pull_aggregates(PromClient(prom), **kw)
    every = pull_aggregates(PromClient(prom), narrow=False, **kw)
    key = {sid: code for code, sid in enumerate(every.ids)}
    assert set(narrow.ids) == set(every.ids)
    narrow_rows, every_rows = narrow.rows(), every.rows()
    assert len(narrow_rows) == len(every_rows)
    for (code, chunk), v in narrow_rows.items():
        w = every_rows[(key[narrow.ids[code]], chunk)]
        if "n" not in w:
            continue  # no point in the chunk (signals only, or a series that just ended)
        assert v.keys() == w.keys()
        for name in v:
            assert v[name] == pytest.approx(w[name], rel=1e-12, abs=1e-9), name
    assert sum("n" in v for v in narrow_rows.values()) > 20


def test_raw_pull_equals_pushdown_and_moves_more_bytes(prom, fleet):
    usage, _, c_push, _ = _pushdown(prom, fleet)
    c = PromClient(prom)
    src = PrometheusSource(c, start_s=fleet.start_s, end_s=fleet.end_s, step_s=fleet.step_s)
    raw = classify(src, by=["pod"], cap_intervals=1.0)
    _close(raw.overall(), usage.overall())
    assert c.body_bytes > 3 * c_push.body_bytes


def test_step_longer_than_the_scrape_interval_matches_the_raw_pull(prom, fleet):
    """--step 1m on 15 s scrapes: four samples per step, so first/last come from the
    timestamp forms; the phases still equal the raw pull's at the same step."""
    step = 4 * fleet.step_s
    c = PromClient(prom)
    data = pull_aggregates(c, start_s=fleet.start_s, end_s=fleet.end_s, step_s=step)
    usage, _ = usage_from_pushdown(data, by=("pod",))
    assert all("first" in v and "last" in v for v in data.rows().values() if "n" in v)
    src = PrometheusSource(PromClient(prom), start_s=fleet.start_s, end_s=fleet.end_s,
                           step_s=step)
    raw = classify(src, by=["pod"], cap_intervals=1.0)
    # series of one GPU that meet in a step (the time-sliced GPU; at 1 m every pod switch
    # inside a minute) are split by their mean share over the chunk (docs/fleet.md), not
    # point by point: each GPU's observed time is exact, its phases shift by a few steps
    mine, theirs = dict(usage.grouped(("gpu_uuid",))), dict(raw.grouped(("gpu_uuid",)))
    assert set(mine) == set(theirs)
    for k in theirs:
        assert mine[k].observed_s == pytest.approx(theirs[k].observed_s, abs=1e-3), k
        for f in FIELDS[:4]:
            assert getattr(mine[k], f) == pytest.approx(getattr(theirs[k], f),
                                                        abs=0.005 * theirs[k].observed_s), (k, f)


def test_time_sliced_gpu_is_split_not_billed_twice(prom, fleet):
    usage, _, _, _ = _pushdown(prom, fleet)
    shared = {s.uuid for s in fleet.series if s.share is not None}
    assert shared
    wall = usage.wall_s
    for uuid, t in usage.per_gpu():
        assert t.total_s <= wall + 1e-6, uuid  # never more than the GPU's wall time
        if uuid in shared:
            assert t.total_s == pytest.approx(wall - 0.0, rel=0.02)


def test_unallocated_is_its_own_line(prom, fleet):
    mapping = load_mapping(TEAMS)
    c = PromClient(prom)
    kube = pod_labels(c, start_s=fleet.start_s, end_s=fleet.end_s)
    assert kube  # kube_pod_labels was joined
    att = Attributor(mapping, kube)
    usage, _, _, _ = _pushdown(prom, fleet, by=("team",),
                               labels_for=lambda sid: att.resolve(sid.namespace, sid.pod,
                                                                  dict(sid.labels)))
    truth = attribute_table(fleet.sample_table(), Attributor(mapping, {
        k: {kk.replace("-", "_"): v for kk, v in kl.items()} for k, kl in fleet.pods.items()}))
    local = classify(truth, by=["team"], cap_intervals=1.0, interval_s=fleet.step_s)
    mine = dict(usage.grouped(("label:team",)))
    theirs = dict(local.grouped(("label:team",)))
    assert ("unallocated",) in mine and ("unattributed",) in mine  # sandbox has no owner
    for k in theirs:
        for f in ("idle_s", "busy_s", "compute_bound_s"):
            assert getattr(mine[k], f) == pytest.approx(getattr(theirs[k], f), abs=1e-3)
    unheld = pc.sum(pc.if_else(pc.is_null(truth.column("pod")), 1, 0)).as_py()
    assert mine[("unallocated",)].samples == unheld


def test_fleet_result_and_reports(prom, fleet):
    result = audit_fleet(prometheus=prom, start_s=fleet.start_s, end_s=fleet.end_s,
                         step_s=fleet.step_s, by=("team",), map_file=TEAMS,
                         pricing={"price": "0.80"})
    f = result.extra["fleet"]
    teams = {e["group"]["team"] for e in f["showback"]}
    assert {"vision", "nlp", "recsys", "unallocated"} <= teams
    total_cost = sum(Decimal(e["cost_usd"]) for e in f["showback"])
    assert total_cost == pytest.approx(Decimal(f["total"]["cost_usd"]), abs=Decimal("0.05"))
    hours = sum(e["gpu_hours"] for e in f["showback"])
    assert hours == pytest.approx(f["total"]["gpu_hours"], rel=1e-6)
    assert len(f["kpis"]["days"]) == 2  # 26 h: two day chunks
    assert f["kpis"]["util_window_pct"]["1h"] is not None
    for job in f["histograms"]["jobs"]:
        assert sum(job["bins_pct"].values()) == pytest.approx(100.0, abs=0.5)
    data = json.loads(result.render("json"))
    assert data["extra"]["fleet"]["showback"]
    assert result.usage.by == ("label:team",)


def test_cli_pushdown_and_raw_agree(prom, fleet, tmp_path):
    outs = {}
    for mode in ("push", "raw"):
        out = tmp_path / f"{mode}.json"
        args = ["fleet", "--prometheus", prom, "--start", str(fleet.start_s), "--end",
                str(fleet.end_s), "--by", "team", "--map-file", str(TEAMS), "--price", "1.25",
                "--format", "json", "-o", str(out), "--no-progress"]
        assert main([*args, "--raw"] if mode == "raw" else args) == 0
        outs[mode] = json.loads(out.read_text())["extra"]["fleet"]
    push = {e["group"]["team"]: e for e in outs["push"]["showback"]}
    raw = {e["group"]["team"]: e for e in outs["raw"]["showback"]}
    assert set(push) == set(raw)
    for t in push:
        for p in PHASES:
            assert push[t]["phase_hours"][p] == pytest.approx(raw[t]["phase_hours"][p],
                                                               abs=1e-3)
    md = tmp_path / "r.md"
    assert main(["fleet", "--prometheus", prom, "--start", str(fleet.start_s), "--end",
                 str(fleet.end_s), "--price", "1", "--format", "markdown", "-o", str(md)]) == 0
    assert "Fleet showback by team" in md.read_text()


def test_cli_prometheus_down_is_a_clear_error(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(["fleet", "--prometheus", f"http://127.0.0.1:{port}", "--since", "1h",
               "--step", "15s", "--retries", "1", "--timeout", "2", "--price", "1"])
    assert rc == 2
    assert "unavailable" in capsys.readouterr().err


def test_interval_is_detected_where_the_data_is_not_in_the_last_hour(prom, fleet, capsys):
    # a range that ends 5 h after the last sample (a finished job, history): the scrape
    # interval is found in the latest window that holds samples, not in the empty last hour
    from gpuaudit.measure.fleet.prometheus import detect_interval_s

    c = PromClient(prom)
    late = fleet.end_s + 5 * 3600
    assert detect_interval_s(c, end_s=late) is None  # the last hour alone holds nothing
    assert detect_interval_s(c, end_s=late, start_s=fleet.start_s - 3600) == fleet.step_s
    # a range whose last hour is only partly covered: the gap between samples, not 3600/count
    assert detect_interval_s(c, end_s=fleet.end_s + 40 * 60) == fleet.step_s
    result = audit_fleet(prometheus=prom, start_s=fleet.start_s, end_s=late, by=("team",),
                         map_file=TEAMS, pricing={"price": "0.80"})
    assert result.extra["fleet"]["transfer"]["step_s"] == fleet.step_s
    exact = audit_fleet(prometheus=prom, start_s=fleet.start_s, end_s=fleet.end_s,
                        step_s=fleet.step_s, by=("team",), map_file=TEAMS,
                        pricing={"price": "0.80"})
    assert result.usage.overall().observed_s == pytest.approx(
        exact.usage.overall().observed_s, rel=1e-9)
    rc = main(["fleet", "--prometheus", prom, "--start", str(fleet.start_s), "--end",
               str(late), "--price", "1", "--format", "json", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    # no samples anywhere in the range: the error names the range, not "the last hour"
    rc = main(["fleet", "--prometheus", prom, "--start", str(late), "--end",
               str(late + 7200), "--price", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "has samples between" in err and "last hour" not in err


def test_fleet_by_a_label_no_series_has_is_warned(prom, fleet, capsys, tmp_path):
    out = tmp_path / "f.json"
    rc = main(["fleet", "--prometheus", prom, "--start", str(fleet.start_s), "--end",
               str(fleet.end_s), "--step", str(fleet.step_s), "--by", "nosuchlabel",
               "--price", "1", "--format", "json", "-o", str(out), "--no-progress"])
    assert rc == 0
    assert "warning: --by nosuchlabel: no sample carries the label" in capsys.readouterr().err
    notes = json.loads(out.read_text())["source"]["notes"]
    assert [n["column"] for n in notes if n["where"] == "--by"] == ["nosuchlabel"]
    # --by team (from the map file) is a real grouping: no note
    rc = main(["fleet", "--prometheus", prom, "--start", str(fleet.start_s), "--end",
               str(fleet.end_s), "--step", str(fleet.step_s), "--by", "team", "--map-file",
               str(TEAMS), "--price", "1", "--format", "json", "-o", str(out), "--no-progress"])
    assert rc == 0 and "warning" not in capsys.readouterr().err
