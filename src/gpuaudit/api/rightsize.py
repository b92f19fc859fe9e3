"""``gpuaudit.rightsize(samples, ...)``: the cheapest GPU, provider and purchase option that
meets the measured need (docs/planning.md).

The composition ``gpuaudit rightsize`` renders: open the history, build profiles
(:func:`gpuaudit.capacity.profiles.build_profiles`), resolve today's rate, read the owned
hardware and the benchmark table, run :func:`gpuaudit.capacity.rightsize.rightsize`, and hand
its saving (:meth:`~gpuaudit.capacity.rightsize.Rightsize.saving`, sentence and all) to the
recommender as a finding through :func:`gpuaudit.api.audit`.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from gpuaudit.api.compose import CapacityReport, open_source
from gpuaudit.errors import InputError

if TYPE_CHECKING:
    import pyarrow as pa

    from gpuaudit.capacity.rightsize import BenchRow, Rightsize
    from gpuaudit.schema import Recording, SampleSource

__all__ = ["RIGHT_SIZE_SIGNAL", "parse_throughput", "rightsize", "trace_tflops"]

#: the recommender's signal for a cheaper fit (gpuaudit.recommend.rules.CAPACITY_SIGNALS)
RIGHT_SIZE_SIGNAL = "capacity_right_size_share"


def parse_throughput(text: str) -> float:
    """``1200/s``, ``72000/min``, ``5e6/h`` or a plain number (per second), as units/s."""
    from gpuaudit.capacity.rightsize import parse_throughput as parse

    return parse(text)


def trace_tflops(path: str | Path, gpu_model: str | None = None) -> tuple[float, int, str]:
    """(achieved TFLOP/s over each rank's trace window, summed over ranks; ranks; origin) of a
    PyTorch profiler trace recorded ``with_flops=True`` (a file or a folder of rank traces)."""
    from gpuaudit.traces.analysis import analyze
    from gpuaudit.traces.flops import achieved_flops
    from gpuaudit.traces.loader import load_traces

    p = Path(path)
    trace = load_traces([p])
    rows = achieved_flops(trace, analyze(trace), gpu_model=gpu_model)
    if not rows:
        raise InputError("the trace carries no operator FLOP counts (args.flops)",
                         where=str(p),
                         fix="record with torch.profiler.profile(..., with_flops=True), or give "
                         "--flops-per-unit with --throughput")
    total = sum(r.tflops_per_s_window or 0.0 for r in rows)
    return total, len(trace.ranks), f"trace {p.name}"


def rightsize(
    samples: SampleSource | Recording | pa.Table | str | Path,
    *,
    sla_p99_ms: float | None = None,
    throughput: float | str | None = None,
    unit: str = "inferences",
    p99_ms_now: float | None = None,
    bench: str | Path | Sequence[BenchRow] | None = None,
    headroom: float = 0.10,
    max_busy_pct: float = 90.0,
    duty: float = 1.0,
    flops_per_unit: float | None = None,
    trace: str | Path | None = None,
    step_s: float = 10.0,
    plan: bool = True,
    gpu_model: str | None = None,
    price: Decimal | str | float | None = None,
    provider: str | None = None,
    purchase: str = "on-demand",
    catalog: str | Path | None = None,
) -> CapacityReport[Rightsize]:
    """Every candidate GPU priced and checked against the measured need; ``value.best`` is the
    cheapest fit (a :class:`~gpuaudit.capacity.rightsize.Rightsize`).

    ``throughput``: the rate the run served and must keep (units per second, or text such as
    ``"1200/s"``) counted in ``unit``; ``bench``: a CSV path of measured
    ``gpu_model,throughput_per_s,p99_ms`` or rows already read; ``trace``: a profiler trace of
    the same job with FLOP counts (instead of ``flops_per_unit``); ``catalog``: a TOML price
    file whose ``[[owned]]`` rows add owned hardware (TCO at ``duty``). ``plan``: also run the
    audit with the right-size finding in (``CapacityReport.audit``)."""
    from gpuaudit.api.audit import audit_usage
    from gpuaudit.api.shared_read import profiles_and_usage
    from gpuaudit.capacity.rightsize import load_bench
    from gpuaudit.capacity.rightsize import rightsize as plan_rightsize
    from gpuaudit.price.catalog import load_user_catalog, resolve_rate
    from gpuaudit.price.owned import load_owned
    from gpuaudit.recommend import Finding

    throughput_per_s = parse_throughput(throughput) if isinstance(throughput, str) \
        else throughput
    user = load_user_catalog(catalog) if catalog else ()
    owned = load_owned(catalog) if catalog else ()
    # the plan's audit classifies the same batches the profiles read, on the other core
    prof, usage = profiles_and_usage(open_source(samples, gpu_model=gpu_model), step_s=step_s,
                                     audit=plan)
    model = gpu_model or prof.main_model
    rate = resolve_rate(model, price=price, provider=provider, purchase=purchase,
                        user_catalog=user)
    if isinstance(bench, (str, Path)):
        rows, bench_name = load_bench(bench), Path(bench).name
    else:
        rows, bench_name = tuple(bench or ()), "benchmark"
    rs = plan_rightsize(prof, current_rate=rate, current_model=model,
                        throughput_per_s=throughput_per_s, unit=unit, sla_p99_ms=sla_p99_ms,
                        p99_ms_now=p99_ms_now, bench=rows, bench_name=bench_name,
                        user_catalog=user, owned=owned, duty=duty,
                        flops_per_unit=flops_per_unit,
                        trace_tflops=trace_tflops(trace, model) if trace else None,
                        headroom=headroom, max_busy_pct=max_busy_pct)
    saving = rs.saving()
    findings = () if saving is None else (
        Finding(RIGHT_SIZE_SIGNAL, saving[0], saving[1], source="capacity"),)
    report = None if usage is None else audit_usage(
        usage.result(), findings=findings, price=price, provider=provider, purchase=purchase,
        catalog=catalog, gpu_model=gpu_model)
    source = {"path": str(samples), "step_s": prof.step_s} \
        if isinstance(samples, (str, Path)) else {"origin": _origin(samples), "step_s": prof.step_s}
    return CapacityReport(rs, source, report, findings)


def _origin(samples: object) -> str:
    return str(getattr(samples, "origin", None) or "an in-memory sample table")
