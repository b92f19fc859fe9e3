"""The Prometheus client's retries, errors, chunking and escaping (httpx.MockTransport, and
the real server for escaping)."""

from __future__ import annotations

import itertools
import json
import re

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.errors import InputError, SourceUnavailableError
from gpuaudit.measure.fleet.prometheus import (
    PromClient,
    escape_label_value,
    selector,
    time_chunks,
)


def _vector(value: float = 1.0) -> dict:
    return {"status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {"a": "b"},
                                                         "value": [0, str(value)]}]}}


def client(handler, **kw) -> PromClient:
    return PromClient("http://prom.test", transport=httpx.MockTransport(handler),
                      sleep=lambda s: None, **kw)


def test_5xx_is_retried_then_succeeds():
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) < 3:
            return httpx.Response(503, json={"status": "error", "error": "busy"})
        return httpx.Response(200, json=_vector(7))

    c = client(handler, retries=4)
    assert c.query("up", 0) == [({"a": "b"}, 7.0)]
    assert len(calls) == 3


def test_down_server_gives_up_after_bounded_retries():
    calls = []
    sleeps: list[float] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ConnectError("refused", request=req)

    c = PromClient("http://prom.test", transport=httpx.MockTransport(handler), retries=3,
                   backoff_s=0.5, max_backoff_s=1.5, sleep=sleeps.append)
    with pytest.raises(SourceUnavailableError, match="after 4 attempt"):
        c.query("up", 0)
    assert len(calls) == 4
    assert sleeps == [0.5, 1.0, 1.5]  # exponential, capped


def test_real_closed_port_is_source_unavailable():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = PromClient(f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01, timeout_s=2)
    with pytest.raises(SourceUnavailableError):
        c.query("up", 0)


def test_bad_query_is_an_input_error_with_the_query():
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"status": "error", "errorType": "bad_data",
                                         "error": "parse error"})

    with pytest.raises(InputError, match="parse error"):
        client(handler).query("up{", 0)


def test_too_large_ranges_are_split_until_they_fit():
    seen: list[int] = []

    def handler(req: httpx.Request) -> httpx.Response:
        form = dict(x.split("=") for x in req.content.decode().split("&"))
        start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
        points = round((end - start) / step) + 1
        seen.append(points)
        if points > 40:
            return httpx.Response(400, json={
                "status": "error", "errorType": "bad_data",
                "error": "exceeded maximum resolution of 11,000 points per timeseries"})
        vals = [[start + i * step, "1"] for i in range(points)]
        return httpx.Response(200, json={"status": "success", "data": {
            "resultType": "matrix", "result": [{"metric": {}, "values": vals}]}})

    c = client(handler)
    parts = list(c.query_range("x", 0, 999 * 15, 15, max_points=300))
    ts = [t for p in parts for r in p for t in r.ts_ns.tolist()]
    assert ts == [i * 15 * 1_000_000_000 for i in range(1000)]  # every point once, in order
    assert max(p for p in seen if p <= 40) <= 40


#: stores' answers refusing a query as too big, as their sources write them: Prometheus
#: (promql/engine.go), VictoriaMetrics 1.79.5 (app/vmselect/netstorage/netstorage.go, and the
#: real store in tests/fleet/test_fleet_query_limits.py), Grafana Mimir
#: (pkg/util/limiter/query_limiter.go, with its error id and advice), Thanos' Store Gateway
#: (pkg/store/bucket.go and limiter.go, as its querier passes them on) and Cortex
#: (pkg/frontend/transport/handler.go)
TOO_LARGE = [
    (422, "query processing would load too many samples into memory in query execution"),
    (422, 'error when executing query="sum_over_time(x[1d])" for (time=1704160785000, '
          "step=300000): cannot select more than -search.maxSamplesPerQuery=40000 samples; "
          "possible solutions: to increase the -search.maxSamplesPerQuery"),
    (422, "the query exceeded the maximum number of chunks (limit: 2000000 chunks) "
          "(err-mimir-max-chunks-per-query). Consider reducing the time range and/or number "
          "of series selected by the query. One way to reduce the number of selected series "
          "is to add more label matchers to the query. Otherwise, to adjust the related "
          "per-tenant limit, configure -querier.max-fetched-chunks-per-query, or contact "
          "your service administrator."),
    (422, "the query exceeded the aggregated chunks size limit (limit: 100 bytes) "
          "(err-mimir-max-chunks-bytes-per-query)"),
    (422, "receive series from Addr: 10.0.0.7:10901 LabelSets: {store=\"gw-0\"} MinTime: "
          "1704067200000 MaxTime: 1704153600000: rpc error: code = Unknown desc = exceeded "
          "chunks limit: limit 1000 violated (got 1012)"),
    (503, "rpc error: code = Aborted desc = fetch series for block 01HM: preload chunks: "
          "exceeded bytes limit: limit 10485760 violated (got 10486001)"),
    (422, "expanded matching posting: exceeded samples limit: limit 120000 violated "
          "(got 120120)"),
    (422, "the query hit the max number of chunks limit (limit: 2000000 chunks)"),
]


