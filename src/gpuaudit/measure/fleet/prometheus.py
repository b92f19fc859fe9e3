"""Prometheus (and Thanos, Mimir, VictoriaMetrics) over the HTTP API, with httpx.

Reads ``/api/v1/query`` (instant) and ``/api/v1/query_range`` (POSTed form, so long PromQL
never hits a URL length limit). What a fleet pull needs and this module does:

- auth: a bearer token from a file (re-read on every request, for rotated service-account
  tokens) or an environment variable, HTTP basic auth, a custom CA bundle;
- a timeout per request, bounded retries with exponential backoff on connection errors,
  timeouts, 429 and 5xx; then :class:`~gpuaudit.errors.SourceUnavailableError`;
- long ranges split into chunks (at most 11,000 points per series, the server's limit), and a
  chunk the server refuses as too big (``exceeded maximum resolution of 11,000 points per
  timeseries``, ``query processing would load too many samples into memory``) split in half
  until it fits;
- a partial answer never taken for a whole one: every query asks the store to refuse
  rather than leave a part out (Thanos' ``partial_response=false``, VictoriaMetrics
  cluster's ``deny_partial_response=1``), and an answer that still says it is partial (a
  ``warnings`` entry other than PromQL's own annotations: a remote-read endpoint or a store
  gateway it could not reach; VictoriaMetrics' ``isPartial``) is asked again, then an
  error, :class:`~gpuaudit.errors.PartialAnswerError`. With ``allow_partial`` (``gpuaudit
  fleet --allow-partial``) it is kept and counted per warning (``partial_answers``), for
  the report's notes;
- bytes moved counted (``wire_bytes``: as downloaded; ``body_bytes``: decoded), requests
  counted, for the benchmark and the report;
- progress reported through a hook (``ProgressHook``); the CLI draws it
  (``gpuaudit.report.progress.progress_bars``).

:class:`PrometheusSource` is the raw-pull path: ``query_range`` of the dcgm-exporter series at
``step`` into sample-table batches (chunk by chunk, each GPU's rows in time order), for the
normal classify stage.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuaudit.errors import (
    InputError,
    PartialAnswerError,
    QueryTooLarge,
    SourceUnavailableError,
)
from gpuaudit.measure.fleet.dcgm import UTIL_METRICS
from gpuaudit.promql import (
    NODE_CPU,
    duration,
    escape_label_value,
    fresh,
    node_cpu_pct,
    selector,
    time_chunks,
)
from gpuaudit.schema import ImportNote

__all__ = [
    "MAX_POINTS_PER_SERIES",
    "PromClient",
    "PrometheusSource",
    "QueryTooLarge",
    "RangeResult",
    "escape_label_value",
    "selector",
]

#: Prometheus refuses query_range answers of more than 11,000 points per series.
MAX_POINTS_PER_SERIES = 11_000
#: what a store says refusing a query as too big for limits a shorter time range eases
#: (Prometheus; VictoriaMetrics' flags, which its messages name: samples per query and per
#: series, points per series of a range query or a subquery; Grafana Mimir's error ids:
#: chunks, chunk bytes and memory a query fetches; Thanos Store Gateway's chunks, bytes and
#: samples limits (``--store.limits.request-samples``, ``--store.grpc.*-limit``), and
#: Cortex's chunks and bytes limits. Not the number of series: a shorter range holds as many)
_TOO_LARGE = ("exceeded maximum resolution", "too many samples", "would load too many",
              "maximum number of samples", "query would return too many",
              "-search.maxSamplesPerQuery", "-search.maxSamplesPerSeries",
              "-search.maxPointsPerTimeseries", "-search.maxPointsSubqueryPerTimeseries",
              "err-mimir-max-chunks-per-query", "err-mimir-max-chunks-bytes-per-query",
              "err-mimir-max-estimated-chunks-per-query",
              "err-mimir-max-estimated-memory-consumption-per-query",
              "exceeded chunks limit", "exceeded bytes limit", "exceeded samples limit",
              "the query hit the max number of chunks limit",
              "the query hit the aggregated chunks size limit",
              "the query hit the aggregated data size limit")
#: asked with every query unless partial answers are allowed: Thanos Query's and
#: VictoriaMetrics cluster's switches to refuse an answer that would leave out a store or
#: node they could not reach (Prometheus, Mimir and VictoriaMetrics single ignore them)
_NO_PARTIAL = {"partial_response": "false", "deny_partial_response": "1"}
#: ``warnings`` entries that are PromQL's notes on the query itself, not a part left out
_ANNOTATIONS = ("PromQL info:", "PromQL warning:")


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """``http://user:pass@host/p`` -> (``http://host/p``, (user, pass)); no userinfo: None."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return clean, (unquote(parts.username or ""), unquote(parts.password or ""))


