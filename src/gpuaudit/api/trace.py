"""``gpuaudit.trace(paths, ...)``: PyTorch profiler traces (Kineto JSON) through the priced
report; ``gpuaudit.kernel_summary(path, ...)``: an nsys ``cuda_gpu_kern_sum`` CSV.

A Kineto trace becomes per-rank busy/idle series (:func:`gpuaudit.traces.windows.
busy_series`: one GPU series per rank, busy then idle per window), classified from those
plain columns (:func:`gpuaudit.classify.columns.classify_columns`: the same phase engine,
timeline and patterns as a sample table gets, without building one), then priced, diagnosed
and advised by the same :func:`~gpuaudit.api.compose.assemble` as every other report. Its
findings (whose sentences the traces stage writes) become :class:`gpuaudit.recommend.Finding`
evidence for the recommender, and the analyses travel in ``extra["trace"]`` (JSON as is,
terminal and Markdown through :mod:`gpuaudit.report.trace`). The traces package never imports
recommend: the conversion happens here, in the composition layer. Nothing on this path
imports pyarrow or pandas (tests/traces/test_trace_plain_path.py runs the command and checks);
:func:`trace_extra` gives the same samples as an Arrow :class:`~gpuaudit.schema.Recording`.

An nsys kernel summary has no timeline, so it cannot be classified or have its idle time
priced: :func:`kernel_summary` gives the kernel breakdown and, given a rate, the cost of the
kernel time alone, saying so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuaudit.api.compose import Report
from gpuaudit.errors import InputError

if TYPE_CHECKING:
    from gpuaudit.recommend import Finding
    from gpuaudit.schema import Recording
    from gpuaudit.series import ImportNote
    from gpuaudit.traces.loader import Trace
    from gpuaudit.traces.windows import RankSeries

__all__ = ["KernelSummary", "kernel_summary", "trace", "trace_extra"]

_NS_PER_HOUR = Decimal(3_600_000_000_000)


@dataclass(frozen=True)
class _Parts:
    """A trace read and analysed: the busy/idle series, ``extra["trace"]`` and the findings."""

    trace: Trace
    series: list[RankSeries]
    notes: tuple[ImportNote, ...]  # the loader's notes, then ranks without samples
    extra: dict[str, Any]
    evidence: list[Finding]
    window_s: float


def _parts(paths: Sequence[str | Path], *, hta_compat: bool, include_last_step: bool,
           window_ms: float, gpu_model: str | None) -> _Parts:
    from gpuaudit.recommend import Finding
    from gpuaudit.series import ImportNote
    from gpuaudit.traces.analysis import AnalysisOptions, analyze
    from gpuaudit.traces.findings import findings
    from gpuaudit.traces.flops import SOURCE, achieved_flops, flop_evidence, sentence
    from gpuaudit.traces.loader import load_traces
    from gpuaudit.traces.windows import busy_series, rows, series_origin

    trace = load_traces([Path(p) for p in paths])
    opt = AnalysisOptions(hta_compat=hta_compat, include_last_step=include_last_step)
    analysis = analyze(trace, opt)
    window_s = window_ms / 1000.0
    series, empty = busy_series(trace, window_s=window_s, options=opt)
    window = sum(r.window_ns for r in analysis.ranks)
    idle = sum(r.idle_ns for r in analysis.ranks)
    tfs = findings(analysis)
    # one Finding per signal for the rules: the job-wide (worst rank) one where there are
    # several ranks, it comes last
    last: dict[str, Any] = {}
    for f in tfs:
        last[f.signal] = f
    evidence = [Finding(signal=f.signal, value=float(f.value), text=f.sentence, source="trace")
                for f in last.values()]
    flops = achieved_flops(trace, analysis, gpu_model=gpu_model)
    signals = flop_evidence(flops)
    if signals:
        top = max((r for r in flops if r.share_of_peak_busy is not None),
                  key=lambda r: r.share_of_peak_busy or 0.0)
        evidence += [Finding(signal=k, value=v, text=sentence(top), source="trace")
                     for k, v in signals.items()]
    extra = {
        "kind": "kineto",
        "files": [str(r.path) for r in trace.ranks],
        "gpu_models": sorted({m for r in trace.ranks if (m := r.device_name(None))}),
        "window_ns": window,
        "busy_share": (window - idle) / window if window else None,
        "idle_share": idle / window if window else None,
        **analysis.as_dict(),
        "findings": [dict(f.__dict__) for f in tfs],
        "flops": {"source": SOURCE, "ranks": [r.as_dict() for r in flops],
                  "sentences": [sentence(r) for r in flops]} if flops else None,
        "recording": {"rows": rows(series), "interval_s": window_s,
                      "origin": series_origin(trace, window_s)},
        "import_notes": [dict(n.__dict__) for n in trace.all_notes()],
    }
    notes = tuple(ImportNote(n.reason, n.count, n.where, n.column)
                  for n in (*trace.all_notes(), *empty))
    return _Parts(trace, series, notes, extra, evidence, window_s)


def trace_extra(paths: Sequence[str | Path], *, hta_compat: bool = False,
                include_last_step: bool = False, window_ms: float = 100.0,
                gpu_model: str | None = None) -> tuple[Recording, dict[str, Any], list[Finding]]:
    """(Recording, ``extra["trace"]`` dict, findings as recommend Findings) for Kineto traces:
    the samples :func:`trace` classifies, as a sample table (imports pyarrow).

    ``gpu_model`` names the GPU whose peak the achieved FLOP/s is compared with where the
    trace's ``deviceProperties`` do not."""
    from gpuaudit.traces.analysis import AnalysisOptions
    from gpuaudit.traces.recording import trace_to_recording

    p = _parts(paths, hta_compat=hta_compat, include_last_step=include_last_step,
               window_ms=window_ms, gpu_model=gpu_model)
    rec = trace_to_recording(p.trace, window_s=p.window_s, options=AnalysisOptions(
        hta_compat=hta_compat, include_last_step=include_last_step))
    return rec, p.extra, p.evidence