@pytest.mark.parametrize(("status", "text"), TOO_LARGE)
def test_a_stores_too_large_answer_is_query_too_large(status: int, text: str) -> None:
    from gpuaudit.errors import QueryTooLarge

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"status": "error", "errorType": "execution",
                                            "error": text})

    with pytest.raises(QueryTooLarge) as e:
        client(handler).query("sum_over_time(x[1d])", 0)
    assert e.value.by_chunk


@pytest.mark.parametrize("text", [
    "the query exceeded the maximum number of series (limit: 1 series) "
    "(err-mimir-max-series-per-query)",
    "rpc error: code = Unknown desc = exceeded series limit: limit 10 violated (got 12)",
])
def test_too_many_series_is_not_too_large_for_a_shorter_range(text: str) -> None:
    """Mimir's and Thanos' series limits: a shorter chunk selects as many series, so it is
    the plain error it was, not a reason to cut the chunk."""
    from gpuaudit.errors import QueryTooLarge

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"status": "error", "errorType": "execution",
                                         "error": text})

    with pytest.raises(InputError) as e:
        client(handler).query("x", 0)
    assert not isinstance(e.value, QueryTooLarge)
    assert text[:40] in e.value.what


def test_bearer_token_file_is_sent(tmp_path):
    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    got = []

    def handler(req: httpx.Request) -> httpx.Response:
        got.append(req.headers.get("authorization"))
        return httpx.Response(200, json=_vector())

    client(handler, bearer_token_file=tok).query("up", 0)
    assert got == ["Bearer s3cret"]


def test_unauthorized_is_not_retried():
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(401, text="no")

    with pytest.raises(SourceUnavailableError, match="credentials"):
        client(handler).query("up", 0)
    assert len(calls) == 1


@given(st.integers(0, 10**6), st.integers(0, 3000), st.sampled_from([1.0, 15.0, 60.0]),
       st.integers(1, 500))
def test_time_chunks_cover_every_step_once(a0, k, step, max_points):
    a = a0 * step
    b = a + k * step
    chunks = time_chunks(a, b, step, max_points)
    pts = []
    for x, y in chunks:
        n = round((y - x) / step) + 1
        assert n <= max_points
        pts += [x + i * step for i in range(n)]
    expected = int((b - a) // step) + 1
    assert len(pts) == expected
    assert all(q > p for p, q in itertools.pairwise(pts))


def _unescape(body: str) -> str:
    return json.loads('"' + body + '"', strict=False)


@given(st.text())
def test_escaped_label_values_round_trip_and_cannot_close_the_string(value):
    body = escape_label_value(value)
    assert _unescape(body) == value
    # every quote inside is escaped: the string cannot end early
    assert not re.search(r'(?<!\\)(?:\\\\)*"', body)


def test_label_names_are_checked():
    with pytest.raises(InputError):
        selector({'a"}) or vector(1) #': "x"})


@settings(max_examples=25, deadline=None)
@given(st.text(min_size=1, max_size=30))
def test_hostile_label_values_do_not_break_real_promql(prom, value):
    c = PromClient(prom, retries=0)
    # matches nothing, and must parse: no injection, no error
    assert c.query(f"DCGM_FI_DEV_GPU_UTIL{selector({'Hostname': value})}", 1_704_067_200) \
        == [] or value in ("ip-10-0-0-0.ec2.internal",)


@pytest.mark.parametrize("coding", ["gzip", "identity", "deflate"])
def test_a_gzip_body_is_inflated_here_and_counted(coding: str) -> None:
    """post_raw(gzip=True) asks for gzip and inflates the body itself (ISA-L), whatever
    coding the server answers in (one it did not ask for is decoded by httpx); the
    wire bytes count the compressed body, the decoded bytes the inflated one."""
    import gzip as gz
    import zlib

    body = b'{"metric":{"__name__":"m"},"values":[1],"timestamps":[2]}\n' * 2000
    asked: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        asked.append(req.headers.get("accept-encoding", ""))
        if coding == "gzip":
            wire = gz.compress(body)
        elif coding == "deflate":
            wire = zlib.compress(body)
        else:
            wire = body
        headers = {} if coding == "identity" else {"content-encoding": coding}
        # (a stream, as a network answer: not read before the client reads it)
        return httpx.Response(200, headers=headers, stream=httpx.ByteStream(wire))

    c = client(handler)
    resp = c.post_raw("/api/v1/export", data={"match[]": "m"}, gzip=True)
    assert resp.status_code == 200 and resp.content == body
    assert asked == ["gzip"]
    assert c.body_bytes == len(body)
    assert c.wire_bytes < len(body) if coding != "identity" else c.wire_bytes == len(body)


def test_a_gzip_body_that_does_not_inflate_is_retried_then_an_error() -> None:
    calls: list[int] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(200, headers={"content-encoding": "gzip"},
                              stream=httpx.ByteStream(b"\x1f\x8b\x08\x00not gzip at all"))

    c = client(handler, retries=2)
    with pytest.raises(SourceUnavailableError, match="does not inflate"):
        c.post_raw("/api/v1/export", data={"match[]": "m"}, gzip=True)
    assert len(calls) == 3
