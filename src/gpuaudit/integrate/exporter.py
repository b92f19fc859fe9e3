"""A Prometheus exporter of what GPU time cost and wasted, per GPU, namespace and team.

Metrics are in base units (dollars, seconds, ratios 0..1); counters end in ``_total``:

``gpuaudit_cost_dollars_total``      observed (billed) cost, unobserved time included
``gpuaudit_waste_dollars_total``     idle cost + the unused share of underutilized cost
``gpuaudit_phase_seconds_total``     observed GPU-seconds per ``phase`` (idle, underutilized,
                                     productive, compute_bound)
``gpuaudit_unobserved_seconds_total`` billed GPU-seconds with no reading (gaps, no sample)
``gpuaudit_busy_seconds_total``      effective GPU-seconds (time x utilization)

each labelled ``gpu`` (UUID), ``host``, ``gpu_model`` and one label per ``--by`` key
(``namespace``, ``team`` ...; empty when no one holds the GPU: the unallocated line). Gauges:
``gpuaudit_savings_ratio{kind}`` (waste, efficiency, rate, total: the plan's honest
combination), ``gpuaudit_last_audit_timestamp_seconds``, ``gpuaudit_audit_duration_seconds``.

The figures come from the pipeline (classify -> price -> recommend); money is Decimal until
the exposition turns it into a float. A recording is audited once; a live sampler is audited
every ``refresh_s`` over the samples that arrived since the last audit, and the counters add
the new windows, so they only ever grow. Scrapes never audit: each serves the exposition
bytes built by the last refresh (``prometheus_client.generate_latest`` over a fresh
registry with one custom collector), so a scrape costs a memcpy whatever the fleet size.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuaudit.classify import PHASES, group_key_names
from gpuaudit.errors import InputError
from gpuaudit.integrate.webconfig import WebConfig
from gpuaudit.price.cost import price_usage
from gpuaudit.result import AuditResult
from gpuaudit.schema import SAMPLE_SCHEMA, Recording

__all__ = ["METRICS", "CostCollector", "ExporterState", "LiveFeed", "label_names",
           "parse_listen", "serve"]

#: Every series the exporter writes: name -> (type, help). Grafana panels query only these
#: (and dcgm-exporter's fields); a test keeps the two in step.
METRICS: dict[str, tuple[str, str]] = {
    "gpuaudit_cost_dollars_total": ("counter", "Observed (billed) GPU cost in US dollars, "
                                    "unobserved time included."),
    "gpuaudit_waste_dollars_total": ("counter", "Wasted GPU cost in US dollars: idle time "
                                     "plus the unused share of underutilized time."),
    "gpuaudit_phase_seconds_total": ("counter", "Observed GPU-seconds per utilization phase "
                                     "(idle <10%, underutilized 10-70%, productive 70-90%, "
                                     "compute_bound >=90%)."),
    "gpuaudit_unobserved_seconds_total": ("counter", "Billed GPU-seconds with no reading "
                                          "(gaps past the cap, samples with no utilization)."),
    "gpuaudit_busy_seconds_total": ("counter", "Effective GPU-seconds: time x utilization."),
    "gpuaudit_savings_ratio": ("gauge", "Share of cost the recommended fixes save (kind: "
                               "waste, efficiency, rate, total), from the last audit."),
    "gpuaudit_last_audit_timestamp_seconds": ("gauge", "Unix time of the last audit."),
    "gpuaudit_audit_duration_seconds": ("gauge", "Seconds the last audit took."),
}

_FIXED = ("gpu", "host", "gpu_model")
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: seconds a scrape connection may stay silent before it is dropped
READ_TIMEOUT_S = 10.0
_LABEL_RE = re.compile(r"[^a-zA-Z0-9_]")


def label_names(by: Sequence[str]) -> tuple[str, ...]:
    """Prometheus label names for the ``--by`` keys (``label:team`` -> ``team``)."""
    out: list[str] = []
    for key in group_key_names(by):
        name = _LABEL_RE.sub("_", key.removeprefix("label:"))
        if not name or name[0].isdigit() or name in _FIXED or name.startswith("__"):
            name = f"label_{name}"
        out.append(name)
    seen: dict[str, str] = {}
    for key, name in zip(group_key_names(by), out):
        if name in seen:
            raise InputError(
                f"--by {seen[name]!r} and {key!r} both become the Prometheus label {name!r} "
                "(a label name holds only letters, digits and _)", where="--by",
                fix="group by one of them, or rename one label in the source")
        seen[name] = key
    return tuple(out)


@dataclass
class _Acc:
    cost: Decimal = Decimal(0)
    waste: Decimal = Decimal(0)
    phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    unobserved_s: float = 0.0
    busy_s: float = 0.0


class ExporterState:
    """Running totals per label set, and the exposition bytes of the latest refresh."""

    def __init__(self, by: Sequence[str] = ()) -> None:
        self.by = tuple(by)
        self.labels = (*_FIXED, *label_names(by))
        self.totals: dict[tuple[str, ...], _Acc] = {}
        self.savings: dict[str, float] = {}
        self.last_audit_s: float | None = None
        self.audit_duration_s: float | None = None
        self.audits = 0
        self._lock = threading.Lock()
        self._payload = b""
        self._payloads: dict[tuple[str, bool], tuple[bytes, str]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(CostCollector(self))
        self.refresh_payload()

    def add(self, result: AuditResult, duration_s: float | None = None) -> None:
        """Add one audit's per-(GPU, group) cost and time to the counters."""
        u = result.usage
        keys = ("gpu_uuid", "host", "gpu_model", *u.by)
        cells = price_usage(replace(u, by=keys), result.cost.rates)
        p = result.plan
        with self._lock:
            for ln in cells.per_group:
                key = tuple("" if v is None else str(v) for v in ln.key)
                acc = self.totals.setdefault(key, _Acc())
                acc.cost += ln.observed_cost
                acc.waste += ln.waste
                for ph in PHASES:
                    acc.phase_s[ph] += float(getattr(ln.time, f"{ph}_s"))
                acc.unobserved_s += ln.time.unobserved_s
                acc.busy_s += ln.time.busy_s
            self.savings = {"waste": float(p.waste_fraction),
                            "efficiency": float(p.efficiency_fraction),
                            "rate": float(p.rate_fraction), "total": float(p.total_fraction)}
            self.last_audit_s = time.time()
            self.audit_duration_s = duration_s
            self.audits += 1
        self.refresh_payload()

    def metrics(self) -> list[Metric]:
        with self._lock:
            items = list(self.totals.items())
            savings = dict(self.savings)
            last, dur = self.last_audit_s, self.audit_duration_s
        names = list(self.labels)

        def fam(name: str, extra: Sequence[str] = ()) -> Any:
            kind, doc = METRICS[name]
            if kind == "counter":
                return CounterMetricFamily(name.removesuffix("_total"), doc,
                                           labels=[*names, *extra])
            return GaugeMetricFamily(name, doc, labels=[*names, *extra])

        cost = fam("gpuaudit_cost_dollars_total")
        waste = fam("gpuaudit_waste_dollars_total")
        phase = fam("gpuaudit_phase_seconds_total", ("phase",))
        unobs = fam("gpuaudit_unobserved_seconds_total")
        busy = fam("gpuaudit_busy_seconds_total")
        for key, acc in sorted(items):
            lv = list(key)
            cost.add_metric(lv, float(acc.cost))
            waste.add_metric(lv, float(acc.waste))
            for ph in PHASES:
                phase.add_metric([*lv, ph], acc.phase_s[ph])
            unobs.add_metric(lv, acc.unobserved_s)
            busy.add_metric(lv, acc.busy_s)
        out: list[Metric] = [cost, waste, phase, unobs, busy]
        sav = GaugeMetricFamily("gpuaudit_savings_ratio", METRICS["gpuaudit_savings_ratio"][1],
                                labels=["kind"])
        for k, v in savings.items():
            sav.add_metric([k], v)
        out.append(sav)
        if last is not None:
            out.append(GaugeMetricFamily("gpuaudit_last_audit_timestamp_seconds",
                                         METRICS["gpuaudit_last_audit_timestamp_seconds"][1],
                                         value=last))
        if dur is not None:
            out.append(GaugeMetricFamily("gpuaudit_audit_duration_seconds",
                                         METRICS["gpuaudit_audit_duration_seconds"][1],
                                         value=dur))
        return out

    def refresh_payload(self) -> None:
        """Encode the metrics once per audit, in both exposition formats (Prometheus text
        0.0.4 and OpenMetrics 1.0, by prometheus_client's own encoders) and gzipped, so a
        scrape only picks bytes (content negotiation costs nothing per request)."""
        import gzip

        from prometheus_client.openmetrics.exposition import (
            CONTENT_TYPE_LATEST as OM_TYPE,
        )
        from prometheus_client.openmetrics.exposition import (
            generate_latest as om_latest,
        )

        text = generate_latest(self.registry)
        om = om_latest(self.registry)  # type: ignore[no-untyped-call]
        payloads = {
            ("text", False): (text, TEXT_TYPE), ("text", True): (gzip.compress(text, 6), TEXT_TYPE),
            ("openmetrics", False): (om, OM_TYPE),
            ("openmetrics", True): (gzip.compress(om, 6), OM_TYPE),
        }
        with self._lock:
            self._payload = text
            self._payloads = payloads

    @property
    def payload(self) -> bytes:
        with self._lock:
            return self._payload

    def encoded(self, accept: str | None, accept_encoding: str | None) -> tuple[bytes, str, bool]:
        """The payload a scraper asked for: (body, content type, gzipped). The format is
        chosen by prometheus_client's own negotiation of the ``Accept`` header (OpenMetrics
        when offered, else text 0.0.4); gzip when ``Accept-Encoding`` names it."""
        from prometheus_client.exposition import choose_encoder

        _, ctype = choose_encoder(accept or "")
        fmt = "openmetrics" if ctype.startswith("application/openmetrics-text") else "text"
        gz = "gzip" in (accept_encoding or "").lower()
        with self._lock:
            body, ct = self._payloads[(fmt, gz)]
        return body, ct, gz


