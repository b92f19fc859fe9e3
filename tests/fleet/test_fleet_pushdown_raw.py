"""The utilization view's subqueries answered here from a store's raw samples
(gpuaudit.classify.pushdown_raw) give the store's own answers, bit for bit: against a
slow reference written from the queries' definitions (any samples, either window edge),
and against a real Prometheus and VictoriaMetrics on 127.0.0.1 (every query each store has
answered here, every series and chunk, on a fleet with shifted, doubled and missing
scrapes); the whole pushdown audit is the same report with the stores answering them or
not."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fleetgen import (
    Fleet,
    backfill,
    import_victoria_metrics,
    make_fleet,
    run_prometheus,
    run_victoria_metrics,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuaudit.classify.pushdown as pd
from gpuaudit.api import audit_fleet
from gpuaudit.api.fleet import RAW_VIEW_ENV, _raw_util_readers
from gpuaudit.classify.pushdown_queries import pack_base
from gpuaudit.classify.pushdown_raw import RAW_VIEW, SUBQUERIES, util_answers
from gpuaudit.errors import SourceUnavailableError
from gpuaudit.measure.fleet.dcgm import series_id
from gpuaudit.measure.fleet.native import probe_form, window_left_open
from gpuaudit.measure.fleet.prometheus import PromClient
from gpuaudit.measure.fleet.shards import parse_stores

TEAMS = Path(__file__).parents[1] / "data" / "fleet" / "teams.toml"


def _reference(ts: list[int], vals: list[float], a_ms: int, b_ms: int, step_ms: int,
               shut: int, early: int = 0) -> dict[str, float]:
    """Each query of RAW_VIEW for one series, straight from its PromQL definition (a
    window ``[w]`` holds the samples with ``t - w + shut <= ts <= t`` in milliseconds;
    ``[s-1ms]`` and ``[2s-1ms]`` for a step and two; ``early``: steps before ``a`` whose
    windows VictoriaMetrics' first / last subqueries also see, the edge forms alone)."""
    pts = sorted(zip(ts, vals), key=lambda p: p[0])
    steps = list(range(a_ms, b_ms + 1, step_ms))

    def window(t: int, w: int) -> list[float]:
        return [v for x, v in pts if t - w + shut <= x <= t]

    base = pack_base(len(steps))
    point = {t: window(t, step_ms - 1)[-1] for t in steps if window(t, step_ms - 1)}
    two = {t: window(t, 2 * step_ms - 1) for t in steps}
    edges = [t for t in steps if len(two[t]) == 1]
    out: dict[str, float] = {}

    def put(name: str, x: float, present: bool) -> None:
        if present:
            out[name] = x

    u = [point[t] for t in steps if t in point]
    put("n", len(u), bool(u))
    put("lo", sum_in_order([x + base for x in u if x < 10]), any(x < 10 for x in u))
    put("hi", sum_in_order([x + base for x in u if x >= 70]), any(x >= 70 for x in u))
    put("top", sum(x >= 90 for x in u), any(x >= 90 for x in u))
    put("idle_pairs", sum(bool(w) and max(w) < 10 for w in two.values()),
        any(bool(w) and max(w) < 10 for w in two.values()))
    put("edges", len(edges), bool(edges))
    live = [w for w in two.values() if w]
    put("absstep", sum_in_order([max(w) for w in live]) - sum_in_order([min(w) for w in live]),
        bool(live))
    first_w, last_w = window(a_ms, step_ms - 1), window(b_ms, step_ms - 1)
    put("at_start", len(first_w), bool(first_w))
    put("at_end", len(last_w), bool(last_w))
    offset_s = (b_ms - a_ms) / 1000
    late = [t for t in edges if t > a_ms]
    if early:
        seen = [t for t in range(a_ms - early * step_ms, b_ms + 1, step_ms)
                if len(window(t, 2 * step_ms - 1)) == 1]
        if seen:
            out["first"] = min(seen) / 1000
            out["last"] = max(seen) / 1000 - step_ms / 1000
    else:
        if first_w:
            out["first"] = b_ms / 1000 - offset_s
        elif late and b_ms > a_ms:
            out["first"] = min(late) / 1000
        if last_w:
            out["last"] = b_ms / 1000
        elif edges:
            out["last"] = max(edges) / 1000 - step_ms / 1000
    raw = [v for x, v in pts if b_ms - (b_ms - a_ms + step_ms - 1) + shut <= x <= b_ms]
    put("raw_n", len(raw), bool(raw))
    put("raw_sum", sum_in_order(raw), bool(raw))
    both = [v for x, v in pts if b_ms - (b_ms - a_ms + 2 * step_ms - 1) + shut <= x <= b_ms]
    put("umin", min(both) if both else 0.0, bool(both))
    put("umax", max(both) if both else 0.0, bool(both))
    return out


def sum_in_order(xs: list[float]) -> float:
    total = 0.0
    for x in xs:  # PromQL's sum_over_time: one addition after another, in time order
        total += x
    return total


@settings(max_examples=150, deadline=None)
@given(series=st.lists(st.lists(st.tuples(st.integers(-40_000, 140_000),
                                          st.sampled_from([0.0, 3.0, 9.0, 10.0, 42.5, 69.0,
                                                           70.0, 89.5, 90.0, 100.0])),
                                max_size=25), min_size=1, max_size=4),
       steps=st.integers(1, 8), shut=st.booleans(), early=st.sampled_from([0, 1]))
def test_answers_equal_the_queries_definitions(series: list[list[tuple[int, float]]],
                                               steps: int, shut: bool, early: int) -> None:
    step_ms, a_ms = 15_000, 15_000
    b_ms = a_ms + (steps - 1) * step_ms
    ts = [np.array([t for t, _ in s], np.int64) for s in series]  # any order, repeats
    vals = [np.array([v for _, v in s], np.float64) for s in series]
    got = util_answers(ts, vals, a_s=a_ms / 1000, b_s=b_ms / 1000, step_s=15.0,
                       left_open=shut, edges_before=early)
    for j, s in enumerate(series):
        ref = _reference([t for t, _ in s], [v for _, v in s], a_ms, b_ms, step_ms, int(shut),
                         early)
        mine = {name: float(vals_[list(idx).index(j)]) for name, (idx, vals_) in got.items()
                if j in idx}
        assert mine == ref, (j, s)


def _jittered(fleet: Fleet) -> Fleet:
    """Scrapes moved within their step, some steps scraped twice, some scrapes missed."""
    rng = np.random.default_rng(5)
    for k, s in enumerate(fleet.series):
        if k % 5 == 1:
            s.ts_s = s.ts_s + int(rng.integers(1, 15))
        elif k % 7 == 2:
            ts = np.concatenate([s.ts_s, s.ts_s[::3] + 5])
            u = np.concatenate([s.util, s.util[::3]])
            order = np.argsort(ts, kind="stable")
            s.ts_s, s.util = ts[order], u[order]
        elif k % 11 == 3:
            keep = rng.random(s.ts_s.shape[0]) > 0.2
            s.ts_s, s.util = s.ts_s[keep], s.util[keep]
    return fleet


@pytest.fixture(scope="module")
def jittered() -> Iterator[tuple[dict[str, str], Fleet]]:
    """The fleet with shifted, doubled and missing scrapes in a Prometheus and in a
    VictoriaMetrics (the same samples in each)."""
    fleet = _jittered(make_fleet(nodes=3, gpus_per_node=4, hours=26, step_s=15, seed=11))
    with tempfile.TemporaryDirectory() as root:
        backfill(fleet, Path(root) / "prom")
        with run_prometheus(Path(root) / "prom") as prom, \
                run_victoria_metrics(Path(root) / "vm") as vm:
            import_victoria_metrics(fleet, vm, Path(root) / "import")
            yield {"remote-read": prom, "export": vm}, fleet


def _answers(data: pd.PushdownData) -> dict[tuple[str, object, int], float]:
    a = data.answers
    return {(name, data.ids[int(k // a.nchunks)], int(k % a.nchunks)): float(v)
            for name, col in a.cols.items() for k, v in zip(a.key, col) if v == v}


@pytest.mark.parametrize(("form", "names", "left_open", "early"),
                         [("remote-read", RAW_VIEW, False, 0),
                          ("export", (*SUBQUERIES, "first", "last"), True, 1)])
def test_every_query_equals_the_stores(jittered: tuple[dict[str, str], Fleet], form: str,
                                       names: tuple[str, ...], left_open: bool, early: int,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every series and chunk asked every query (no narrowing), the answers before any
    decoding: the store's and ours, the same floats. VictoriaMetrics' first / last point
    where the pushdown asks them: where the store sees no sample at the chunk's first /
    last step (elsewhere its query's other branch answers, and nothing asks it)."""
    urls, fleet = jittered
    for name in ("decode_columns", "_settle_edges"):
        monkeypatch.setattr(pd, name, lambda *a, **k: None)
    monkeypatch.setattr(pd, "_overlapping", lambda *a, **k: [])
    c = PromClient(urls[form])
    kw = {"identify": series_id, "start_s": fleet.start_s, "end_s": fleet.end_s,
          "step_s": float(fleet.step_s), "narrow": False}
    assert probe_form(c) == form
    assert window_left_open(c, form) is left_open  # Prometheus 2: [t - w, t]
    theirs = _answers(pd.pull_aggregates(c, **kw))
    monkeypatch.setenv(RAW_VIEW_ENV, "1")
    store = parse_stores([urls[form]])[0]
    reader = _raw_util_readers([store], {store.name: c}, step=float(fleet.step_s),
                               matchers=None)[store.name]  # as the fleet audit sets it up
    assert (reader.names, reader.left_open, reader.edges_before) == (names, left_open, early)
    ours = _answers(pd.pull_aggregates(c, **kw, raw_util=reader))
    if early:
        for name, edge in (("first", "at_start"), ("last", "at_end")):
            for k in [k for k in theirs if k[0] == name]:
                if (edge, k[1], k[2]) in theirs:  # answered by the store's own branch
                    theirs.pop(k)
                    ours.pop(k, None)
            for k in [k for k in ours if k[0] == name and (edge, k[1], k[2]) in theirs]:
                ours.pop(k)
    util = {k for k in theirs if k[0] in names and not k[1].mig_profile}  # type: ignore[attr-defined]
    assert len(util) > 500 and {k[0] for k in util} == set(names)
    assert ours.keys() == theirs.keys()
    assert all(ours[k] == theirs[k] for k in theirs), \
        [(k, ours[k], theirs[k]) for k in theirs if ours[k] != theirs[k]][:5]
    c.close()


def _report(url: str, fleet: Fleet, raw: str, monkeypatch: pytest.MonkeyPatch) -> dict:  # type: ignore[type-arg]
    monkeypatch.setenv(RAW_VIEW_ENV, raw)
    r = audit_fleet(prometheus=url, start_s=fleet.start_s, end_s=fleet.end_s,
                    step_s=fleet.step_s, by=("team",), map_file=TEAMS,
                    pricing={"price": "1.37"})
    d = json.loads(r.render("json"))
    d.pop("generated_at", None)
    return {"report": _without(d, "transfer"),
            "requests": r.extra["fleet"]["transfer"]["requests"]}


def _without(x: object, key: str) -> object:
    """``x`` with every ``key`` of its objects left out (what was sent and received)."""
    if isinstance(x, dict):
        return {k: _without(v, key) for k, v in x.items() if k != key}
    if isinstance(x, list):
        return [_without(v, key) for v in x]
    return x


@pytest.mark.parametrize("form", ["remote-read", "export"])
def test_the_pushdown_report_is_the_same_with_the_stores_subqueries(
        jittered: tuple[dict[str, str], Fleet], form: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    urls, fleet = jittered
    theirs = _report(urls[form], fleet, "0", monkeypatch)
    ours = _report(urls[form], fleet, "1", monkeypatch)
    assert ours["report"] == theirs["report"]
    assert ours["requests"] < theirs["requests"]  # the subqueries were not asked


class _Losing:
    """A real store's raw reader whose answer for the chunk starting at ``start_s`` leaves
    out every other series the first ``times`` reads (a store's index answering one
    request short of series it answers the next: a VictoriaMetrics 1.79 export once did)."""

    def __init__(self, reader: object, start_s: float, times: int) -> None:
        self._reader, self._start_s, self.times = reader, start_s, times
        self.names = reader.names  # type: ignore[attr-defined]
        self.left_open = reader.left_open  # type: ignore[attr-defined]
        self.edges_before = reader.edges_before  # type: ignore[attr-defined]
        self.short_reads = 0

    def samples(self, a_s: float, b_s: float) -> list:  # type: ignore[type-arg]
        got = self._reader.samples(a_s, b_s)  # type: ignore[attr-defined]
        if a_s == self._start_s and self.times > 0:
            self.times -= 1
            self.short_reads += 1
            return got[::2]
        return got


def _notes(report: dict) -> list:  # type: ignore[type-arg]
    return [n for n in report["report"]["source"]["notes"] if "left out" in n["reason"]]


@pytest.mark.parametrize("form", ["remote-read", "export"])
@pytest.mark.parametrize("times", [1, 2])
def test_a_raw_read_short_of_series_the_store_names_is_read_again_or_given_back(
        jittered: tuple[dict[str, str], Fleet], form: str, times: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's own stddev answers name every util series with samples in a chunk; a raw
    read without some is read again (once short: the same report), and twice short the
    chunk's utilization view is asked of the store (the same figures, and a note naming
    the chunk and the series count): never a report missing them."""
    import gpuaudit.api.fleet as api_fleet

    urls, fleet = jittered
    theirs = _report(urls[form], fleet, "0", monkeypatch)
    readers: list[_Losing] = []

    def losing(*args: object, **kw: object) -> dict[str, object]:
        real = _raw_util_readers(*args, **kw)  # type: ignore[arg-type]
        readers.extend(_Losing(r, float(fleet.start_s + fleet.step_s), times)
                       for r in real.values())
        return dict(zip(real, readers))

    monkeypatch.setattr(api_fleet, "_raw_util_readers", losing)
    ours = _report(urls[form], fleet, "1", monkeypatch)
    assert [r.short_reads for r in readers] == [times]
    notes = _notes(ours)
    if times == 1:
        assert ours["report"] == theirs["report"] and not notes
        return
    assert len(notes) == 1 and notes[0]["count"] > 10, notes
    assert "2024-01-01T00:00:15" in notes[0]["reason"], notes[0]["reason"]
    ours["report"]["source"]["notes"].remove(notes[0])
    assert ours["report"] == theirs["report"]


def _refusal_notes(report: dict) -> list:  # type: ignore[type-arg]
    return [n for n in report["report"]["source"]["notes"]
            if "would not stream" in n["reason"]]


def test_a_store_whose_export_limit_refuses_the_raw_read_has_its_promql_answer(
        jittered: tuple[dict[str, str], Fleet], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A VictoriaMetrics whose ``-search.maxExportSeries`` is below the fleet's util series
    (an operator's memory guard) answers the native-form probe (no series) and every
    PromQL query, but refuses a raw read with HTTP 400: the reader raises the error the
    pushdown gives back to the store's PromQL. The store enforces its limit only where its
    index cache misses, so in an audit whether a chunk is refused depends on which request
    reached it first: whatever was refused is named in notes, and the report is the
    store-only one (before: the audit failed where a chunk was refused)."""
    _urls, fleet = jittered
    with run_victoria_metrics(tmp_path / "vm", extra_args=("-search.maxExportSeries=3",)) as vm:
        import_victoria_metrics(fleet, vm, tmp_path / "import")
        monkeypatch.setenv(RAW_VIEW_ENV, "1")
        store = parse_stores([vm])[0]
        c = PromClient(vm)
        reader = _raw_util_readers([store], {store.name: c}, step=float(fleet.step_s),
                                   matchers=None)[store.name]
        with pytest.raises(SourceUnavailableError, match="HTTP 400"):
            reader.samples(float(fleet.start_s + fleet.step_s), float(fleet.start_s + 86_400))
        c.close()
        ours = _report(vm, fleet, "1", monkeypatch)
        theirs = _report(vm, fleet, "0", monkeypatch)
    chunks = len(pd.chunk_grid(fleet.start_s, fleet.end_s, fleet.step_s, 86_400.0))
    notes = _refusal_notes(ours)
    assert len(notes) <= 1 and sum(n["count"] for n in notes) <= chunks, notes
    assert all("HTTP 400" in n["reason"] for n in notes), notes
    for n in notes:
        ours["report"]["source"]["notes"].remove(n)
    assert ours["report"] == theirs["report"]


class _Refusing:
    """A real store's raw reader that refuses the chunk starting at ``start_s`` the first
    ``times`` reads, as a proxy's timeout or a store's limit does (after the client's
    retries)."""

    def __init__(self, reader: object, start_s: float | None, times: int) -> None:
        self._reader, self._start_s, self.times = reader, start_s, times  # (None: every chunk)
        self.names = reader.names  # type: ignore[attr-defined]
        self.left_open = reader.left_open  # type: ignore[attr-defined]
        self.edges_before = reader.edges_before  # type: ignore[attr-defined]

    def samples(self, a_s: float, b_s: float) -> list:  # type: ignore[type-arg]
        if self._start_s in (None, a_s) and self.times > 0:
            self.times -= 1
            raise SourceUnavailableError("HTTP 504 from the proxy in front of the store",
                                         where="http://127.0.0.1:1/api/v1/read")
        return self._reader.samples(a_s, b_s)  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("form", ["remote-read", "export"])
@pytest.mark.parametrize("every", [False, True])
def test_a_chunk_the_store_will_not_stream_is_asked_of_its_promql(
        jittered: tuple[dict[str, str], Fleet], form: str, every: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first chunk's raw read refused (or every chunk's): that chunk's utilization view
    comes from the store's queries, and the report equals the store-only one but for one
    note naming the chunks, how many, and the store's answer."""
    import gpuaudit.api.fleet as api_fleet

    urls, fleet = jittered
    theirs = _report(urls[form], fleet, "0", monkeypatch)
    first = float(fleet.start_s + fleet.step_s)  # (the first chunk starts a step in)
    chunks = len(pd.chunk_grid(fleet.start_s, fleet.end_s, fleet.step_s, 86_400.0))

    def refusing(*args: object, **kw: object) -> dict[str, object]:
        real = _raw_util_readers(*args, **kw)  # type: ignore[arg-type]
        return {name: _Refusing(r, None if every else first, chunks if every else 1)
                for name, r in real.items()}

    monkeypatch.setattr(api_fleet, "_raw_util_readers", refusing)
    ours = _report(urls[form], fleet, "1", monkeypatch)
    notes = _refusal_notes(ours)
    assert len(notes) == 1 and notes[0]["count"] == (chunks if every else 1), notes
    reason = notes[0]["reason"]
    assert "HTTP 504" in reason and "starting 2024-01-01T00:00:15" in reason, reason
    assert (f"{chunks} chunks starting" in reason) is every, reason
    ours["report"]["source"]["notes"].remove(notes[0])
    assert ours["report"] == theirs["report"]
    if not every:
        assert ours["requests"] < theirs["requests"]  # the other chunks were still read raw


def test_the_midnight_fleet_reads_the_same_from_victoriametrics(
        fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared fleet starts at a UTC midnight, where VictoriaMetrics' raw range
    functions miss a series whose only sample in the window is there: the pushdown's
    several-samples forms make up for it, with its subqueries answered here too."""
    with run_victoria_metrics(tmp_path / "vm") as vm:
        import_victoria_metrics(fleet, vm, tmp_path / "import")
        assert fleet.start_s % 86400 == 0
        theirs = _report(vm, fleet, "0", monkeypatch)
        ours = _report(vm, fleet, "1", monkeypatch)
        assert ours["report"] == theirs["report"]


def test_a_store_answering_no_native_form_answers_every_query(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RAW_VIEW_ENV, "1")

    class Store:
        name, url = "s", "http://127.0.0.1:9"

    c = object()  # never asked: the probe below stands for the store
    # remote read and export refused (a proxy blocking them): no reader
    monkeypatch.setattr("gpuaudit.measure.fleet.native.probe_form", lambda client: None)
    assert _raw_util_readers([Store()], {"s": c}, step=15.0, matchers=None) == {}
    monkeypatch.setenv(RAW_VIEW_ENV, "0")
    monkeypatch.setattr("gpuaudit.measure.fleet.native.probe_form",
                        lambda client: "remote-read")
    assert _raw_util_readers([Store()], {"s": c}, step=15.0, matchers=None) == {}


def test_a_long_chunk_asks_its_first_point_to_the_millisecond() -> None:
    """``time() - offset`` with every digit of the offset: ``:g`` kept six, and a 12-day
    chunk's start came out 5 s early (1,036,785 s written as 1.03678e+06)."""
    from gpuaudit.classify.pushdown_queries import build_queries

    step, days = 15.0, 12
    q = build_queries("", step, days * 86400.0, has_sm=False)
    assert f"time() - {days * 86400 - 15})" in q["first"]
    got = util_answers([np.array([0, 15_000], np.int64)], [np.array([50.0, 50.0])],
                       a_s=15.0, b_s=15.0 + days * 86400 - 15, step_s=step, left_open=False)
    assert got["first"][1].tolist() == [15.0]