def read_token_file(path: Path, *, warn: bool = True) -> str:
    """The bearer token in ``path``: one line (a trailing newline is fine). Its content is
    never shown, in errors or anywhere else. A file others can read gets a warning (once)."""
    try:
        raw = path.read_bytes()
        mode = path.stat().st_mode
    except OSError as exc:
        raise InputError(f"cannot read bearer token file: {exc.strerror or exc}",
                         where=str(path), fix="give a readable file holding the token") from exc
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InputError("the bearer token file is not UTF-8 text (content not shown)",
                         where=str(path), fix="write the token alone, as text") from None
    if not token:
        raise InputError("the bearer token file is empty", where=str(path),
                         fix="write the token into it")
    if any(c in token for c in "\r\n") or not token.isprintable():
        lines = token.count("\n") + 1
        raise InputError(
            f"the bearer token file holds {lines} lines or control characters; a token is "
            "one line (content not shown)", where=str(path),
            fix="write the token alone on one line, e.g. kubectl create token ... > FILE")
    if warn and mode & 0o004:
        logging.getLogger(__name__).warning(
            "%s: the bearer token file is readable by every user of this machine; "
            "chmod 600 it", path)
    return token


@dataclass(frozen=True)
class RangeResult:
    """One series of a range query: its labels, timestamps (ns) and float64 values."""

    labels: dict[str, str]
    ts_ns: np.ndarray
    values: np.ndarray


ProgressHook = Callable[[str, int], Callable[[int], None]]


