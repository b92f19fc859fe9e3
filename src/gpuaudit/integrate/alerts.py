"""Prometheus alerting rules for GPU waste and GPU health, over dcgm-exporter's series.

Each rule names the DCGM field it reads (dcgm-exporter metric names; ``DCGM_FI_PROF_*`` are
ratios 0..1, ``DCGM_FI_DEV_GPU_UTIL`` is percent, framebuffer MiB, temperature C). Pod and
namespace labels are ``pod``/``namespace`` when Prometheus scrapes with ``honorLabels: true``
and ``exported_pod``/``exported_namespace`` with the Helm chart's default (``--exported``).
``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` and ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` must be enabled in
the exporter's counters CSV (ECC is commented out in the default one).

The output is YAML (written by a small emitter: every string is a JSON-quoted scalar, which
YAML reads as-is), checked in the tests by ``promtool check rules`` and ``promtool test rules``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuaudit.price.billing.budgets import Budgets

__all__ = ["AlertThresholds", "alert_rules", "budget_rules", "literal", "rules_yaml", "to_yaml"]



@dataclass(frozen=True)
class AlertThresholds:
    """Every knob of the generated rules (CLI flags of ``gpuaudit alerts``)."""

    underutil_pct: float = 50.0
    underutil_window: str = "1h"
    memory_pressure_ratio: float = 0.85
    temperature_c: float = 85.0
    tensor_idle_ratio: float = 0.01
    tensor_busy_ratio: float = 0.5
    tensor_window: str = "30m"
    held_idle_hours: float = 4.0
    held_idle_util_pct: float = 1.0
    for_duration: str = "15m"
    exported_labels: bool = False
    selector: str = ""

    def __post_init__(self) -> None:
        # the checks of the CLI's options (gpuaudit.validate), for Python callers too
        from gpuaudit import validate as v
        from gpuaudit.promql import parse_selector

        # checked and written back canonically: a stray quote would make Prometheus reject
        # the whole rules file
        object.__setattr__(self, "selector", parse_selector(self.selector))

        for name in ("underutil_window", "tensor_window", "for_duration"):
            v.parse_prom_duration_s(getattr(self, name), name=name)
        for name, q in (("underutil_pct", v.ALERT_UNDERUTIL_PCT),
                        ("memory_pressure_ratio", v.MEMORY_PRESSURE_RATIO),
                        ("temperature_c", v.ALERT_TEMPERATURE_C),
                        ("tensor_idle_ratio", v.TENSOR_IDLE_RATIO),
                        ("tensor_busy_ratio", v.RATIO),
                        ("held_idle_hours", v.ALERT_HELD_IDLE_HOURS),
                        ("held_idle_util_pct", v.ALERT_UNDERUTIL_PCT)):
            q.check(getattr(self, name), name)


def _g(x: float) -> str:
    return f"{x:g}"


def _hours(h: float) -> str:
    return f"{round(h * 60)}m" if h != int(h) else f"{int(h)}h"


def alert_rules(t: AlertThresholds = AlertThresholds()) -> dict[str, Any]:
    """The rule file as a dict: ``{"groups": [...]}`` (Prometheus rule-file format)."""
    pod = "exported_pod" if t.exported_labels else "pod"
    ns = "exported_namespace" if t.exported_labels else "namespace"
    base = t.selector.strip().strip("{}")
    held = f'{{{pod}!=""' + (f",{base}" if base else "") + "}"
    sel = f"{{{base}}}" if base else ""
    who = ("GPU {{ $labels.gpu }} ({{ $labels.UUID }}{{ $labels.uuid }}) on "
           "{{ $labels.Hostname }}{{ $labels.hostname }}")
    owner = f"pod {{{{ $labels.{ns} }}}}/{{{{ $labels.{pod} }}}}"
    val = '{{ $value | printf "%.1f" }}'
    val3 = '{{ $value | printf "%.3f" }}'

    def rule(name: str, expr: str, dur: str, severity: str, kind: str, summary: str,
             description: str) -> dict[str, Any]:
        return {"alert": name, "expr": expr, "for": dur,
                "labels": {"severity": severity, "category": kind},
                "annotations": {"summary": summary, "description": description}}

    waste = [
        rule("GpuUnderutilized",
             f"avg_over_time(DCGM_FI_DEV_GPU_UTIL{held}[{t.underutil_window}]) "
             f"< {_g(t.underutil_pct)}", t.for_duration, "warning", "waste",
             f"{who} averaged {val}% utilization over {t.underutil_window}",
             f"{owner} holds a GPU whose DCGM_FI_DEV_GPU_UTIL averaged {val}% (< "
             f"{_g(t.underutil_pct)}%) over {t.underutil_window}: run gpuaudit on it for the "
             "cause (input pipeline, small batch) and the cost."),
        rule("GpuTensorCoresIdle",
             f"avg_over_time(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{sel}[{t.tensor_window}]) "
             f"< {_g(t.tensor_idle_ratio)} and avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE"
             f"{sel}[{t.tensor_window}]) > {_g(t.tensor_busy_ratio)}",
             t.for_duration, "info", "waste",
             f"{who} is busy but its tensor cores are idle",
             f"{owner}: tensor pipe active {val3} (ratio) over {t.tensor_window} while the "
             f"graphics engine is over {_g(t.tensor_busy_ratio)} active: FP32 math; try AMP / "
             "bf16 or TF32."),
        rule("GpuHeldIdle",
             f"max_over_time(DCGM_FI_DEV_GPU_UTIL{held}[10m]) < {_g(t.held_idle_util_pct)}",
             _hours(t.held_idle_hours), "warning", "waste",
             f"{who} held by a pod with no activity for {_g(t.held_idle_hours)} h",
             f"{owner} holds a GPU whose utilization has stayed under "
             f"{_g(t.held_idle_util_pct)}% (now {val}%) for {_g(t.held_idle_hours)} h: release "
             "it or scale the workload to zero."),
    ]
    health = [
        rule("GpuMemoryPressure",
             f"DCGM_FI_DEV_FB_USED{sel} / (DCGM_FI_DEV_FB_USED{sel} + DCGM_FI_DEV_FB_FREE{sel})"
             f" > {_g(t.memory_pressure_ratio)}", "10m", "warning", "health",
             f"{who} framebuffer {val} full",
             f"{owner}: framebuffer used / (used + free) is {val} (> "
             f"{_g(t.memory_pressure_ratio)}); out-of-memory is near."),
        rule("GpuEccDoubleBitErrors", f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{sel} > 0", "0m",
             "critical", "health", f"{who} has {val} double-bit ECC errors",
             f"{owner}: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL = {val} since the driver loaded; "
             "uncorrectable memory errors: drain the node and reset or replace the GPU."),
        rule("GpuHighTemperature", f"DCGM_FI_DEV_GPU_TEMP{sel} > {_g(t.temperature_c)}", "5m",
             "warning", "health", f"{who} at {val} C",
             f"{owner}: GPU temperature {val} C (> {_g(t.temperature_c)} C) for 5 minutes; "
             "expect thermal throttling: check cooling and airflow."),
        rule("GpuXidError", f"DCGM_FI_DEV_XID_ERRORS{sel} > 0", "0m", "critical", "health",
             f"{who} reported XID {val}",
             f"{owner}: the driver reported XID error {val} (see NVIDIA's XID catalog)."),
    ]
    return {"groups": [{"name": "gpuaudit-gpu-waste", "rules": waste},
                       {"name": "gpuaudit-gpu-health", "rules": health}]}


# characters YAML does not allow unescaped even in a double-quoted scalar (YAML 1.2, 5.1):
# DEL, the C1 controls but NEL, the surrogates, U+FFFE and U+FFFF (JSON leaves them raw)
_NOT_YAML_PRINTABLE = re.compile("[\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    text = json.dumps(str(v), ensure_ascii=False)
    return _NOT_YAML_PRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


_TEMPLATE_DELIMS = re.compile(r"\{\{|\}\}")


def literal(text: str) -> str:
    """``text`` as literal text inside a Prometheus alert label or annotation, which are Go
    templates: ``{{`` and ``}}`` become ``{{ "{{" }}`` and ``{{ "}}" }}``, so a team named
    ``{{ query "up" }}`` is shown, never run, when the alert fires."""
    return _TEMPLATE_DELIMS.sub(lambda m: '{{ "' + m.group() + '" }}', text)


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block YAML for dicts / lists / scalars (strings JSON-quoted, so any text is safe)."""
    pad = "  " * indent
    if isinstance(value, Mapping):
        if not value:
            return pad + "{}\n"
        out = []
        for k, v in value.items():
            key = _scalar(str(k)) if not str(k).replace("_", "").isalnum() else str(k)
            if isinstance(v, (Mapping, list, tuple)) and v:
                out.append(f"{pad}{key}:\n{to_yaml(v, indent + 1)}")
            else:
                out.append(f"{pad}{key}: {_inline(v)}\n")
        return "".join(out)
    if isinstance(value, (list, tuple)):
        if not value:
            return pad + "[]\n"
        out = []
        for item in value:
            body = to_yaml(item, indent + 1) if isinstance(item, (Mapping, list, tuple)) \
                else f"{'  ' * (indent + 1)}{_inline(item)}\n"
            out.append(f"{pad}- {body.lstrip()}")
        return "".join(out)
    return pad + _inline(value) + "\n"


