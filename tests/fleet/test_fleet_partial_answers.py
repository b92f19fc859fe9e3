"""A store's partial answer is never taken for a whole one: the client asks stores to refuse
partial answers, asks again when one comes anyway, then errs; with ``allow_partial`` it
keeps the answer and counts it for the report's notes (httpx.MockTransport here; a real
Prometheus whose remote-read endpoint is down in test_fleet_partial_answers_real.py)."""

from __future__ import annotations

from urllib.parse import parse_qs

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.errors import PartialAnswerError, SourceUnavailableError
from gpuaudit.measure.fleet.prometheus import PromClient, partial_marks

#: the warning Prometheus' fanout storage gives when a remote-read endpoint fails
REMOTE_READ = ('error sending request: Post "http://127.0.0.1:1/api/v1/read": dial tcp '
               '127.0.0.1:1: connect: connection refused')


def _answer(warnings=None, is_partial=None, value="1") -> dict:
    body: dict = {"status": "success",
                  "data": {"resultType": "vector",
                           "result": [{"metric": {"gpu": "0"}, "value": [0, value]}]}}
    if warnings is not None:
        body["warnings"] = warnings
    if is_partial is not None:
        body["isPartial"] = is_partial
    return body


def _client(answers, seen=None, **kw) -> PromClient:
    it = iter(answers)

    def handler(req: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append({k: v[0] for k, v in parse_qs(req.content.decode()).items()})
        return httpx.Response(200, json=next(it))

    return PromClient("http://thanos.test", transport=httpx.MockTransport(handler),
                      sleep=lambda s: None, retries=2, **kw)


@pytest.mark.parametrize("read", ["query", "query_rows"])
def test_a_partial_answer_is_asked_again_then_an_error_naming_the_store_and_query(read):
    seen: list[dict] = []
    c = _client([_answer([REMOTE_READ])] * 3, seen)
    with pytest.raises(PartialAnswerError) as e:
        getattr(c, read)("DCGM_FI_DEV_GPU_UTIL", 1000.0)
    assert len(seen) == 3  # the first answer and two more asks (retries=2)
    assert "partial data" in e.value.what and "connection refused" in e.value.what
    assert "http://thanos.test/api/v1/query" in e.value.where
    assert "DCGM_FI_DEV_GPU_UTIL" in e.value.where
    assert "--allow-partial" in (e.value.fix or "")
    assert isinstance(e.value, SourceUnavailableError)  # a shard failing, as a store down
    # every ask said: refuse rather than leave a part out (Thanos, VictoriaMetrics cluster)
    assert all(s["partial_response"] == "false" and s["deny_partial_response"] == "1"
               for s in seen)


def test_an_answer_whole_on_the_second_ask_is_taken():
    c = _client([_answer([REMOTE_READ], value="1"), _answer(value="7")])
    assert c.query("x", 0.0) == [({"gpu": "0"}, 7.0)]
    assert c.partial_answers == {}


@pytest.mark.parametrize("read", ["query", "query_rows"])
def test_allow_partial_keeps_the_answer_counts_it_and_does_not_ask_to_refuse(read):
    seen: list[dict] = []
    c = _client([_answer([REMOTE_READ], value="5")] * 2 + [_answer(is_partial=True)], seen,
                allow_partial=True)
    got = getattr(c, read)("a", 0.0)
    assert (got == [({"gpu": "0"}, 5.0)]) if read == "query" else (got[1] == [5.0])
    getattr(c, read)("b", 0.0)
    getattr(c, read)("c", 0.0)
    assert len(seen) == 3  # kept at once: no second ask
    assert not any("partial_response" in s or "deny_partial_response" in s for s in seen)
    isp = partial_marks(None, True)[0]
    assert c.partial_answers == {REMOTE_READ: [2, "a"], isp: [1, "c"]}


def test_promql_annotations_are_not_a_part_left_out():
    notes = ["PromQL info: metric might not be a counter, name does not end in _total/_sum/"
             "_count/_bucket: \"DCGM_FI_DEV_GPU_UTIL\" (1:6)",
             "PromQL warning: encountered a mix of histograms and floats for aggregation"]
    c = _client([_answer(notes)])
    assert c.query("rate(DCGM_FI_DEV_GPU_UTIL[5m])", 0.0) == [({"gpu": "0"}, 1.0)]
    assert c.partial_answers == {}


def test_victoriametrics_is_partial_without_a_warning_is_partial():
    c = _client([_answer(is_partial=True)] * 3)
    with pytest.raises(PartialAnswerError, match="isPartial"):
        c.query("x", 0.0)
    assert partial_marks([], False) == [] and partial_marks(None, None) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=40),
                          st.sampled_from(["PromQL info: x", "PromQL warning: y"])), max_size=5),
       st.one_of(st.none(), st.booleans()))
def test_partial_marks_keep_every_warning_but_annotations(warnings, is_partial):
    marks = partial_marks(warnings, is_partial)
    kept = [w for w in warnings if not w.startswith(("PromQL info:", "PromQL warning:"))]
    assert marks[:len(kept)] == kept
    # a partial flag with no warning still says so; nothing partial says nothing
    assert len(marks) == len(kept) + (1 if is_partial is True and not kept else 0)


def test_a_partial_labels_answer_is_asked_of_the_series_api():
    """Prometheus with remote_read answers /api/v1/labels from its own TSDB only, with the
    warning "not implemented": the series API goes where queries go."""
    asked: list[str] = []
    series = {"status": "success", "data": [{"__name__": "DCGM_FI_PROF_SM_ACTIVE", "gpu": "0",
                                             "Hostname": "n1"}]}

    def handler(req: httpx.Request) -> httpx.Response:
        asked.append(req.url.path)
        if req.url.path.endswith("/labels"):
            return httpx.Response(200, json={"status": "success", "data": [],
                                             "warnings": ["not implemented"]})
        return httpx.Response(200, json=series)

    c = PromClient("http://prom.test", transport=httpx.MockTransport(handler),
                   sleep=lambda s: None)
    assert c.label_names("DCGM_FI_PROF_SM_ACTIVE", 0.0, 60.0) == ["Hostname", "__name__", "gpu"]
    assert asked == ["/api/v1/labels", "/api/v1/series"]  # the labels API asked once
    series["warnings"] = [REMOTE_READ]  # the series API partial too: an error
    with pytest.raises(PartialAnswerError, match="connection refused"):
        c.label_names("DCGM_FI_PROF_SM_ACTIVE", 0.0, 60.0)


def test_a_store_whose_warnings_differ_query_by_query_gets_a_few_notes_and_a_count():
    from gpuaudit.api.fleet import _PARTIAL_NOTES, _partial_notes

    answers = [_answer([f"fetch series for block {i:03d}: store gateway down"])
               for i in range(12)] + [_answer(["the same one"])] * 3
    c = _client(answers, allow_partial=True)
    for i in range(len(answers)):
        c.query(f"q{i}", 0.0)
    notes = _partial_notes({"thanos": c})
    assert len(notes) == _PARTIAL_NOTES + 1
    assert notes[0].count == 3 and "the same one" in notes[0].reason  # the most frequent first
    assert sum(n.count for n in notes) == len(answers)  # every partial answer counted once
    assert "8 other warning(s)" in notes[-1].reason
