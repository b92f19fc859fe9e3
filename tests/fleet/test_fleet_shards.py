"""A fleet past one Prometheus: the same fleet split across a real Prometheus and a real
VictoriaMetrics (Debian's ``victoria-metrics``) audits as it does from one store; time shards
answer what one range answers; a store erring then recovering is retried; a dead one is an
error naming it (or, with --allow-partial, a listed gap); a GPU two stores hold is refused or
deduplicated."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from fleetgen import Fleet, backfill, import_victoria_metrics, run_prometheus, run_victoria_metrics

from gpuaudit.api import audit_fleet
from gpuaudit.cli import main

TEAMS = Path(__file__).parents[1] / "data" / "fleet" / "teams.toml"
PHASE_FIELDS = ("idle_s", "underutilized_s", "productive_s", "compute_bound_s", "gap_s",
                "samples")


@pytest.fixture(scope="module")
def split(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The fleet's first and last node in a Prometheus (promtool blocks), the middle node
    (with the MIG GPU) in VictoriaMetrics (imported with timestamps)."""
    hosts = fleet.hosts()
    a = fleet.subset({hosts[0], hosts[2]})
    b = fleet.subset({hosts[1]})
    assert a.series and b.series
    root = tmp_path_factory.mktemp("split")
    backfill(a, root / "prom")
    with run_prometheus(root / "prom") as prom_url, run_victoria_metrics(root / "vm") as vm_url:
        import_victoria_metrics(b, vm_url, root / "import")
        yield prom_url, vm_url


def _audit(stores: object, fleet: Fleet, **kw: object):  # type: ignore[no-untyped-def]
    return audit_fleet(prometheus=stores, start_s=fleet.start_s, end_s=fleet.end_s,  # type: ignore[arg-type]
                       step_s=fleet.step_s, by=("team",), map_file=TEAMS,
                       pricing={"price": "1.37"}, **kw)  # type: ignore[arg-type]


def _cells(report) -> dict[tuple[str, str], dict[str, float]]:  # type: ignore[no-untyped-def]
    cells = report.usage.cells.to_pylist()
    return {(c["gpu_uuid"], c["label:team"]): c for c in cells}


def _showback(report) -> dict[str, dict[str, object]]:  # type: ignore[no-untyped-def]
    return {e["group"]["team"]: e for e in report.extra["fleet"]["showback"]}


def test_a_fleet_split_across_prometheus_and_victoriametrics_audits_as_one_store(
        prom: str, split: tuple[str, str], fleet: Fleet) -> None:
    one = _audit(prom, fleet)
    two = _audit([f"eu={split[0]}", f"us={split[1]}"], fleet)
    mine, theirs = _cells(two), _cells(one)
    assert mine.keys() == theirs.keys()
    assert len({k[0] for k in mine}) == len({s.uuid for s in fleet.series})
    for key, cell in theirs.items():
        for f in PHASE_FIELDS:  # counts of points x step: the same to the bit
            assert mine[key][f] == cell[f], (key, f)
        # a sum of readings: VictoriaMetrics adds them in its own order (MIG's 100 x ratio)
        assert mine[key]["busy_s"] == pytest.approx(cell["busy_s"], rel=1e-12), key
    a, b = _showback(two), _showback(one)
    assert a.keys() == b.keys() and {"vision", "nlp", "recsys", "unallocated"} <= set(a)
    for team in b:
        assert a[team]["cost_usd"] == b[team]["cost_usd"], team  # to the cent
        assert a[team]["gpu_hours"] == b[team]["gpu_hours"], team
        assert a[team]["phase_hours"] == b[team]["phase_hours"], team
    ft, fo = two.extra["fleet"]["total"], one.extra["fleet"]["total"]
    assert ft["cost_usd"] == fo["cost_usd"] and ft["gpu_hours"] == fo["gpu_hours"]
    cent = Decimal("0.01")
    assert two.cost.total.observed_cost.quantize(cent) == \
        one.cost.total.observed_cost.quantize(cent)
    assert two.cost.total.waste.quantize(cent) == one.cost.total.waste.quantize(cent)
    tr = two.extra["fleet"]["transfer"]
    assert [s["name"] for s in tr["stores"]] == ["eu", "us"]
    assert all(s["requests"] > 0 and s["wire_bytes"] > 0 for s in tr["stores"])
    assert tr["wire_bytes"] == sum(s["wire_bytes"] for s in tr["stores"])
    assert tr["missing_shards"] == []