@dataclass
class PromClient:
    """A Prometheus HTTP API client: auth, timeouts, bounded retries, chunking, byte counts.

    ``bearer_token_file`` is read on every request; ``bearer_token_env`` names an environment
    variable holding the token. ``transport`` lets tests inject ``httpx.MockTransport``.
    ``allow_partial``: a partial answer is kept (see the module's docstring) and counted in
    ``partial_answers``: the store's warning -> [answers, the first query].
    """

    url: str
    bearer_token_file: str | Path | None = None
    bearer_token_env: str | None = None
    basic_auth: tuple[str, str] | None = None
    ca_file: str | Path | None = None
    timeout_s: float = 60.0
    retries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    transport: httpx.BaseTransport | None = None
    progress: ProgressHook | None = None
    sleep: Callable[[float], None] = time.sleep
    wire_bytes: int = 0
    body_bytes: int = 0
    requests: int = 0
    #: requests in flight at most (threads share the client: time shards, query workers)
    max_in_flight: int = 8
    allow_partial: bool = False
    partial_answers: dict[str, list[Any]] = field(default_factory=dict)
    _client: httpx.Client | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise InputError(f"Prometheus URL {self.url!r} has no http:// or https://",
                             fix="give the server's base URL, e.g. http://prometheus:9090")
        # credentials in the URL become basic auth, and the URL everything shows (origins,
        # errors, reports) is the one without them
        self.url, userinfo = split_userinfo(self.url)
        if userinfo is not None and self.basic_auth is None:
            self.basic_auth = userinfo
        self._token_checked = False
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max(1, self.max_in_flight))
        verify: Any = True
        if self.ca_file is not None:
            if not Path(self.ca_file).is_file():
                raise InputError(f"CA bundle {self.ca_file} not found", where=str(self.ca_file),
                                 fix="give a PEM file with the server's CA (--ca-file)")
            import ssl

            verify = ssl.create_default_context(cafile=str(self.ca_file))
        auth = httpx.BasicAuth(*self.basic_auth) if self.basic_auth else None
        limits = httpx.Limits(max_connections=max(1, self.max_in_flight),
                              max_keepalive_connections=max(1, self.max_in_flight))
        self._client = httpx.Client(timeout=self.timeout_s, verify=verify, auth=auth,
                                    transport=self.transport, limits=limits)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> PromClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        token: str | None = None
        if self.bearer_token_file is not None:
            token = read_token_file(Path(self.bearer_token_file), warn=not self._token_checked)
            self._token_checked = True
        elif self.bearer_token_env:
            token = os.environ.get(self.bearer_token_env)
            if not token:
                raise InputError(f"environment variable {self.bearer_token_env} is empty",
                                 fix="export the bearer token in it, or use --bearer-token-file")
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _post(self, path: str, data: Mapping[str, str]) -> Any:
        """POST ``data`` to ``path``; the answer's ``data`` object, decoded."""
        return self._post_as(path, data, _decode_any)

    def _post_as(self, path: str, data: Mapping[str, str],
                 decode: Callable[[bytes], tuple[Any, list[str]]]) -> Any:
        """POST ``data`` to ``path`` (retries, errors, byte counts, partial answers);
        ``decode`` turns the body into what the caller wants and the store's marks of a
        partial answer (``ValueError``: not the Prometheus API)."""
        for _attempt in self._attempts():  # a part the store could not reach may be back
            value, partial = self._ask(path, data, decode)
            if not partial or self.allow_partial:
                break
        if partial:
            self._partial(f"{self.url}{path}", data, partial)
        return value

    def _ask(self, path: str, data: Mapping[str, str],
             decode: Callable[[bytes], tuple[Any, list[str]]]) -> tuple[Any, list[str]]:
        """One answer to ``data`` at ``path`` (a busy store's retries aside), decoded, and
        its marks of a partial answer, as they are."""
        where = f"{self.url}{path}"

        def busy(resp: httpx.Response) -> str:
            text = _error_text(resp)
            if any(m in text for m in _TOO_LARGE):
                raise QueryTooLarge(text, where=where, fix="use a smaller chunk")
            return f"HTTP {resp.status_code}: {text}"

        form = dict(data) if self.allow_partial else {**data, **_NO_PARTIAL}
        resp = self._send(where, busy, "Prometheus", data=form)
        text = _error_text(resp)
        if resp.status_code != 200:
            if any(m in text for m in _TOO_LARGE):
                raise QueryTooLarge(text, where=where, fix="use a smaller chunk or step")
            raise InputError(f"Prometheus rejected the query (HTTP {resp.status_code}): "
                             f"{text}", where=f"{where} query={data.get('query', '')!r}",
                             fix="check the selector and the time range")
        try:  # msgspec: ~3x faster than json on the large pushdown answers
            got: tuple[Any, list[str]] = decode(resp.content)
        except ValueError as exc:  # msgspec.DecodeError too
            raise SourceUnavailableError(
                "answer is not JSON: is this the Prometheus API?", where=where,
                fix="give the server's base URL (without /api/v1)") from exc
        return got

    def _partial(self, where: str, data: Mapping[str, str], partial: list[str]) -> None:
        """A partial answer: counted under ``allow_partial``, else the error that says so."""
        query = data.get("query") or data.get("match[]", "")
        if not self.allow_partial:
            raise PartialAnswerError(
                f"the store answered with partial data after {self.retries + 1} attempt(s): "
                f"{partial[0]}", where=f"{where} query={query!r}",
                fix="bring back what the store could not reach (the warning names it: a "
                "remote-read endpoint, a Thanos store, a vmstorage node) and run again; "
                "`gpuaudit fleet --allow-partial` audits what it answered (the report notes "
                "each partial answer)")
        with self._lock:
            for warning in partial:
                seen = self.partial_answers.setdefault(warning, [0, query])
                seen[0] += 1

    def post_raw(self, path: str, *, content: bytes | None = None,
                 data: Mapping[str, str] | None = None,
                 headers: Mapping[str, str] | None = None,
                 gzip: bool = False) -> httpx.Response:
        """POST to ``path`` with this client's auth, retries (connection errors, timeouts,
        429, 5xx) and byte counts; the response of any other status is returned as it is
        (the caller reads its body: remote read's protobuf frames, export's JSON lines).
        ``gzip``: ask for the body gzip-compressed and inflate it here with ISA-L
        (:func:`~gpuaudit.limits.inflate_gzip_bytes`: ~3x zlib's speed, within the
        decompressed-size limit) instead of httpx's zlib decoder, for bodies of hundreds
        of MB."""
        return self._send(f"{self.url}{path}",
                          lambda resp: f"HTTP {resp.status_code}: {resp.text[:300]}",
                          "the store", content=content,
                          data=dict(data) if data is not None else None, headers=headers,
                          gzip=gzip)

    def _post_gzip(self, where: str, content: bytes | None, data: dict[str, str] | None,
                   headers: Mapping[str, str]) -> tuple[httpx.Response, int]:
        """One POST asking for a gzip body, read compressed and inflated by
        :func:`~gpuaudit.limits.inflate_gzip_bytes`: the response (body inflated, no
        Content-Encoding) and the bytes that came over the wire."""
        from gpuaudit.limits import inflate_gzip_bytes

        assert self._client is not None
        req = self._client.build_request("POST", where, content=content, data=data,
                                         headers={**headers, "Accept-Encoding": "gzip"})
        resp = self._client.send(req, stream=True)
        if resp.is_stream_consumed:  # (a transport that hands over a read answer: decoded)
            return resp, resp.num_bytes_downloaded
        try:
            raw = b"".join(resp.iter_raw())
        finally:
            resp.close()
        if resp.headers.get("content-encoding", "").strip().lower() != "gzip":
            # (identity, or another coding the server chose: httpx decodes it on reading)
            return httpx.Response(resp.status_code, headers=resp.headers, content=raw,
                                  request=req), len(raw)
        try:
            body = inflate_gzip_bytes(raw, where)
        except (zlib.error, EOFError) as exc:
            raise httpx.DecodingError(f"the gzip body does not inflate: {exc}") from exc
        kept = [(k, v) for k, v in resp.headers.multi_items()
                if k.lower() not in ("content-encoding", "content-length")]
        return httpx.Response(resp.status_code, headers=kept, content=body,
                              request=req), len(raw)

    def _attempts(self) -> Iterator[int]:
        """``retries + 1`` attempts, sleeping between them with exponential backoff
        (``backoff_s`` doubling, capped at ``max_backoff_s``)."""
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(min(delay, self.max_backoff_s))
                delay *= 2
            yield attempt

    def _send(self, where: str, busy: Callable[[httpx.Response], str], who: str, *,
              content: bytes | None = None, data: dict[str, str] | None = None,
              headers: Mapping[str, str] | None = None,
              gzip: bool = False) -> httpx.Response:
        """The one POST loop: auth headers per attempt, retries with exponential backoff on
        connection errors, timeouts, 429 and 5xx (``busy`` says what such an answer was, or
        raises), byte counts, refused credentials an error naming ``who``; any other answer
        is returned. ``gzip``: see :meth:`post_raw`."""
        assert self._client is not None
        last = ""
        for _attempt in self._attempts():
            try:
                with self._slots:
                    hdrs = {**self._headers(), **(headers or {})}
                    if gzip:
                        resp, wire = self._post_gzip(where, content, data, hdrs)
                    else:
                        resp = self._client.post(where, content=content, data=data,
                                                 headers=hdrs)
                        wire = resp.num_bytes_downloaded
            except httpx.TimeoutException as exc:
                last = f"timed out after {self.timeout_s:g} s ({exc.__class__.__name__})"
                continue
            except (httpx.LocalProtocolError, httpx.UnsupportedProtocol,
                    httpx.InvalidURL) as exc:  # ours, not the network's: retrying cannot help
                # (the message of a bad header may quote the header, i.e. the token)
                raise InputError(f"cannot send the request ({exc.__class__.__name__})",
                                 where=where, fix="check the URL and the credentials' form "
                                 "(one line, printable characters)") from None
            except httpx.HTTPError as exc:
                last = f"{exc.__class__.__name__}: {exc}"
                continue
            with self._lock:
                self.requests += 1
                self.wire_bytes += wire
                self.body_bytes += len(resp.content)
            if resp.status_code == 429 or resp.status_code >= 500:
                last = busy(resp)
                continue
            if resp.status_code in (401, 403):
                raise SourceUnavailableError(
                    f"{who} refused the credentials (HTTP {resp.status_code})",
                    where=where, fix="check --bearer-token-file / --bearer-token-env / "
                    "--basic-auth")
            return resp
        raise SourceUnavailableError(
            f"{who.removeprefix('the ')} unavailable after {self.retries + 1} attempt(s): "
            f"{last}",
            where=where, fix="check the server is up and reachable; --timeout and --retries "
            "raise the patience")

    # -- API ------------------------------------------------------------------------------
    def query(self, expr: str, time_s: float) -> list[tuple[dict[str, str], float]]:
        """``/api/v1/query`` at ``time_s``: (labels, value) per series (vector results)."""
        data = self._post("/api/v1/query", {"query": expr, "time": _fmt_time(time_s)})
        if data.get("resultType") == "scalar":
            return [({}, float(data["result"][1]))]
        return [(dict(r.get("metric", {})), float(r["value"][1])) for r in data.get("result", [])]

    def query_rows(self, expr: str, time_s: float) -> tuple[list[bytes], list[float]]:
        """``/api/v1/query`` at ``time_s`` for many series: each series' label object as
        its JSON text (a cache key, decoded only once per series) and its value. The label
        objects are not parsed: a fleet's answers repeat the same series in every query."""
        rows: tuple[list[bytes], list[float]] = self._post_as(
            "/api/v1/query", {"query": expr, "time": _fmt_time(time_s)}, _decode_rows)
        return rows

    def query_samples(self, expr: str, time_s: float) -> list[list[float]]:
        """``/api/v1/query`` of a range selector (``m{...}[1h]``) at ``time_s``: each series'
        raw sample timestamps (seconds), as stored."""
        data = self._post("/api/v1/query", {"query": expr, "time": _fmt_time(time_s)})
        return [[float(v[0]) for v in r.get("values", [])] for r in data.get("result", [])]

    def label_names(self, match: str, start_s: float, end_s: float) -> list[str]:
        """``/api/v1/labels`` of the series ``match`` selects in [start, end]: an index
        lookup that reads no samples (an empty list: no such series). A partial answer is
        asked of ``/api/v1/series`` instead."""
        form = {"match[]": match, "start": _fmt_time(start_s), "end": _fmt_time(end_s)}
        data, partial = self._ask("/api/v1/labels", form, _decode_any)
        if partial:
            # the labels API reaches less than queries do where a store answers from
            # others (Prometheus' remote_read: "not implemented"): the series API goes
            # where queries go, and its own partial answer is one
            data = sorted({k for s in self._post("/api/v1/series", form) or [] for k in s})
        return [str(x) for x in data or []]

    def query_range_once(self, expr: str, start_s: float, end_s: float,
                         step_s: float) -> list[RangeResult]:
        """One ``/api/v1/query_range`` call (no chunking)."""
        data = self._post("/api/v1/query_range", {
            "query": expr, "start": _fmt_time(start_s), "end": _fmt_time(end_s),
            "step": f"{step_s:g}"})
        out = []
        for r in data.get("result", []):
            vals = r.get("values", [])
            arr = np.array(vals, dtype=object).reshape(-1, 2) if vals else np.zeros((0, 2))
            ts = np.round(arr[:, 0].astype(np.float64) * 1e9).astype(np.int64)
            out.append(RangeResult(dict(r.get("metric", {})), ts, arr[:, 1].astype(np.float64)))
        return out

    def query_range(self, expr: str, start_s: float, end_s: float, step_s: float, *,
                    max_points: int = MAX_POINTS_PER_SERIES) -> Iterator[list[RangeResult]]:
        """``query_range`` split into chunks of at most ``max_points`` steps, yielded in time
        order; a chunk the server finds too big is halved (down to one step) and retried."""
        for a, b in time_chunks(start_s, end_s, step_s, max_points):
            yield from self._range_split(expr, a, b, step_s)

    def _range_split(self, expr: str, a: float, b: float, step_s: float,
                     ) -> Iterator[list[RangeResult]]:
        try:
            yield self.query_range_once(expr, a, b, step_s)
        except QueryTooLarge:
            n = round((b - a) / step_s)
            if n < 1:
                raise
            mid = a + (n // 2) * step_s
            yield from self._range_split(expr, a, mid, step_s)
            yield from self._range_split(expr, mid + step_s, b, step_s)


def _decode_any(content: bytes) -> tuple[Any, list[str]]:
    body = msgspec.json.decode(content)
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    return body.get("data", {}), partial_marks(body.get("warnings"), body.get("isPartial"))


def partial_marks(warnings: Any, is_partial: Any) -> list[str]:
    """What in an answer says it leaves a part out: its ``warnings`` but PromQL's own
    annotations (Prometheus 2.4x put "PromQL info: metric might not be a counter..." there),
    and VictoriaMetrics' ``isPartial`` flag (which comes with no text)."""
    marks = [str(w) for w in warnings or () if not str(w).startswith(_ANNOTATIONS)]
    if is_partial is True and not marks:
        marks.append("the store marked its answer isPartial (a storage node did not answer)")
    return marks


class _Row(msgspec.Struct):
    metric: msgspec.Raw = msgspec.Raw(b"{}")
    value: tuple[float, str] = (0.0, "NaN")


class _RowsData(msgspec.Struct):
    resultType: str = ""
    result: msgspec.Raw = msgspec.Raw(b"[]")


class _RowsBody(msgspec.Struct):
    data: _RowsData = msgspec.field(default_factory=_RowsData)
    warnings: list[Any] = msgspec.field(default_factory=list)
    isPartial: bool = False  # (VictoriaMetrics' name)


_ROWS = msgspec.json.Decoder(_RowsBody)
_VECTOR = msgspec.json.Decoder(list[_Row])
_SCALAR = msgspec.json.Decoder(tuple[float, str])


def _decode_rows(content: bytes) -> tuple[tuple[list[bytes], list[float]], list[str]]:
    """An instant query's answer -> (label objects as JSON text, values) and its marks of
    a partial answer; a scalar answer is one series with no labels. Values are Prometheus'
    strings (``"NaN"``, ``"+Inf"``)."""
    try:
        body = _ROWS.decode(content)
        data = body.data
        partial = partial_marks(body.warnings, body.isPartial)
        if data.resultType == "scalar":
            _t, v = _SCALAR.decode(data.result)
            return ([b"{}"], [float(v)]), partial
        rows = _VECTOR.decode(data.result)
        return ([bytes(r.metric) for r in rows], [float(r.value[1]) for r in rows]), partial
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from exc


def _fmt_time(t: float) -> str:
    return f"{t:.3f}"


def _error_text(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        return str(body.get("error") or body)
    except ValueError:
        return resp.text[:300]


# -- raw pull ---------------------------------------------------------------------------
#: The series pulled by the raw path (dcgm-exporter names, converted by gpuaudit.measure.fleet.dcgm).
RAW_METRICS: tuple[str, ...] = (
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_DEV_XID_ERRORS",
)


class PrometheusSource:
    """dcgm-exporter series pulled from Prometheus with ``query_range`` at ``step_s``, as a
    :class:`~gpuaudit.schema.SampleSource` (one batch per time chunk).

    One query per metric and chunk (``last_over_time(<metric>{<matchers>}[<step>-1ms])``,
    see :func:`fresh`); rows join on the
    series identity (UUID, GPU_I_ID, host, pod labels) and the step timestamp. A step where a
    GPU has neither GPU_UTIL nor GR_ENGINE_ACTIVE has no row: it is unobserved time in
    classify, never idle.
    """

    source = "prometheus"

    def __init__(self, client: PromClient, *, start_s: float, end_s: float, step_s: float,
                 matchers: Mapping[str, str] | None = None,
                 metrics: Sequence[str] = RAW_METRICS, chunk_points: int = 2880) -> None:
        self.client = client
        self.start_s, self.end_s, self.step_s = start_s, end_s, step_s
        self.sel = selector(matchers)
        self.metrics = tuple(metrics)
        self.chunk_points = min(chunk_points, MAX_POINTS_PER_SERIES)
        self.interval_s: float | None = step_s
        self.origin = f"Prometheus {client.url} (raw query_range, step {step_s:g} s)"
        self._notes: list[ImportNote] = []

    @property
    def notes(self) -> tuple[ImportNote, ...]:
        return tuple(self._notes)

    @property
    def events(self) -> tuple[str, ...]:
        return ()

    def batches(self) -> Iterator[pa.RecordBatch]:
        from gpuaudit.measure.fleet.dcgm import SeriesId, series_id, series_table

        chunks = time_chunks(self.start_s, self.end_s, self.step_s, self.chunk_points)
        # node_exporter beside dcgm-exporter: the hosts' CPU, joined by node name
        has_cpu = bool(self.client.label_names(NODE_CPU, self.start_s, self.end_s))
        unmatched: set[str] = set()
        advance = self.client.progress("raw pull", len(chunks) * len(self.metrics)) \
            if self.client.progress else None
        ids: list[SeriesId] = []
        id_index: dict[SeriesId, int] = {}
        for a, b in chunks:
            per_metric: dict[str, list[tuple[int, np.ndarray, np.ndarray]]] = {}
            for metric in self.metrics:
                parts = []
                expr = fresh(f"{metric}{self.sel}", self.step_s)
                for res in self.client.query_range(expr, a, b, self.step_s):
                    for r in res:
                        sid = series_id(r.labels, default_host="unknown",
                                        where=f"{self.client.url}: {metric}")
                        code = id_index.get(sid)
                        if code is None:
                            code = id_index[sid] = len(ids)
                            ids.append(sid)
                        parts.append((code, r.ts_ns, r.values))
                per_metric[metric] = parts
                if advance:
                    advance(1)
            table, notes = _join_chunk(ids, per_metric, a, self.step_s, series_table,
                                       where=f"{self.client.url}")
            self._notes.extend(notes)
            if has_cpu and table.num_rows:
                cpu = node_cpu_by_host(self.client, a, b, self.step_s)
                table = attach_host_cpu(table, cpu, unmatched)
            if table.num_rows:
                yield from table.to_batches()
        if unmatched:
            self._notes.append(ImportNote(
                f"host CPU: no node_exporter {NODE_CPU} series matches host(s) "
                f"{', '.join(sorted(unmatched)[:5])}{' ...' if len(unmatched) > 5 else ''} "
                "(by node_uname_info nodename or instance address); their CPU is null",
                len(unmatched), where=f"{self.client.url}: {NODE_CPU}",
                column="host_cpu_util_pct"))


HostCpu = dict[str, tuple[np.ndarray, np.ndarray]]


def host_keys(labels: Mapping[str, str]) -> list[str]:
    """The names a node_exporter series answers to: ``nodename`` (from ``node_uname_info``)
    and its first DNS label, and the ``instance`` address without its port."""
    keys = []
    node = labels.get("nodename")
    if node:
        keys += [node, node.split(".")[0]]
    inst = labels.get("instance", "")
    if inst:
        host = inst
        if inst.startswith("["):  # [v6::addr]:port
            host = inst[1:].split("]")[0]
        elif inst.count(":") == 1:
            host = inst.split(":")[0]
        keys += [host, inst]
    return keys


def node_cpu_by_host(client: PromClient, start_s: float, end_s: float,
                     step_s: float) -> HostCpu:
    """Each node's CPU busy percent on the step grid (:func:`gpuaudit.promql.node_cpu_pct`),
    keyed by every name the node answers to (:func:`host_keys`)."""
    out: HostCpu = {}
    for res in client.query_range(node_cpu_pct(step_s), start_s, end_s, step_s):
        for r in res:
            for key in host_keys(r.labels):
                ts, v = out.get(key, (np.zeros(0, np.int64), np.zeros(0)))
                out[key] = (np.concatenate([ts, r.ts_ns]), np.concatenate([v, r.values]))
    for key, (ts, v) in out.items():
        order = np.argsort(ts, kind="stable")
        out[key] = (ts[order], v[order])
    return out


def attach_host_cpu(table: pa.Table, cpu: HostCpu, unmatched: set[str]) -> pa.Table:
    """Fill ``host_cpu_util_pct`` of each row from its host's node CPU at the row's step
    (dcgm-exporter's ``Hostname``, else the first DNS label of it; a host no node answers
    to is added to ``unmatched``)."""
    n = table.num_rows
    out = np.full(n, np.nan)
    # the rows of each host, by the host's code (one sort, not a text compare per host)
    col = table.column("host")
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    names = col.dictionary.cast(pa.string()).to_pylist()
    code = col.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    by_code = np.argsort(code, kind="stable")
    ends = np.cumsum(np.bincount(code, minlength=len(names)))
    ts = table.column("ts").cast(pa.int64()).to_numpy()
    for j in sorted(range(len(names)), key=names.__getitem__):
        rows = by_code[(ends[j - 1] if j else 0):ends[j]]
        if rows.shape[0] == 0:
            continue
        h = names[j]
        got = cpu.get(h) or cpu.get(h.split(".")[0])
        if got is None:
            unmatched.add(h)
            continue
        t, v = got
        i = np.clip(np.searchsorted(t, ts[rows]), 0, max(t.shape[0] - 1, 0))
        hit = t.shape[0] > 0
        if hit:
            same = t[i] == ts[rows]
            out[rows[same]] = np.clip(v[i[same]], 0.0, 100.0)  # float error past the bounds
    idx = table.schema.get_field_index("host_cpu_util_pct")
    # (the sample table's field; a lean table's had no values yet: type null)
    return table.set_column(idx, pa.field("host_cpu_util_pct", pa.float32()),
                            pa.array(out, type=pa.float32(), mask=np.isnan(out)))


def _join_chunk(ids: Sequence[Any], per_metric: Mapping[str, list[tuple[int, np.ndarray,
                np.ndarray]]], start_s: float, step_s: float, series_table: Any, *,
                where: str) -> tuple[pa.Table, list[ImportNote]]:
    """Put every metric's points on one (series, step) grid, keep steps that carry a
    utilization reading (GPU_UTIL or GR_ENGINE_ACTIVE), build the table columnar."""
    step_ns = round(step_s * 1e9)
    start_ns = round(start_s * 1e9)
    keys: list[np.ndarray] = []
    for parts in per_metric.values():
        for code, ts, _v in parts:
            keys.append(code * (1 << 32) + (ts - start_ns) // step_ns)
    if not keys:
        empty: tuple[pa.Table, list[ImportNote]] = series_table(
            [], np.zeros(0, np.int64), np.zeros(0, np.int64), {}, where=where)
        return empty
    uniq = np.unique(np.concatenate(keys))
    values: dict[str, np.ndarray] = {}
    for metric, parts in per_metric.items():
        if not parts:
            continue
        col = np.full(uniq.shape[0], np.nan)
        for code, ts, v in parts:
            k = code * (1 << 32) + (ts - start_ns) // step_ns
            col[np.searchsorted(uniq, k)] = v
        values[metric] = col
    u = values.get("DCGM_FI_DEV_GPU_UTIL")
    g = values.get("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    has = np.zeros(uniq.shape[0], dtype=bool)
    for x in (u, g):
        if x is not None:
            has |= ~np.isnan(x)
    uniq = uniq[has]
    values = {k: v[has] for k, v in values.items()}
    codes = (uniq >> 32).astype(np.int64)
    ts_ns = start_ns + (uniq & ((1 << 32) - 1)) * step_ns
    out: tuple[pa.Table, list[ImportNote]] = series_table(
        ids, codes, ts_ns.astype(np.int64), values, where=where)
    return out


def pod_labels(client: PromClient, *, start_s: float, end_s: float,
               matchers: Mapping[str, str] | None = None,
               ) -> dict[tuple[str, str], dict[str, str]]:
    """kube-state-metrics ``kube_pod_labels`` of every pod seen in the range:
    (namespace, pod) -> labels with the ``label_`` prefix removed (``label_team_id`` ->
    ``team_id``). PromQL: ``last_over_time(kube_pod_labels{...}[<range>])``. Empty when
    kube-state-metrics is not scraped."""
    rng = duration(max(end_s - start_s, 1.0))
    rows = client.query(f"last_over_time(kube_pod_labels{selector(matchers)}[{rng}])", end_s)
    out: dict[tuple[str, str], dict[str, str]] = {}
    for labels, _v in rows:
        ns = labels.get("exported_namespace") or labels.get("namespace", "")
        pod = labels.get("exported_pod") or labels.get("pod", "")
        if not pod:
            continue
        kl = {k[6:]: v for k, v in labels.items() if k.startswith("label_") and v}
        out.setdefault((ns, pod), {}).update(kl)
    return out


def detect_interval_s(client: PromClient, *, end_s: float, start_s: float | None = None,
                      matchers: Mapping[str, str] | None = None) -> float | None:
    """The scrape interval of the dcgm-exporter series (``DCGM_FI_DEV_GPU_UTIL``, else
    ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``), found where the series have samples.

    First the last hour of the range; when no series has samples there (a job that finished,
    a cluster scaled down, history) and ``start_s`` is given, the latest window of the range
    where a series has two samples or more (``count(count_over_time(...[W]) >= 2)`` at steps of ``W`` = 1 h, or longer so
    the range fits in 10,000 steps). In that window the series with the most samples is read
    raw and the interval is the median gap between its timestamps, rounded to a whole second
    (at least 1): exact whether the window is full or holds the first or last samples only.
    ``None``: no series anywhere in the range.
    """
    sel = selector(matchers)
    for metric in UTIL_METRICS:
        found = _interval_at(client, metric, sel, end_s, 3600.0)
        if found is not None:
            return found
    if start_s is None or end_s - start_s <= 3600.0:
        return None
    window = max(3600.0, (end_s - start_s) / 10_000)
    steps = int((end_s - start_s) // window)
    for metric in UTIL_METRICS:
        expr = f"count(count_over_time({metric}{sel}[{duration(window)}]) >= 2)"
        latest = [int(r.ts_ns[-1]) for r in client.query_range_once(
            expr, end_s - steps * window, end_s, window) if len(r.ts_ns)]
        if latest:
            found = _interval_at(client, metric, sel, max(latest) / 1e9, window)
            if found is not None:
                return found
    return None


def _interval_at(client: PromClient, metric: str, sel: str, at_s: float,
                 window_s: float) -> float | None:
    """Median gap between the raw samples of the fullest ``metric`` series in the window
    ``(at_s - window_s, at_s]``, in whole seconds; None when no series has two samples."""
    counts = client.query(f"count_over_time({metric}{sel}[{duration(window_s)}])", at_s)
    counts = [(labels, n) for labels, n in counts if n >= 2]
    if not counts:
        return None
    labels, _ = max(counts, key=lambda c: c[1])
    series = client.query_samples(f"{metric}{selector(labels)}[{duration(window_s)}]", at_s)
    ts = max(series, key=len, default=[])
    if len(ts) < 2:
        return None
    return float(max(1, round(float(np.median(np.diff(np.array(ts)))))))
