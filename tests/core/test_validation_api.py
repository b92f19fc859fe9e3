"""The Python API refuses the values the CLI refuses, through the same checks (gpuaudit.validate).

``gpuaudit.audit(..., price=float("nan"))`` must fail as cleanly as ``--price nan``: an
InputError naming the argument, the unit and the range; never a decimal.InvalidOperation, a
ZeroDivisionError, or a report with negative or NaN dollars.
"""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import gpuaudit
from gpuaudit import validate
from gpuaudit.api import audit_fleet
from gpuaudit.errors import InputError
from gpuaudit.integrate.alerts import AlertThresholds
from gpuaudit.measure.live.fake_nvml import FakeNvml
from gpuaudit.measure.live.sampler import Sampler

LOG = Path(__file__).parents[1] / "data" / "nvidia_smi" / "smi_units.csv"
NAN, INF = float("nan"), float("inf")


def _refused(where: str, unit: str | None, fn, *args, **kw) -> InputError:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError) as e:
        fn(*args, **kw)
    err = e.value
    assert err.where == where, str(err)
    if unit is not None:
        assert unit in str(err), str(err)
    assert err.fix
    return err


@pytest.mark.parametrize(("kw", "where", "unit"), [
    ({"price": NAN}, "price", "USD per GPU-hour"),
    ({"price": INF}, "price", "USD per GPU-hour"),
    ({"price": 1e30}, "price", "USD per GPU-hour"),
    ({"price": -1}, "price", "USD per GPU-hour"),
    ({"price": "abc"}, "price", "USD per GPU-hour"),
    ({"price": Decimal("NaN")}, "price", "USD per GPU-hour"),
    ({"price": 2, "energy_usd_per_kwh": -1}, "energy_usd_per_kwh", "USD per kWh"),
    ({"price": 2, "energy_usd_per_kwh": NAN}, "energy_usd_per_kwh", "USD per kWh"),
    ({"price": 2, "counts": {"tokens": NAN}}, "counts['tokens']", "tokens"),
    ({"price": 2, "counts": {"tokens": -5}}, "counts['tokens']", "tokens"),
    ({"price": 2, "counts": {"steps": INF}}, "counts['steps']", "steps"),
    ({"price": 2, "counts": {"samples": 0}}, "counts['samples']", "samples"),
    ({"price": 2, "counts": {"steps": 1.5}}, "counts['steps']", "whole"),
    ({"price": 2, "interval_s": 0}, "interval_s", "seconds"),
    ({"price": 2, "interval_s": -1}, "interval_s", "seconds"),
    ({"price": 2, "interval_s": NAN}, "interval_s", "seconds"),
    ({"price": 2, "cap_intervals": 0.5}, "cap_intervals", "nominal intervals"),
    ({"price": 2, "workers": 0}, "workers", "processes"),
    ({"price": 2, "tz": "Mars/Olympus"}, "tz", None),
])
def test_audit_refuses_what_the_cli_refuses(kw, where, unit) -> None:  # type: ignore[no-untyped-def]
    _refused(where, unit, gpuaudit.audit, LOG, **kw)


def test_good_values_still_audit() -> None:
    r = gpuaudit.audit(LOG, price="2.50", energy_usd_per_kwh=0.12,
                       counts={"tokens": 2e9, "epochs": 0.5}, tz="Europe/Berlin")
    assert r.cost.counts == {"tokens": Decimal("2E+9"), "epochs": Decimal("0.5")}
    assert r.cost.total.observed_cost > 0
    assert r.cost.energy is None or r.cost.energy.usd_per_kwh == Decimal("0.12")


def test_monitor_and_sampler_check_their_numbers(tmp_path: Path) -> None:
    backend = FakeNvml.backend({"gpus": [{}]})
    _refused("hz", "Hz", gpuaudit.monitor, backend=backend, hz=0)
    _refused("hz", "Hz", gpuaudit.monitor, backend=backend, hz=NAN)
    _refused("flush_s", "seconds", gpuaudit.monitor, backend=backend, flush_s=-1)
    err = _refused("output", None, gpuaudit.monitor, backend=backend,
                   output=tmp_path / "missing" / "r.parquet")
    assert "does not exist" in str(err) and not (tmp_path / "missing").exists()
    _refused("interval_s", "seconds", Sampler, backend, interval_s=NAN)
    _refused("interval_s", "seconds", Sampler, backend, interval_s=0)
    _refused("interval_s", "seconds", Sampler, backend, interval_s=0.0001, process=True)


def test_fleet_and_alerts_check_their_numbers() -> None:
    # refused before any connection is tried (nothing listens on port 9)
    _refused("since_s", "seconds", audit_fleet, prometheus="http://127.0.0.1:9", since_s=NAN)
    _refused("step_s", "seconds", audit_fleet, prometheus="http://127.0.0.1:9", step_s=0)
    _refused("price", "USD per GPU-hour", audit_fleet, prometheus="http://127.0.0.1:9",
             pricing={"price": "inf"})
    from gpuaudit.api import fleet_usage  # gpuaudit fleet and gpuaudit bill --prometheus

    _refused("chunk_s", "seconds", fleet_usage, "http://127.0.0.1:9", chunk_s=-1)
    _refused("end_s", "Unix epoch seconds", fleet_usage, "http://127.0.0.1:9", end_s=INF)
    _refused("underutil_pct", "percent", AlertThresholds, underutil_pct=NAN)
    _refused("for_duration", None, AlertThresholds, for_duration="1x5m")
    _refused("temperature_c", "degrees C", AlertThresholds, temperature_c=-3)


def test_capacity_checks_its_numbers() -> None:
    from gpuaudit.capacity.profiles import build_profiles
    from gpuaudit.capacity.rightsize import parse_throughput
    from gpuaudit.measure.files import read_samples

    rec = read_samples(LOG)
    _refused("step_s", "seconds", build_profiles, rec, step_s=NAN)
    _refused("step_s", "seconds", build_profiles, rec, step_s=0)
    _refused("throughput", "units per second", parse_throughput, "inf/s")
    prof = build_profiles(rec, step_s=1.0)
    from gpuaudit.capacity.rightsize import rightsize
    from gpuaudit.price.catalog import resolve_rate

    rate = resolve_rate("H100", price="2")
    _refused("headroom", None, rightsize, prof, current_rate=rate, headroom=NAN)
    _refused("duty", None, rightsize, prof, current_rate=rate, duty=0)
    _refused("max_busy_pct", "percent", rightsize, prof, current_rate=rate, max_busy_pct=250)


QUANTITIES = [getattr(validate, n) for n in validate.__all__
              if isinstance(getattr(validate, n), validate.Quantity)]


@given(q=st.sampled_from(QUANTITIES),
       value=st.one_of(st.floats(), st.integers(min_value=-10**30, max_value=10**30),
                       st.text(max_size=8), st.decimals(allow_nan=True)))
def test_a_quantity_either_returns_a_value_in_range_or_refuses(q, value) -> None:  # type: ignore[no-untyped-def]
    try:
        x = q.check(value, "--x")
    except InputError as err:  # never another exception type
        assert err.where == "--x" and err.fix and q.unit.split(" (")[0] in err.fix
        return
    assert math.isfinite(x)
    assert q.low is None or x > q.low or (x == q.low and not q.low_open)
    assert q.high is None or x <= q.high
    assert not q.whole or x == int(x)