def test_time_shards_answer_what_one_range_answers(prom: str, fleet: Fleet) -> None:
    whole = _audit(prom, fleet, chunk_s=6 * 3600.0)
    sharded = _audit(prom, fleet, chunk_s=6 * 3600.0, shard_s=6 * 3600.0, concurrency=2)
    assert sharded.extra["fleet"]["transfer"]["time_shards"] == 5
    assert whole.extra["fleet"]["transfer"]["time_shards"] == 1
    assert sharded.usage.cells.equals(whole.usage.cells)
    assert [s for s in sharded.usage.series] == [s for s in whole.usage.series]
    fs, fw = sharded.extra["fleet"], whole.extra["fleet"]
    assert fs["showback"] == fw["showback"]
    assert fs["kpis"] == fw["kpis"]
    # and 6-hour chunks give the phases of day chunks: a point belongs to one chunk only
    day = _cells(_audit(prom, fleet))
    for key, cell in _cells(sharded).items():
        for f in PHASE_FIELDS:
            assert cell[f] == day[key][f], (key, f)


class _Flaky:
    """An HTTP proxy on 127.0.0.1 in front of a store: answers 500 to the requests
    ``fail(n, form)`` picks (n counts requests from 1, form is the query's form fields)."""

    def __init__(self, upstream: str, fail) -> None:  # type: ignore[no-untyped-def]
        self.upstream, self.fail, self.count, self.failed = upstream, fail, 0, 0
        lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    proxy.count += 1
                    n = proxy.count
                import hashlib
                from urllib.parse import parse_qs

                ctype = self.headers.get("Content-Type", "")
                # a query's form fields; a remote read's protobuf body stands as its digest
                form = {k: v[0] for k, v in parse_qs(body.decode()).items()} \
                    if "form-urlencoded" in ctype else \
                    {"body": hashlib.sha256(body).hexdigest()}
                out_type = "application/json"
                if proxy.fail(n, form):
                    with lock:
                        proxy.failed += 1
                    payload = b'{"status":"error","error":"internal error (injected)"}'
                    self.send_response(500)
                else:
                    sent = {k: v for k, v in self.headers.items() if k.lower() in (
                        "content-type", "content-encoding", "x-prometheus-remote-read-version")}
                    r = httpx.post(proxy.upstream + self.path, content=body, timeout=60,
                                   headers=sent)
                    payload = r.content
                    out_type = r.headers.get("Content-Type", out_type)
                    self.send_response(r.status_code)
                self.send_header("Content-Type", out_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Flaky:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_shard_answering_500_then_ok_is_retried(prom: str, fleet: Fleet) -> None:
    fast = {"backoff_s": 0.01, "retries": 3}
    seen: set[tuple[tuple[str, str], ...]] = set()
    lock = threading.Lock()

    def first_try_of_every_third(n: int, form: dict[str, str]) -> bool:
        # a request fails on its first attempt only, so its retry is never failed again
        # (n % 3 alone can fail one request's every retry when threads interleave)
        key = tuple(sorted(form.items()))
        with lock:
            fresh = key not in seen
            seen.add(key)
        return fresh and n % 3 == 0

    with _Flaky(prom, first_try_of_every_third) as flaky:
        got = _audit([flaky.url], fleet, client_kwargs=fast)
    assert flaky.failed > 10
    want = _audit(prom, fleet)
    assert got.usage.cells.equals(want.usage.cells)
    assert got.extra["fleet"]["transfer"]["requests"] == flaky.count  # 500s counted too


def test_a_dead_store_or_shard_is_a_clear_error_or_a_listed_gap(
        split: tuple[str, str], fleet: Fleet, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from fleetgen import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    base = ["fleet", "--start", str(fleet.start_s), "--end", str(fleet.end_s), "--step",
            str(fleet.step_s), "--price", "1", "--retries", "1", "--timeout", "5",
            "--no-progress", "--format", "json"]
    rc = main([*base, "--prometheus", f"eu={split[0]}", "--prometheus", f"us={dead}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "us" in err and dead in err and "--allow-partial" in err and "error:" in err
    out = tmp_path / "partial.json"
    rc = main([*base, "--prometheus", f"eu={split[0]}", "--prometheus", f"us={dead}",
               "--allow-partial", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    missing = report["extra"]["fleet"]["transfer"]["missing_shards"]
    assert [(m["store"], m["url"]) for m in missing] == [("us", dead)]
    assert any("shard missing" in n["reason"] for n in report["source"]["notes"])
    # a store that fails only for the later time shard: the error names that shard's range
    second_day = fleet.start_s + 86400

    def late(n: int, form: dict[str, str]) -> bool:  # the pushdown of the second day only
        return "kube_pod_labels" not in form.get("query", "") and \
            float(form.get("time", form.get("end", "0"))) > second_day

    with _Flaky(split[1], late) as flaky:
        rc = main([*base, "--prometheus", f"eu={split[0]}", "--prometheus",
                   f"us={flaky.url}", "--time-shard", "1d"])
    err = capsys.readouterr().err
    assert rc == 2 and "shard us 2024-01-02T00:00:15Z..2024-01-02T01:59:45Z" in err and flaky.url in err, err


def test_a_gpu_in_two_stores_is_refused_or_deduplicated(
        prom: str, split: tuple[str, str], fleet: Fleet) -> None:
    from gpuaudit.errors import InputError

    with pytest.raises(InputError, match=r"is in 2 stores \(all, eu\).*bill it twice"):
        _audit([f"all={prom}", f"eu={split[0]}"], fleet)
    deduped = _audit([f"all={prom}", f"eu={split[0]}"], fleet, dedupe=True)
    alone = _audit(prom, fleet)
    assert deduped.usage.cells.equals(alone.usage.cells)
    assert any(n.where == "--dedupe" for n in deduped.usage.notes)


def test_second_pass_queries_are_split_to_the_stores_query_length_limit(
        prom: str, fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second pass selects GPUs by a regex of their UUIDs and pods; at 1,000 GPUs its
    queries passed VictoriaMetrics' -search.maxQueryLen (16 KiB: HTTP 422). Batches are
    halved until every query fits: here a store limited to 1,000 bytes answers the whole
    audit, with the figures of one Prometheus."""
    import gpuaudit.classify.pushdown as pushdown

    limit = 1000
    monkeypatch.setattr(pushdown, "MAX_QUERY_BYTES", limit)
    with run_victoria_metrics(tmp_path / "vm",
                              extra_args=(f"-search.maxQueryLen={limit}",)) as url:
        import_victoria_metrics(fleet, url, tmp_path / "import")
        got = _audit([url], fleet)
    want = _audit(prom, fleet)
    mine, theirs = _cells(got), _cells(want)
    # (once in CI a day of util series was missing here: what the audit and the store said)
    log = (tmp_path / "vm.vm.log").read_text(errors="replace")[-3000:]
    assert mine.keys() == theirs.keys(), (sorted(theirs.keys() - mine.keys())[:5],
                                          got.usage.notes, got.extra["fleet"]["transfer"], log)
    for key, cell in theirs.items():
        for f in PHASE_FIELDS:
            assert mine[key][f] == cell[f], (key, f)
    assert _showback(got).keys() == _showback(want).keys()
    for team, entry in _showback(want).items():
        assert _showback(got)[team]["cost_usd"] == entry["cost_usd"], team