class CostCollector(Collector):
    """prometheus_client collector over an :class:`ExporterState` (register it anywhere)."""

    def __init__(self, state: ExporterState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        yield from self.state.metrics()

    def describe(self) -> Iterator[Metric]:
        return iter(())


def audit_into(state: ExporterState, samples: Any, **audit_kw: Any) -> AuditResult:
    """Audit ``samples`` (path, Recording, table) with ``state.by`` and add it to ``state``."""
    from gpuaudit.api import audit

    t0 = time.perf_counter()
    result = audit(samples, by=state.by, **audit_kw)
    state.add(result, time.perf_counter() - t0)
    return result


class LiveFeed:
    """Audits a running :class:`~gpuaudit.measure.live.sampler.Sampler` every ``refresh_s``.

    The sampler must keep its batches in memory (no ``output``); each refresh audits the
    batches that arrived since the last one, so the counters grow by the new window.
    """

    def __init__(self, sampler: Any, state: ExporterState, *, refresh_s: float = 15.0,
                 audit_kw: Mapping[str, Any] | None = None) -> None:
        self.sampler = sampler
        self.state = state
        self.refresh_s = refresh_s
        self.audit_kw = dict(audit_kw or {})
        self._seen = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def _new_batches(self) -> list[pa.RecordBatch]:
        batches: list[pa.RecordBatch] = self.sampler.drain()
        return batches

    def refresh(self) -> bool:
        """Audit what arrived since the last refresh; False when nothing did."""
        new = self._new_batches()
        if not new:
            return False
        table = pa.Table.from_batches(new, SAMPLE_SCHEMA)
        rec = Recording(table=table, source=getattr(self.sampler.backend, "source", "nvml"),
                        origin=self.sampler.origin, interval_s=self.sampler.interval_s)
        audit_into(self.state, rec, extra={"timeline": None}, **self.audit_kw)
        return True

    def start(self) -> LiveFeed:
        self._thread = threading.Thread(target=self._run, name="gpuaudit-exporter-feed",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.refresh()
            except Exception as exc:  # keep serving the last good figures; say why
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.refresh_s + 5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        # a read timeout on the connection: a client that connects and sends nothing (or
        # half a request) is dropped after it, instead of holding a thread for ever
        self.request.settimeout(self.server.read_timeout_s)
        web = self.server.web
        if web is not None and web.tls is not None:
            # the TLS handshake in this connection's thread, under the read timeout
            self.request = web.tls.wrap_socket(self.request, server_side=True)
        # the headers and the body go out as two writes: without TCP_NODELAY, Nagle holds
        # the body until the client acknowledges the headers, which a keep-alive client
        # delays by its delayed-ACK timer (40 ms on Linux): every scrape paid ~40 ms
        with contextlib.suppress(OSError):
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        web = self.server.web
        if web is not None and not web.authorised(self.headers.get("Authorization")):
            body = b"unauthorized\n"
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="gpuaudit exporter"')
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        gz = False
        if path == "/metrics":
            body, ctype, gz = self.server.state.encoded(self.headers.get("Accept"),
                                                        self.headers.get("Accept-Encoding"))
            code = 200
        elif path in ("/", "/healthz"):
            body = b"gpuaudit exporter: metrics at /metrics\n"
            ctype, code = "text/plain; charset=utf-8", 200
        else:
            body, ctype, code = b"not found\n", "text/plain; charset=utf-8", 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if gz:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # 100 scrapers connecting at once must not overflow the backlog

    def __init__(self, addr: tuple[str, int], state: ExporterState,
                 read_timeout_s: float = READ_TIMEOUT_S, web: WebConfig | None = None) -> None:
        self.state = state
        self.read_timeout_s = read_timeout_s
        self.web = web
        super().__init__(addr, _Handler)

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, name="gpuaudit-exporter-http",
                         daemon=True).start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that hangs up or times out is routine for a scraped server: no traceback
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, ssl.SSLError)):
            return  # incl. a client that failed or abandoned the TLS handshake
        logging.getLogger(__name__).warning("request from %s failed: %s: %s",
                                            client_address[0] if client_address else "?",
                                            type(exc).__name__, exc)