def trace(
    paths: str | Path | Sequence[str | Path],
    *,
    window_ms: float = 100.0,
    hta_compat: bool = False,
    include_last_step: bool = False,
    gpu_model: str | None = None,
    price: Decimal | str | float | None = None,
    provider: str | None = None,
    purchase: str = "on-demand",
    catalog: str | Path | None = None,
    counts: Mapping[str, int | float | Decimal] | None = None,
    energy_usd_per_kwh: Decimal | str | float | None = None,
) -> Report:
    """Audit PyTorch profiler traces (a file, a folder of rank traces, ``.json``/``.json.gz``):
    busy/idle and its causes, kernel classes, overlap, input stalls, tensor-core use, what it
    costs and what to change. The analyses are in ``report.extra["trace"]``.

    ``window_ms``: the window of the per-rank busy series that is priced; ``hta_compat``:
    reproduce HolisticTraceAnalysis 0.5.0 exactly; ``include_last_step``: keep the last
    ProfilerStep (HTA drops it). Pricing as :func:`gpuaudit.audit`. The report equals
    ``gpuaudit.audit`` of :func:`trace_extra`'s recording, without building it."""
    from gpuaudit.api.compose import assemble, rates_for
    from gpuaudit.classify.columns import SeriesColumns, classify_columns

    plist = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    p = _parts(plist, hta_compat=hta_compat, include_last_step=include_last_step,
               window_ms=window_ms, gpu_model=gpu_model)
    if not p.series:
        fl = p.extra.get("flops")
        counted = (" (its CPU operators count " + "; ".join(fl["sentences"]) + ", from "
                   + fl["source"] + ")") if fl else ""
        raise InputError(
            "the trace(s) hold no GPU kernel events, so there is no GPU time to audit"
            + counted,
            where=", ".join(str(x) for x in plist),
            fix="record with torch.profiler activities=[ProfilerActivity.CPU, "
            "ProfilerActivity.CUDA]",
        )
    usage = classify_columns(
        [SeriesColumns(s.gpu_uuid, s.host, s.gpu_model, None, s.ts_ns, s.util_pct, s.end_ns)
         for s in p.series],
        interval_s=p.window_s, source="trace", origin=p.extra["recording"]["origin"],
        notes=p.notes, findings=p.evidence)
    rates = rates_for(usage, gpu_model=gpu_model, price=price, provider=provider,
                      purchase=purchase, catalog=catalog)
    extras: dict[str, Any] = {"trace": p.extra}
    if usage.timeline is not None:
        extras["timeline"] = usage.timeline.to_dict()
    return assemble(usage, rates, counts=counts, energy_usd_per_kwh=energy_usd_per_kwh,
                    findings=p.evidence, extra=extras)


