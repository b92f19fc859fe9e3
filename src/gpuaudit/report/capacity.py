"""The capacity-planning report (``gpuaudit rightsize``, ``simulate``, ``queue``).

:func:`capacity_dict` turns a capacity value (:class:`~gpuaudit.capacity.rightsize.Rightsize`,
:class:`~gpuaudit.capacity.simulate.Simulation`, :class:`~gpuaudit.capacity.queue.QueueReport`)
into the JSON document ``gpuaudit.capacity`` (docs/json-schema.md): money as strings of
dollars, fractions rounded for reading. :func:`render_capacity` draws that same document as
terminal text, Markdown or HTML, so every format says the same thing. Nothing is computed
here but rounding.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from gpuaudit import __version__
from gpuaudit.capacity.profiles import WorkloadStats
from gpuaudit.capacity.queue import QueueReport
from gpuaudit.capacity.rightsize import UNIT_LABEL, Rightsize
from gpuaudit.capacity.simulate import PolicyResult, Simulation
from gpuaudit.errors import InputError
from gpuaudit.price.money import cents
from gpuaudit.report.text_table import markdown_table, plain_table

__all__ = ["CAPACITY_SCHEMA", "CAPACITY_SCHEMA_VERSION", "capacity_dict", "render_capacity"]

CAPACITY_SCHEMA = "gpuaudit.capacity"
CAPACITY_SCHEMA_VERSION = "1.1"
Q4 = Decimal("0.0001")


def _usd(x: Decimal | None) -> str | None:
    return None if x is None else str(cents(x))


def _r(x: float | None, n: int = 2) -> float | None:
    return None if x is None else round(float(x), n)


def _sig(x: float | None, digits: int = 6) -> float | None:
    """``x`` to ``digits`` significant digits (a small job's TFLOP/s are not 0)."""
    return None if x is None else float(f"{x:.{digits}g}")


def _stats(s: WorkloadStats) -> dict[str, Any]:
    return {"workload": s.workload, "gpu_uuid": s.gpu_uuid, "gpu_model": s.gpu_model,
            "group": list(s.group), "observed_s": _r(s.observed_s, 1),
            "util_pct": {"p50": _r(s.util_p50_pct), "p95": _r(s.util_p95_pct),
                         "p99": _r(s.util_p99_pct), "mean": _r(s.util_mean_pct)},
            "sm_active_p95_pct": _r(s.sm_p95_pct), "mem_peak_mib": _r(s.mem_peak_mib, 1),
            "mem_p99_mib": _r(s.mem_p99_mib, 1), "burst_mean_s": _r(s.burst_mean_s, 1),
            "diurnal_util_pct": [_r(x, 1) for x in s.diurnal_util_pct]}


def _policy(r: PolicyResult, keys: Sequence[str]) -> dict[str, Any]:
    return {
        "policy": r.policy, "group": dict(zip(keys, r.group)),
        "gpus_today": r.gpus_today, "gpus_needed": r.gpus_needed,
        "lower_bound_gpus": r.lower_bound, "projected_util_pct": _r(r.projected_util_pct, 1),
        "contention_step_share": _r(r.contention_step_share, 4),
        "throttled_workload_step_share": _r(r.throttled_workload_step_share, 4),
        "monthly_today_usd": _usd(r.monthly_today_usd),
        "monthly_needed_usd": _usd(r.monthly_needed_usd),
        "monthly_saved_usd": _usd(r.monthly_saved_usd),
        "placement": [{"workload": w, "gpu": g, "slot": s} for w, g, s in r.placement],
        "mig_layouts": [[{"profile": n, "start_slice": st} for n, st in g] for g in r.layouts],
        "notes": list(r.notes)}


def capacity_dict(value: Rightsize | Simulation | QueueReport, *,
                  plan: Mapping[str, Any] | None = None, source: Mapping[str, Any] | None = None,
                  group_keys: Sequence[str] = ()) -> dict[str, Any]:
    """The ``gpuaudit.capacity`` JSON document for one capacity value (docs/json-schema.md).

    ``plan``: the audit's ``recommendations`` and ``savings`` with the capacity findings in
    (from :meth:`gpuaudit.api.Report.to_dict`); ``source``: where the history came from."""
    doc: dict[str, Any] = {
        "schema": CAPACITY_SCHEMA, "schema_version": CAPACITY_SCHEMA_VERSION,
        "tool_version": __version__,
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": dict(source or {}),
    }
    if isinstance(value, Rightsize):
        best, owned = value.best, value.best_owned
        doc["kind"] = "rightsize"
        doc["rightsize"] = {
            "current": {"gpu_model": value.current_model, "gpus": value.gpus_now,
                        "usd_per_gpu_hour": str(value.current_rate.usd_per_gpu_hour.quantize(Q4)),
                        "provider": value.current_rate.provider,
                        "purchase": value.current_rate.purchase,
                        "monthly_usd": _usd(value.current_usd_per_hour * 720)},
            "requirements": {"mem_need_mib": _r(value.mem_need_mib, 1),
                             "headroom": value.headroom, "busy_p99_pct": _r(value.busy_p99_pct),
                             "busy_mean_pct": _r(value.busy_mean_pct),
                             "max_busy_pct": value.max_busy_pct,
                             "throughput_per_s": value.throughput_per_s, "unit": value.unit,
                             "sla_p99_ms": value.sla_p99_ms},
            "best": None if best is None else best.gpu_model + f" x{best.gpus} "
            f"({best.provider} {best.purchase})",
            "best_monthly_usd": None if best is None else _usd(best.monthly_usd),
            "best_monthly_saved_usd": None if best is None else _usd(
                value.current_usd_per_hour * 720 - best.monthly_usd),
            "best_owned": None if owned is None else owned.gpu_model + f" x{owned.gpus}",
            "candidates": [{
                "gpu_model": c.gpu_model, "provider": c.provider, "purchase": c.purchase,
                "gpus": c.gpus, "usd_per_gpu_hour": str(c.usd_per_gpu_hour.quantize(Q4)),
                "monthly_usd": _usd(c.monthly_usd), "est_busy_pct": _r(c.est_busy_pct, 1),
                "meets_memory": c.meets_memory, "meets_compute": c.meets_compute,
                "meets_sla": c.meets_sla, "p99_ms": _r(c.p99_ms, 1), "fits": c.fits,
                "basis": c.basis, "cost_per_unit_usd": None if c.cost_per_unit_usd is None
                else str(c.cost_per_unit_usd.quantize(Decimal("0.000001"))),
                "unit_label": UNIT_LABEL[value.unit],
                "break_even_duty": None if c.break_even_duty is None
                else _r(float(c.break_even_duty), 4),
                "why_not": c.why_not, "source": c.source,
                "sla_holds_if_p99_now_ms": _r(c.sla_holds_if_p99_now_ms, 1)}
                for c in value.candidates],
            "achieved_tflops": _sig(value.achieved_tflops),
            "mfu": _sig(value.mfu),
            "achieved_vs_peak": [{
                "workload": a.workload, "gpu_model": a.gpu_model,
                "dram_active": _r(a.dram_active, 4), "tensor_active": _r(a.tensor_active, 4),
                "bandwidth_gb_per_s": _r(a.bandwidth_gb_per_s, 1),
                "tensor_tflops": _r(a.tensor_tflops, 1), "memory_bound": a.memory_bound}
                for a in value.achieved],
            "profiles": [_stats(s) for s in value.stats],
            "notes": list(value.notes)}
    elif isinstance(value, Simulation):
        doc["kind"] = "simulate"
        doc["simulate"] = {
            "target_model": value.target_model,
            "target_usd_per_gpu_hour": str(value.target_rate.usd_per_gpu_hour.quantize(Q4)),
            "target_rate_source": value.target_rate.source,
            "step_s": value.step_s, "steps": value.steps, "workloads": value.workloads,
            "headroom": value.headroom, "timeslice_replicas": value.replicas,
            "by": list(group_keys),
            "totals": [_policy(r, ()) | {"placement": []} for r in value.totals],
            "groups": [_policy(r, group_keys) for r in value.results],
            "notes": list(value.notes)}
    elif isinstance(value, QueueReport):
        doc["kind"] = "queue"
        doc["queue"] = {
            "url": value.url, "start": _iso(value.start_s), "end": _iso(value.end_s),
            "step_s": value.step_s, "waits": value.total_waits,
            "idle_gpu_hours": _r(value.idle_gpu_hours, 3),
            "idle_unheld_gpu_hours": _r(value.idle_unheld_gpu_hours, 3),
            "idle_unheld_while_waiting_gpu_hours": _r(value.idle_unheld_while_waiting_gpu_hours, 3),
            "idle_unheld_while_waiting_gpu_hours_by_model": {
                m: _r(h, 3) for m, h in
                value.idle_unheld_while_waiting_gpu_hours_by_model.items()},
            "waiting_steps": value.waiting_steps,
            "namespaces": [{"namespace": n.namespace, "waits": n.waits, "pods": n.pods,
                            "p50_s": _r(n.p50_s, 1), "p95_s": _r(n.p95_s, 1),
                            "max_s": _r(n.max_s, 1),
                            "pending_gpu_hours": _r(n.pending_gpu_hours, 3),
                            "idle_gpu_hours": _r(n.idle_gpu_hours, 3)}
                           for n in value.namespaces],
            "notes": list(value.notes)}
    else:  # pragma: no cover
        raise TypeError(type(value))
    if plan is not None:
        doc["plan"] = dict(plan)
    return doc


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- text forms


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], fmt: str) -> list[str]:
    if fmt == "markdown":
        return [*markdown_table(headers, rows), ""]
    if fmt == "html":
        head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                       for r in rows)
        return [f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"]
    return [*plain_table(headers, rows), ""]


def _h(text: str, fmt: str, level: int = 2) -> str:
    if fmt == "markdown":
        return "#" * level + " " + text + "\n"
    if fmt == "html":
        return f"<h{level}>{html.escape(text)}</h{level}>"
    return text + "\n" + ("=" if level == 1 else "-") * len(text)


def _p(text: str, fmt: str) -> str:
    return f"<p>{html.escape(text)}</p>" if fmt == "html" else text + "\n"


def _m(s: str | None) -> str:
    return "-" if s is None else f"${float(s):,.2f}"


def _pct(x: float | None, scale: float = 1.0) -> str:
    return "-" if x is None else f"{x * scale:.1f}%"


def _p99(c: Mapping[str, Any]) -> str:
    if c["p99_ms"] is not None:
        return f"{c['p99_ms']:.0f}"
    lim = c.get("sla_holds_if_p99_now_ms")
    return "-" if lim is None else f"ok if now <= {lim:.0f}"


def _lines_rightsize(d: Mapping[str, Any], fmt: str) -> list[str]:
    cur, req = d["current"], d["requirements"]
    out = [_h("Right-sizing", fmt),
           _p(f"Now: {cur['gpus']} x {cur['gpu_model']} at ${float(cur['usd_per_gpu_hour']):.2f}"
              f"/GPU-h ({cur['provider'] or 'given price'} {cur['purchase']}), "
              f"{_m(cur['monthly_usd'])}/month.", fmt),
           _p("Needs: memory " + ("not measured" if req["mem_need_mib"] is None else
                                  f"{req['mem_need_mib'] / 1024:.1f} GiB (p99 + "
                                  f"{req['headroom']:.0%})")
              + f"; busy p99 {req['busy_p99_pct']}%, mean {req['busy_mean_pct']}% "
              f"(keep <= {req['max_busy_pct']:g}%)"
              + (f"; throughput {req['throughput_per_s']:g}/s" if req["throughput_per_s"]
                 else "")
              + (f"; p99 SLA {req['sla_p99_ms']:g} ms" if req["sla_p99_ms"] else ""), fmt),
           _p(f"Cheapest fit: {d['best'] or 'none'}"
              + (f", {_m(d['best_monthly_usd'])}/month (saves {_m(d['best_monthly_saved_usd'])}"
                 "/month)" if d["best"] else "")
              + (f"; cheapest owned: {d['best_owned']}" if d["best_owned"] else ""), fmt)]
    rows = []
    for c in d["candidates"][:25]:
        rows.append([c["gpu_model"], c["provider"], c["purchase"], str(c["gpus"]),
                     f"${float(c['usd_per_gpu_hour']):.2f}", _m(c["monthly_usd"]),
                     f"{c['est_busy_pct']:.0f}%", _p99(c), "yes" if c["fits"] else "no",
                     "-" if c["cost_per_unit_usd"] is None else f"${float(c['cost_per_unit_usd']):.5f}",
                     "-" if c["break_even_duty"] is None else f"{c['break_even_duty']:.0%}",
                     c["basis"]])
    unit = d["candidates"][0]["unit_label"] if d["candidates"] else "per unit"
    out += _table(["GPU", "provider", "purchase", "GPUs", "$/GPU-h", "$/month", "busy",
                   "p99 ms", "fits", f"cost {unit}", "own break-even", "basis"], rows, fmt)
    if len(d["candidates"]) > 25:
        out.append(_p(f"... {len(d['candidates']) - 25} more candidates in the JSON report", fmt))
    if d["achieved_vs_peak"]:
        out.append(_h("Achieved vs peak", fmt, 3))
        out += _table(["workload", "GPU", "DRAM active", "GB/s", "tensor active", "TFLOP/s",
                       "memory-bound"],
                      [[a["workload"], a["gpu_model"], _pct(a["dram_active"], 100),
                        "-" if a["bandwidth_gb_per_s"] is None else f"{a['bandwidth_gb_per_s']:.0f}",
                        _pct(a["tensor_active"], 100),
                        "-" if a["tensor_tflops"] is None else f"{a['tensor_tflops']:.0f}",
                        "yes" if a["memory_bound"] else "no"] for a in d["achieved_vs_peak"]],
                      fmt)
    out += _profiles(d["profiles"], fmt)
    out += [_p("note: " + n, fmt) for n in d["notes"]]
    return out


def _profiles(rows: Sequence[Mapping[str, Any]], fmt: str) -> list[str]:
    out = [_h("Workload profiles", fmt, 3)]
    out += _table(["workload", "util p50", "p95", "p99", "mem peak GiB", "mem p99 GiB",
                   "SM p95", "burst s"],
                  [[r["workload"], _pct(r["util_pct"]["p50"]), _pct(r["util_pct"]["p95"]),
                    _pct(r["util_pct"]["p99"]),
                    "-" if r["mem_peak_mib"] is None else f"{r['mem_peak_mib'] / 1024:.1f}",
                    "-" if r["mem_p99_mib"] is None else f"{r['mem_p99_mib'] / 1024:.1f}",
                    _pct(r["sm_active_p95_pct"]),
                    "-" if r["burst_mean_s"] is None else f"{r['burst_mean_s']:.0f}"]
                   for r in rows[:40]], fmt)
    return out


def _lines_simulate(d: Mapping[str, Any], fmt: str) -> list[str]:
    out = [_h("Consolidation simulation", fmt),
           _p(f"{d['workloads']} workload(s) replayed over {d['steps']} steps of "
              f"{d['step_s']:g} s onto {d['target_model']} at "
              f"${float(d['target_usd_per_gpu_hour']):.2f}/GPU-h"
              + (f", packed within each {', '.join(d['by'])}" if d["by"] else ""), fmt)]
    rows = [[t["policy"], str(t["gpus_today"]), str(t["gpus_needed"]),
             str(t["lower_bound_gpus"]), f"{t['projected_util_pct']:.1f}%",
             f"{t['contention_step_share']:.2%}", f"{t['throttled_workload_step_share']:.2%}",
             _m(t["monthly_today_usd"]), _m(t["monthly_needed_usd"]),
             _m(t["monthly_saved_usd"])] for t in d["totals"]]
    out += _table(["policy", "GPUs today", "needed (FFD)", "lower bound", "proj. util",
                   "contention", "throttled", "today $/month", "needed $/month",
                   "saved $/month"], rows, fmt)
    if d["by"]:
        out.append(_h(f"By {', '.join(d['by'])}", fmt, 3))
        out += _table(["group", "policy", "GPUs today", "needed", "lower bound", "contention",
                       "saved $/month"],
                      [[", ".join(str(v) if v is not None else "-" for v in g["group"].values()),
                        g["policy"], str(g["gpus_today"]), str(g["gpus_needed"]),
                        str(g["lower_bound_gpus"]), f"{g['contention_step_share']:.2%}",
                        _m(g["monthly_saved_usd"])] for g in d["groups"]], fmt)
    out += [_p("note: " + n, fmt) for n in d["notes"]]
    return out


def _lines_queue(d: Mapping[str, Any], fmt: str) -> list[str]:
    out = [_h("GPU queue waits", fmt),
           _p(f"{d['url']} from {d['start']} to {d['end']} at {d['step_s']:g} s steps: "
              f"{d['waits']} wait(s); {d['idle_gpu_hours']:.1f} idle GPU-hours, "
              f"{d['idle_unheld_gpu_hours']:.1f} of them on GPUs no pod held; "
              f"{d['idle_unheld_while_waiting_gpu_hours']:.1f} unheld idle GPU-hours while "
              "GPU pods waited", fmt)]
    out += _table(["namespace", "waits", "pods", "p50", "p95", "max", "GPU-h waiting",
                   "idle GPU-h held"],
                  [[n["namespace"], str(n["waits"]), str(n["pods"]), _dur(n["p50_s"]),
                    _dur(n["p95_s"]), _dur(n["max_s"]), f"{n['pending_gpu_hours']:.2f}",
                    f"{n['idle_gpu_hours']:.2f}"] for n in d["namespaces"]], fmt)
    if d["idle_unheld_while_waiting_gpu_hours"] > 0:
        out.append(_p("finding (scheduling): GPUs sat idle and unheld while pods asking for "
                      "GPUs waited; check quotas, node selectors and taints, MIG layouts and "
                      "fragmentation", fmt))
    out += [_p("note: " + n, fmt) for n in d["notes"]]
    return out


def _dur(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.0f} min"
    return f"{s:.0f} s"


def _plan_lines(plan: Mapping[str, Any], fmt: str) -> list[str]:
    out = [_h("Recommendations (with the capacity findings)", fmt, 3)]
    rows = [[r["id"], "yes" if r["counted"] else "no",
             _m(r.get("monthly_usd")), (r.get("why_not_counted") or r.get("evidence") or "")[:90]]
            for r in plan.get("recommendations", [])]
    out += _table(["remediation", "counted", "$/month alone", "evidence / why not counted"],
                  rows, fmt)
    sav = plan.get("savings") or {}
    if sav:
        out.append(_p(f"combined: {_m(sav.get('monthly_savings_usd'))}/month of "
                      f"{_m(sav.get('monthly_cost_usd'))}", fmt))
    return out


def render_capacity(doc: Mapping[str, Any], fmt: str = "terminal") -> str:
    """The document as ``terminal``, ``markdown``, ``html`` or ``json`` text."""
    if fmt == "json":
        from gpuaudit.report.json import indented

        return indented(doc)
    if fmt not in ("terminal", "markdown", "html"):
        raise InputError(f"unknown report format {fmt!r}",
                         fix="use one of terminal, json, markdown, html")
    kind = doc["kind"]
    lines = {"rightsize": _lines_rightsize, "simulate": _lines_simulate,
             "queue": _lines_queue}[kind](doc[kind], fmt)
    if "plan" in doc:
        lines += _plan_lines(doc["plan"], fmt)
    src = doc.get("source") or {}
    if src:
        lines.append(_p("source: " + ", ".join(f"{k} {v}" for k, v in src.items()), fmt))
    if fmt == "html":
        body = "\n".join(lines)
        return ("<!doctype html><html><head><meta charset='utf-8'><title>gpuaudit "
                f"{html.escape(kind)}</title><style>body{{font-family:sans-serif;margin:2em}}"
                "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;"
                "text-align:right}td:first-child{text-align:left}</style></head><body>"
                f"{body}</body></html>\n")
    return "\n".join(lines) + "\n"