class _Server6(_Server):
    address_family = socket.AF_INET6


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9402`` for IPv6) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"cannot read --listen {listen!r}", where="--listen",
                         fix="give HOST:PORT, e.g. 127.0.0.1:9402 (0.0.0.0:9402 to expose it)")
    return host.strip("[]") or "127.0.0.1", int(port)


def serve(state: ExporterState, host: str = "127.0.0.1", port: int = 9402, *,
          read_timeout_s: float = READ_TIMEOUT_S, start: bool = True,
          web: WebConfig | None = None) -> _Server:
    """Start serving ``state`` on ``host:port`` in a background thread; returns the server
    (``server.server_address`` has the bound port when ``port`` is 0; ``shutdown()`` stops).
    A port in use or a host that does not resolve is an :class:`InputError`. ``start=False``
    binds and listens only (scrapers wait in the backlog); ``server.start()`` serves."""
    try:
        server = (_Server6 if ":" in host else _Server)((host, port), state, read_timeout_s,
                                                        web)
    except socket.gaierror as exc:
        raise InputError(f"cannot resolve the host {host!r}: {exc.strerror or exc}",
                         where="--listen", fix="give an address of this machine, e.g. "
                         "127.0.0.1:9402 (0.0.0.0:9402 for every interface)") from None
    except OSError as exc:
        why = {errno.EADDRINUSE: "the port is in use (another exporter?)",
               errno.EACCES: "permission denied (ports below 1024 need root)",
               errno.EADDRNOTAVAIL: "the address is not one of this machine's"}.get(
                   exc.errno or 0, exc.strerror or str(exc))
        raise InputError(f"cannot listen on {host}:{port}: {why}", where="--listen",
                         fix="choose another port (--listen 127.0.0.1:9403) or stop the "
                         "process that holds it (ss -ltnp)") from None
    if start:
        server.start()
    return server


def source_path(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise InputError(f"no such file: {p}", where="--source",
                         fix="give a gpuaudit recording (Parquet) or a CSV/JSONL/nvidia-smi log")
    return p
