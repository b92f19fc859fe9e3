from __future__ import annotations

from decimal import Decimal

import pytest
from coretables import recording, series_table
from hypothesis import given
from hypothesis import strategies as st

from gpuaudit.classify import classify
from gpuaudit.errors import InputError, PricingError
from gpuaudit.price import known_models, price_usage, resolve_rate, resolve_rates
from gpuaudit.price.catalog import gpu_family, load_user_catalog
from gpuaudit.price.money import CENT, allocate_cents, cents, hourly, projections


@pytest.mark.parametrize(("name", "family"), [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA A100-SXM4-40GB", "A100"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA L4", "L4"), ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA H200", "H200"),
    ("Tesla T4", "T4"), ("NVIDIA A10G", "A10G"), ("GRID A100-40C", "A100"), ("Radeon", None),
])
def test_gpu_family(name, family):
    assert gpu_family(name) == family


def test_catalog_rate_carries_source_and_date():
    r = resolve_rate("H100", provider="aws")
    assert r.usd_per_gpu_hour == Decimal("6.88") and r.provider == "aws"
    assert "datareceipts" in r.source and r.as_of
    assert r.spot_usd_per_gpu_hour is not None and r.spot_usd_per_gpu_hour < r.usd_per_gpu_hour


def test_nvml_name_resolves_memory_and_form_factor():
    r = resolve_rate("NVIDIA A100-SXM4-80GB", provider="gcp")
    assert r.gpu_model == "A100 80GB SXM" and r.usd_per_gpu_hour == Decimal("5.0688")


def test_spot_and_committed_purchase_options():
    od = resolve_rate("H100", provider="aws")
    spot = resolve_rate("H100", provider="aws", purchase="spot")
    com = resolve_rate("H100", provider="aws", purchase="committed")
    assert spot.usd_per_gpu_hour == od.spot_usd_per_gpu_hour
    assert com.usd_per_gpu_hour == od.usd_per_gpu_hour * Decimal("0.65")
    with pytest.raises(PricingError, match="no spot price"):
        resolve_rate("H100", provider="lambda", purchase="spot")


def test_unknown_model_lists_known_models():
    with pytest.raises(PricingError) as e:
        resolve_rate("Voodoo5 6000")
    assert "H100 80GB SXM" in str(e.value) and "--price" in str(e.value)
    assert len(known_models()) > 10


def test_missing_model_asks_for_gpu_model():
    with pytest.raises(PricingError, match="--gpu-model"):
        resolve_rate(None)


def test_price_flag_beats_catalogs(tmp_path):
    cat = tmp_path / "p.toml"
    cat.write_text('[[price]]\ngpu_model = "H100 80GB SXM"\nprovider = "onprem"\n'
                   'usd_per_gpu_hour = "2.10"\nsource = "chargeback FY26"\nas_of = "2026-10-01"\n')
    rates = resolve_rates(["NVIDIA H100 80GB HBM3"], catalog=cat)
    r = rates["NVIDIA H100 80GB HBM3"]
    assert r.usd_per_gpu_hour == Decimal("2.10") and r.source.startswith("user catalog")
    rates = resolve_rates(["NVIDIA H100 80GB HBM3"], catalog=cat, price="3.20")
    assert rates["NVIDIA H100 80GB HBM3"].usd_per_gpu_hour == Decimal("3.20")


def test_bad_user_catalog_is_located(tmp_path):
    cat = tmp_path / "p.toml"
    cat.write_text('[[price]]\ngpu_model = "H100"\nusd_per_gpu_hour = "cheap"\n')
    with pytest.raises(InputError) as e:
        load_user_catalog(cat)
    assert "[[price]] #1" in str(e.value) and "cheap" in str(e.value)


@given(st.decimals(min_value=0, max_value=10_000, places=6))
def test_property_projections_are_the_hourly_figure_times_hours(x):
    h = hourly(x)
    p = projections(h)
    assert cents(p["monthly"]) == cents(h * 720)
    assert cents(p["yearly"]) == cents(h * 8760)
    assert cents(p["daily"]) == cents(h * 24)


@given(st.lists(st.decimals(min_value=0, max_value=1000, places=8), min_size=1, max_size=8))
def test_property_allocated_cents_sum_to_rounded_total(parts):
    out = allocate_cents(parts)
    assert sum(out) == cents(sum(parts))
    for p, o in zip(parts, out):
        assert abs(o - p) < CENT * 2


def _cost(util):
    u = classify(recording(series_table({"g0": util, "g1": util[::-1]})))
    return u, price_usage(u, resolve_rates({s.gpu_model for s in u.series}, gpu_model="H100"))


@given(st.lists(st.one_of(st.none(), st.floats(0, 100)), min_size=2, max_size=60))
def test_property_cost_identities(util):
    _, c = _cost(util)
    t = c.total
    assert t.observed_cost == sum(t.phase_cost.values()) + t.unobserved_cost
    assert Decimal(0) <= t.waste <= t.observed_cost
    assert t.headroom_cost + t.waste <= t.observed_cost + Decimal("1e-9")
    assert cents(sum(ln.observed_cost for ln in c.per_gpu)) == cents(t.observed_cost)
    assert cents(c.cost_projection["monthly"]) == cents(c.hourly_cost * 720)
    assert c.hourly_waste <= c.hourly_cost


def test_hourly_cost_of_n_gpus_is_n_times_the_rate():
    _, c = _cost([50.0] * 100)
    assert c.hourly_cost == Decimal("13.76")  # 2 GPUs x $6.88
    assert c.cost_projection["monthly"] == Decimal("13.76") * 720


def test_unit_costs_and_energy():
    t = series_table({"g0": [50.0] * 3600}, extra={"power_w": {"g0": [400.0] * 3600}})
    u = classify(recording(t))
    rates = resolve_rates({None, "NVIDIA H100 80GB HBM3"}, price="2")
    c = price_usage(u, rates, counts={"tokens": 1_000_000}, energy_usd_per_kwh="0.10")
    assert c.unit_costs["tokens"] == c.total.observed_cost / 1_000_000
    assert c.energy is not None and c.energy.method == "power x time"
    assert c.energy.kwh == pytest.approx(Decimal("0.4"), rel=Decimal("1e-6"))
    assert c.energy.cost == pytest.approx(Decimal("0.04"), rel=Decimal("1e-6"))