def _inline(v: Any) -> str:
    if isinstance(v, Mapping) and not v:
        return "{}"
    if isinstance(v, (list, tuple)) and not v:
        return "[]"
    if v is None:
        return "null"
    return _scalar(v)


def budget_rules(budgets: Budgets, t: AlertThresholds = AlertThresholds()) -> dict[str, Any]:
    """``GpuBudgetForecastExceeded`` per budgeted team: the GPUs the team held (dcgm-exporter
    series carrying the budget file's ``label``), averaged over the last day, x 24 h x the
    days in this month x ``usd_per_gpu_hour``, above its monthly budget (docs/billing.md)."""
    from gpuaudit.errors import InputError

    if budgets.usd_per_gpu_hour is None:
        raise InputError("the budget file has no usd_per_gpu_hour, so the rule cannot price "
                         "GPU-hours", where=budgets.path,
                         fix='add usd_per_gpu_hour = "6.52" (your effective rate: gpuaudit '
                         "bill shows it per instance type)")
    pod = "exported_pod" if t.exported_labels else "pod"
    base = t.selector.strip().strip("{}")
    label = budgets.label
    if not label.replace("_", "").isalnum() or label[0].isdigit():
        raise InputError(f"label {label!r} is not a Prometheus label name", where=budgets.path,
                         fix='write label = "team"')
    rules = []
    for team, budget in sorted(budgets.monthly.items()):
        sel = f'{{{pod}!="",{label}={json.dumps(team)}' + (f",{base}" if base else "") + "}"
        held = f"avg_over_time((count by ({label}) (DCGM_FI_DEV_GPU_UTIL{sel}))[1d:5m])"
        forecast = (f"{held} * 24 * scalar(days_in_month(vector(time()))) * "
                    f"{budgets.usd_per_gpu_hour}")
        cur = budgets.currency
        rules.append({
            "alert": "GpuBudgetForecastExceeded",
            "expr": f"{forecast} > {budget}",
            "for": "1h",
            "labels": {"severity": "warning", "category": "budget",
                       "budget_team": literal(team)},
            "annotations": {
                "summary": f"{label} {literal(team)}: month-end GPU spend forecast "
                           f"{{{{ $value | printf \"%.2f\" }}}} {literal(cur)} is over the "
                           f"budget {budget} {literal(cur)}",
                "description": f"The GPUs {label}={literal(team)} held over the last day, x "
                               f"24 h x the days in this month x {budgets.usd_per_gpu_hour} "
                               f"{literal(cur)}/GPU-h (from {literal(str(budgets.path))}), "
                               f"exceed the monthly budget {budget} {literal(cur)}. gpuaudit "
                               "bill --budgets shows month to date and the forecast interval "
                               "from the invoice."},
        })
    return {"groups": [{"name": "gpuaudit-gpu-budgets", "rules": rules}]}


def rules_yaml(t: AlertThresholds = AlertThresholds(), *,
               header: Sequence[str] = (), budgets: Budgets | None = None) -> str:
    lines = ["# Prometheus alerting rules generated by gpuaudit (gpuaudit alerts).",
             "# Check: promtool check rules <this file>", *header]
    doc = alert_rules(t)
    if budgets is not None:
        doc["groups"] += budget_rules(budgets, t)["groups"]
    return "\n".join(lines) + "\n" + to_yaml(doc)