@dataclass(frozen=True)
class KernelSummary:
    """What :func:`kernel_summary` returns: the ``trace`` document of an nsys kernel summary
    (kernels, their time, and the kernel time's cost where a rate could be resolved)."""

    trace: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"trace": self.trace}

    def render(self, fmt: str = "terminal") -> str:
        """The summary as ``terminal``, ``markdown`` or ``json`` text (it has no timeline, so
        no ``html``)."""
        from gpuaudit.report.trace import render_trace_markdown, render_trace_terminal

        if fmt == "json":
            return json.dumps(self.to_dict(), indent=2, default=str) + "\n"
        if fmt == "markdown":
            return "# gpuaudit trace report\n\n" + render_trace_markdown(self.trace)
        if fmt == "terminal":
            return render_trace_terminal(self.trace)
        raise InputError(
            f"--format {fmt} needs a timeline; an nsys kernel summary has none",
            where=self.trace.get("source"),
            fix="use --format terminal, markdown or json for a kernel summary",
        )

    def __str__(self) -> str:
        return self.render("terminal")


def kernel_summary(
    path: str | Path,
    *,
    gpu_model: str | None = None,
    price: Decimal | str | float | None = None,
    provider: str | None = None,
    purchase: str = "on-demand",
    catalog: str | Path | None = None,
) -> KernelSummary:
    """An nsys ``cuda_gpu_kern_sum`` CSV, with the kernel time priced if a rate can be
    resolved (``price``, or ``gpu_model``: the summary names no GPU)."""
    from gpuaudit.traces.nsys import read_nsys_kern_sum

    rep: dict[str, Any] = {"kind": "nsys_kern_sum", **read_nsys_kern_sum(Path(path)).as_dict()}
    if price is None and gpu_model is None:
        rep["cost"] = None
        rep["cost_statement"] = ("not priced: an nsys kernel summary names no GPU model; pass "
                                 "--gpu-model or --price to price its kernel time")
        return KernelSummary(rep)
    from gpuaudit.price.catalog import load_user_catalog, resolve_rate

    user = load_user_catalog(catalog) if catalog else ()
    rate = resolve_rate(gpu_model, price=price, provider=provider, purchase=purchase,
                        user_catalog=user)
    kernel_h = Decimal(int(rep["kernel_time_ns"])) / _NS_PER_HOUR
    rep["cost"] = {
        "rate": rate.describe(),
        "usd_per_gpu_hour": str(rate.usd_per_gpu_hour),
        "kernel_gpu_hours": str(kernel_h.quantize(Decimal("0.000001"))),
        "kernel_time_usd": str((kernel_h * rate.usd_per_gpu_hour).quantize(Decimal("0.01"))),
    }
    rep["cost_statement"] = ("priced: the GPU time spent in kernels only, a lower bound on "
                             "what the run cost; a summary has no timeline, so idle time (the "
                             "usual waste) is neither measured nor priced")
    return KernelSummary(rep)
