"""Capacity planning: MIG tables, profiles from real recordings, packing invariants, right-size,
owned-hardware TCO, and the recommender reading the findings."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.capacity.profiles import build_profiles, profile_stats, row_percentiles
from gpuaudit.capacity.rightsize import load_bench, parse_throughput, rightsize
from gpuaudit.capacity.simulate import MIB_PER_GB, _mig_pack, _vector_pack, peak_tflops, simulate
from gpuaudit.cli import main
from gpuaudit.errors import InputError
from gpuaudit.hardware import (
    MIG_COMPUTE_SLICES,
    MigProfile,
    mig_layout_problem,
    mig_profiles,
    spec_for,
)
from gpuaudit.measure.files import open_samples
from gpuaudit.price.catalog import resolve_rate
from gpuaudit.price.owned import break_even_duty, load_owned
from gpuaudit.schema import build_table

ROOT = Path(__file__).parents[2]
NANOGPT = ROOT / "src" / "gpuaudit" / "data" / "nanogpt_8xh100.parquet"
NANOGPT_CSV = ROOT / "tests" / "data" / "core" / "nanogpt_8xh100_nvidia_smi.csv"


# --------------------------------------------------------------------------- MIG tables

@pytest.mark.parametrize(("model", "names"), [
    ("H100", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("NVIDIA A100-SXM4-40GB", ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
    ("NVIDIA A100-SXM4-80GB", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("NVIDIA H200", ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
    ("B200", ["1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"]),
])
def test_mig_profiles_per_board(model, names):
    profs = mig_profiles(model)
    assert [p.name for p in profs] == names
    # the name's memory is the share of memory slices of the board, to rounding
    spec = spec_for(model)
    assert spec is not None
    for p in profs:
        assert abs(p.memory_gb - spec.memory_gb * p.memory_slices / 8) <= spec.memory_gb / 16
        assert p.source.startswith("NVIDIA MIG User Guide")
        # every placement alone is a valid layout; max_instances of it fit at once
        for start in p.placements:
            assert mig_layout_problem([(p, start)]) is None
        assert len(p.placements) >= p.max_instances or p.memory_slices == 8


def test_no_mig_on_l4_and_known_invalid_layouts():
    assert mig_profiles("L4") == ()
    assert mig_profiles(None) == ()
    by = {p.name: p for p in mig_profiles("H100")}
    assert mig_layout_problem([(by["4g.40gb"], 0), (by["3g.40gb"], 4)]) is None
    assert mig_layout_problem([(by["3g.40gb"], 0), (by["3g.40gb"], 4)]) is None
    assert "overlaps" in (mig_layout_problem([(by["3g.40gb"], 0), (by["1g.10gb"], 3)]) or "")
    assert "cannot start" in (mig_layout_problem([(by["2g.20gb"], 6)]) or "")
    seven = [(by["1g.10gb"], i) for i in range(7)]
    assert mig_layout_problem(seven) is None
    assert mig_layout_problem([*seven, (by["1g.10gb"], 0)]) is not None
    fat = MigProfile("x", "5g.50gb", 1, 5, 2, (0, 1), "test")
    assert "compute" in (mig_layout_problem([(fat, 0), (fat, 1)]) or "")


@settings(max_examples=150)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=60),
       st.sampled_from(["H100", "A100 40GB", "H200", "B200"]))
def test_mig_packing_only_makes_layouts_nvidia_allows(choices, model):
    profs = mig_profiles(model)
    items = [(i, profs[c]) for i, c in enumerate(choices)]
    gpu_of, layouts = _mig_pack(items)
    for layout in layouts:
        assert mig_layout_problem(layout) is None, layout
    assert sorted(len(x) for x in layouts) and sum(len(x) for x in layouts) == len(items)
    # each item sits on the GPU the packer says, with its own profile
    for (_i, prof), g in zip(items, gpu_of):
        assert prof in [p for p, _ in layouts[g]]
    # never below the slice lower bound
    lb = max(-(-sum(p.memory_slices for _, p in items) // 8),
             -(-sum(p.compute_slices for _, p in items) // MIG_COMPUTE_SLICES))
    assert len(layouts) >= lb


@settings(max_examples=150)
@given(st.lists(st.tuples(st.floats(0, 1.5), st.floats(0, 1.2)), min_size=1, max_size=50),
       st.integers(1, 8))
def test_vector_packing_never_overcommits_memory_or_clients(items, limit):
    mem_cap = 100.0
    mem = np.asarray([m * mem_cap for m, _ in items])
    size = np.asarray([c for _, c in items])
    gpu_of = _vector_pack(mem, size, mem_cap, limit)
    for g in np.unique(gpu_of):
        on = gpu_of == g
        assert on.sum() <= limit
        if on.sum() > 1:  # an item bigger than a GPU is alone
            assert mem[on].sum() <= mem_cap + 1e-6
            assert np.minimum(size[on], 1.0).sum() <= 1.0 + 1e-6


# --------------------------------------------------------------------------- profiles

def test_profiles_from_the_real_recording_and_its_csv_agree():
    a = build_profiles(open_samples(NANOGPT), step_s=10)
    b = build_profiles(open_samples(NANOGPT_CSV, gpu_model="NVIDIA H100 80GB HBM3"), step_s=10)
    assert len(a) == len(b) == 8
    assert a.util_pct.shape == b.util_pct.shape
    np.testing.assert_allclose(np.nan_to_num(a.util_pct), np.nan_to_num(b.util_pct), atol=1e-3)
    stats = profile_stats(a)
    # percentiles equal numpy's on the observed steps
    for w, s in enumerate(stats):
        row = a.util_pct[w][~np.isnan(a.util_pct[w])]
        assert s.util_p95_pct == pytest.approx(float(np.percentile(row, 95)), abs=1e-3)
        assert s.util_mean_pct == pytest.approx(float(row.mean()), abs=1e-3)
        assert s.mem_peak_mib is None  # nvidia-smi log without memory.used
        assert s.burst_mean_s is not None and s.burst_mean_s > 100  # one long training burst
        hours = [h for h in s.diurnal_util_pct if h is not None]
        assert hours  # the run's hour of the day


@settings(max_examples=60)
@given(st.lists(st.lists(st.one_of(st.none(), st.floats(0, 100)), min_size=1, max_size=30),
                min_size=1, max_size=6), st.sampled_from([5.0, 50.0, 95.0, 99.0]))
def test_row_percentiles_match_numpy(rows, q):
    width = max(len(r) for r in rows)
    m = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        m[i, : len(r)] = [np.nan if x is None else x for x in r]
    got = row_percentiles(m, (q,))[0]
    for i in range(len(rows)):
        obs = m[i][~np.isnan(m[i])]
        if obs.size:
            assert got[i] == pytest.approx(float(np.percentile(obs, q)), abs=1e-9)
        else:
            assert np.isnan(got[i])


def _table(n_gpus: int, steps: int, util: np.ndarray, mem: np.ndarray, *,
           model: str = "NVIDIA H100 80GB HBM3", namespaces: list[str] | None = None
           ) -> pa.Table:
    ts = (1_704_067_200 + np.repeat(np.arange(steps), n_gpus) * 60) * 1_000_000_000
    uuids = [f"GPU-{g:04d}" for g in range(n_gpus)] * steps
    cols = {
        "ts": pa.array(ts, pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
        "host": ["h"] * len(uuids), "gpu_uuid": uuids, "gpu_model": [model] * len(uuids),
        "util_gpu_pct": pa.array(util.T.reshape(-1), pa.float32()),
        "mem_used_mib": pa.array(mem.T.reshape(-1), pa.float32()),
    }
    if namespaces is not None:
        cols["namespace"] = [namespaces[g] for g in range(n_gpus)] * steps
    return build_table(cols)


@settings(max_examples=25)
@given(st.integers(1, 12), st.integers(2, 30), st.integers(0, 2**31 - 1),
       st.sampled_from(["H100", "A100 40GB", "L4"]))
def test_simulation_invariants(n, steps, seed, target):
    rng = np.random.default_rng(seed)
    util = rng.uniform(0, 60, (n, steps)) * (rng.random((n, 1)) < 0.7)
    mem = rng.uniform(500, 30_000, (n, steps))
    p = build_profiles(_table(n, steps, util, mem), step_s=60)
    h100 = resolve_rate("H100")
    sim = simulate(p, target_model=target, target_rate=resolve_rate(target),
                   today_rates={"NVIDIA H100 80GB HBM3": h100})
    cap = spec_for(target).memory_gb * MIB_PER_GB
    for r in sim.totals:
        assert r.gpus_needed >= r.lower_bound >= 1
        assert r.monthly_saved_usd <= r.monthly_today_usd  # savings never above today's cost
        assert r.monthly_today_usd == h100.usd_per_gpu_hour * 720 * n
        assert 0 <= r.contention_step_share <= 1
    for r in sim.results:
        gpus: dict[int, list[str]] = {}
        for w, g, _slot in r.placement:
            gpus.setdefault(g, []).append(w)
        peaks = {p.workload[i]: float(np.nanmax(p.mem_mib[i])) * 1.1 for i in range(len(p))}
        if r.policy == "mig":
            for layout in r.layouts:
                profs = {x.name: x for x in mig_profiles(target)}
                assert mig_layout_problem([(profs[nm], st_) for nm, st_ in layout]) is None
            for w, _g, slot in r.placement:
                assert {x.name: x for x in mig_profiles(target)}[slot].memory_gb * MIB_PER_GB \
                    >= min(peaks[w], cap) - 1e-3 or slot.startswith("7g")
        else:
            for members in gpus.values():
                if len(members) > 1:
                    assert sum(peaks[w] for w in members) <= cap + 1e-3


def test_simulation_by_namespace_keeps_groups_apart():
    n, steps = 6, 20
    util = np.full((n, steps), 5.0)
    mem = np.full((n, steps), 2000.0)
    ns = ["a", "a", "a", "b", "b", "c"]
    p = build_profiles(_table(n, steps, util, mem, namespaces=ns), step_s=60, by=["namespace"])
    sim = simulate(p, target_model="H100", target_rate=resolve_rate("H100"),
                   today_rates={"NVIDIA H100 80GB HBM3": resolve_rate("H100")}, by_group=True)
    mps = [r for r in sim.results if r.policy == "mps"]
    assert sorted(r.group for r in mps) == [("a",), ("b",), ("c",)]
    assert all(r.gpus_needed == 1 for r in mps)  # each namespace packs onto one GPU
    total = next(r for r in sim.totals if r.policy == "mps")
    assert total.gpus_needed == 3 and total.gpus_today == 6
    # all together they would fit one GPU: packing per group costs two more
    together = simulate(p, target_model="H100", target_rate=resolve_rate("H100"),
                        today_rates={"NVIDIA H100 80GB HBM3": resolve_rate("H100")})
    assert next(r for r in together.totals if r.policy == "mps").gpus_needed == 1


def test_contention_is_counted_step_by_step():
    # two workloads at 60 % each: sized by p95 they cannot share; one at 10 % with a burst
    util = np.array([[10.0] * 9 + [95.0], [10.0] * 9 + [95.0]])
    mem = np.full((2, 10), 1000.0)
    p = build_profiles(_table(2, 10, util, mem), step_s=60)
    sim = simulate(p, policies=("timeslice",), target_model="H100",
                   target_rate=resolve_rate("H100"),
                   today_rates={"NVIDIA H100 80GB HBM3": resolve_rate("H100")})
    r = sim.totals[0]
    # p95 of each is ~ 0.57: they cannot share (1.14 > 1) -> two GPUs, no contention
    assert r.gpus_needed == 2 and r.contention_step_share == 0
    util2 = np.array([[10.0] * 19 + [95.0], [10.0] * 19 + [95.0]])
    p2 = build_profiles(_table(2, 20, util2, np.full((2, 20), 1000.0)), step_s=60)
    r2 = simulate(p2, policies=("timeslice",), target_model="H100",
                  target_rate=resolve_rate("H100"),
                  today_rates={"NVIDIA H100 80GB HBM3": resolve_rate("H100")}).totals[0]
    # p95 ~ 0.14 each: they share one GPU and collide on the last step of 20
    assert r2.gpus_needed == 1
    assert r2.contention_step_share == pytest.approx(1 / 20)


# --------------------------------------------------------------------------- right-size

def test_parse_throughput():
    assert parse_throughput("1200/s") == 1200
    assert parse_throughput("72000/min") == 1200
    assert parse_throughput("1.2k/s") == 1200
    assert parse_throughput("1200") == 1200
    for bad in ("fast", "10/week", "0/s"):
        with pytest.raises(InputError):
            parse_throughput(bad)


def test_rightsize_estimates_and_bench(tmp_path):
    p = build_profiles(open_samples(NANOGPT), step_s=10)
    rate = resolve_rate("H100")
    rs = rightsize(p, current_rate=rate, throughput_per_s=1200, sla_p99_ms=80)
    assert rs.gpus_now == 8 and rs.busy_p99_pct == pytest.approx(100.0, abs=0.5)
    assert any("SLA was not checked" in n for n in rs.notes)
    assert any("memory use not measured" in n for n in rs.notes)
    for c in rs.candidates:
        assert c.basis == "estimate (peak ratio)"
        assert c.meets_memory == (c.gpu_model and spec_for(c.gpu_model).memory_gb >= 80)
        # cost per 1k inferences = hourly cost / (rate x 3600) x 1000
        assert c.cost_per_unit_usd == c.usd_per_gpu_hour * c.gpus / Decimal("4320000") * 1000
        # no p99 measured: the SLA is unchecked, and each row says under which p99 today it
        # would hold (latency scales by the peak ratio, as a given --p99-ms-now is scaled)
        assert c.meets_sla is None and c.p99_ms is None
        ratio = peak_tflops(spec_for("H100")) / peak_tflops(spec_for(c.gpu_model))
        assert c.sla_holds_if_p99_now_ms == pytest.approx(80 / ratio)
    # the same run with a measured p99 exactly at a row's limit keeps the SLA there, and
    # just above it breaks it: the limit is the --p99-ms-now threshold
    l4 = next(c for c in rs.candidates if c.gpu_model == "L4 24GB")
    for p99_now, holds in ((l4.sla_holds_if_p99_now_ms * 0.999, True),
                           (l4.sla_holds_if_p99_now_ms * 1.001, False)):
        r2 = rightsize(p, current_rate=rate, throughput_per_s=1200, sla_p99_ms=80,
                       p99_ms_now=p99_now)
        row = next(c for c in r2.candidates if c.gpu_model == "L4 24GB"
                   and c.provider == l4.provider and c.purchase == l4.purchase)
        assert row.meets_sla is holds and row.sla_holds_if_p99_now_ms is None
    best = rs.best
    assert best is not None and best.fits
    assert all(best.usd_per_hour <= c.usd_per_hour for c in rs.candidates
               if c.fits and c.purchase != "owned")
    bench = tmp_path / "bench.csv"
    bench.write_text("gpu_model,throughput_per_s,p99_ms\nH100 80GB SXM,400,40\n"
                     "L4 24GB,60,120\nA100 80GB SXM,200,70\n")
    rb = rightsize(p, current_rate=rate, throughput_per_s=1200, sla_p99_ms=80,
                   bench=load_bench(bench), bench_name="bench.csv")
    assert {c.gpu_model for c in rb.candidates} <= {"H100 80GB SXM", "L4 24GB", "A100 80GB SXM"}
    l4 = [c for c in rb.candidates if c.gpu_model == "L4 24GB"]
    assert l4 and all(c.meets_sla is False and not c.fits for c in l4)
    h100 = [c for c in rb.candidates if c.gpu_model == "H100 80GB SXM"]
    assert all(c.gpus == 4 and c.basis.startswith("bench.csv:") for c in h100)  # 1200/(400x.9)


def test_achieved_flops_from_a_known_count(capsys):
    p = build_profiles(open_samples(NANOGPT), step_s=10)
    rs = rightsize(p, current_rate=resolve_rate("H100"), throughput_per_s=1200, unit="tokens",
                   flops_per_unit=1.4e10)
    assert rs.achieved_tflops == pytest.approx(1200 * 1.4e10 / 1e12)
    assert rs.mfu == pytest.approx(rs.achieved_tflops / (989 * 8))
    assert any("below 10 %" in n for n in rs.notes)
    with pytest.raises(InputError, match="needs --throughput"):
        rightsize(p, current_rate=resolve_rate("H100"), flops_per_unit=1e9)
    assert main(["rightsize", str(NANOGPT), "--throughput", "1200/s", "--unit", "tokens",
                 "--flops-per-unit", "1.4e10", "--no-plan", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rightsize"]["achieved_tflops"] == pytest.approx(16.8)
    assert main(["rightsize", str(NANOGPT), "--flops-per-unit", "-3"]) == 2


def test_bench_table_errors_name_the_line(tmp_path):
    bad = tmp_path / "b.csv"
    bad.write_text("gpu_model,throughput_per_s,p99_ms\nH100,abc,3\n")
    with pytest.raises(InputError, match=r"b\.csv:2"):
        load_bench(bad)
    bad.write_text("gpu_model,throughput_per_s\nVoodoo5,3\n")
    with pytest.raises(InputError, match="unknown GPU model"):
        load_bench(bad)


OWNED_TOML = """
[[owned]]
gpu_model = "H100 80GB SXM"
purchase_usd_per_gpu = "30000"
life_years = "4"
usd_per_kwh = "0.12"
pue = "1.4"
hosting_usd_per_gpu_hour = "0.15"
support_usd_per_gpu_hour = "0.05"
source = "FY26 purchase order"
as_of = "2026-10-01"
"""


def test_owned_tco_and_break_even(tmp_path):
    cat = tmp_path / "owned.toml"
    cat.write_text(OWNED_TOML)
    (o,) = load_owned(cat)
    fixed = Decimal(30000) / (Decimal(4) * 8760) + Decimal("0.20")
    assert o.fixed_usd_per_gpu_hour == fixed
    energy = o.energy_usd_per_gpu_hour(Decimal(700))
    assert energy == Decimal(700) * Decimal("1.4") / 1000 * Decimal("0.12")
    rent = Decimal("3.00")
    duty = break_even_duty(o, Decimal(700), rent)
    assert duty is not None
    # at the break-even duty, owning costs exactly what renting those hours does
    assert o.usd_per_used_hour(Decimal(700), duty) == pytest.approx(rent)
    assert break_even_duty(o, Decimal(700), Decimal("0.50")) is None  # renting always cheaper
    p = build_profiles(open_samples(NANOGPT), step_s=10)
    rs = rightsize(p, current_rate=resolve_rate("H100"), owned=load_owned(cat), duty=0.5)
    own = [c for c in rs.candidates if c.purchase == "owned"]
    assert len(own) == 1 and own[0].provider == "owned"
    # measured watts of the run (same family) are used: mean of power_w
    watts = Decimal(str(round(float(np.nanmean(p.power_w_mean)), 1)))
    assert own[0].usd_per_gpu_hour == o.usd_per_used_hour(watts, Decimal("0.5"))
    assert own[0].break_even_duty is not None and 0 < own[0].break_even_duty < 1


def test_owned_catalog_errors(tmp_path):
    cat = tmp_path / "o.toml"
    cat.write_text('[[owned]]\ngpu_model = "H100"\npurchase_usd_per_gpu = "x"\n')
    with pytest.raises(InputError, match=r"\[\[owned\]\] #1"):
        load_owned(cat)


# --------------------------------------------------------------------------- CLI + recommender

def test_rightsize_cli_json_and_recommender(tmp_path, capsys):
    import pyarrow.parquet as pq

    cat = tmp_path / "owned.toml"
    cat.write_text(OWNED_TOML)
    out = tmp_path / "r.json"
    assert main(["rightsize", str(NANOGPT), "--sla-p99-ms", "80", "--throughput", "1200/s",
                 "--catalog", str(cat), "--format", "json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "gpuaudit.capacity" and doc["kind"] == "rightsize"
    rs = doc["rightsize"]
    assert rs["best"] and rs["candidates"][0]["fits"]
    assert any(c["purchase"] == "owned" for c in rs["candidates"])
    # nanoGPT keeps its H100s busy: no cheaper on-demand GPU at aws does the same work
    assert "right_size_simulated" not in {r["id"] for r in doc["plan"]["recommendations"]}
    # a steady 20 %-busy H100 job using 10 GB: a smaller GPU at the same provider fits
    steps = 240
    util = np.full((1, steps), 20.0)
    mem = np.full((1, steps), 10_000.0)
    small = tmp_path / "small.parquet"
    pq.write_table(_table(1, steps, util, mem), small)
    assert main(["rightsize", str(small), "--format", "json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    recs = {r["id"]: r for r in doc["plan"]["recommendations"]}
    assert recs["right_size_simulated"]["counted"]
    assert "aws on-demand" in recs["right_size_simulated"]["evidence"]
    if "right_size" in recs:
        assert not recs["right_size"]["counted"]
    sav = doc["plan"]["savings"]
    assert Decimal(sav["monthly_savings_usd"]) <= Decimal(sav["monthly_cost_usd"])
    for fmt in ("terminal", "markdown", "html"):
        assert main(["rightsize", str(NANOGPT), "--throughput", "1200/s", "--no-plan",
                     "--format", fmt]) == 0
        text = capsys.readouterr().out
        assert "H100 80GB SXM" in text and ("Right-sizing" in text)


def test_simulate_cli_on_a_recording_feeds_the_recommender(tmp_path):
    n, steps = 8, 60
    rng = np.random.default_rng(3)
    util = rng.uniform(2, 12, (n, steps))
    mem = rng.uniform(1000, 6000, (n, steps))
    path = tmp_path / "fleet.parquet"
    import pyarrow.parquet as pq

    pq.write_table(_table(n, steps, util, mem), path)
    out = tmp_path / "s.json"
    assert main(["simulate", str(path), "--policy", "mig", "--gpu-model", "H100",
                 "--format", "json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    (mig,) = doc["simulate"]["totals"]
    assert mig["policy"] == "mig" and mig["gpus_today"] == 8
    assert mig["lower_bound_gpus"] <= mig["gpus_needed"] < 8
    recs = {r["id"]: r for r in doc["plan"]["recommendations"]}
    assert recs["consolidation_simulated"]["counted"]
    # efficiency savings never above the measured waste
    sav = doc["plan"]["savings"]
    assert float(sav["efficiency_fraction"]) <= float(sav["waste_fraction"]) + 1e-9


def test_simulate_cli_errors(tmp_path):
    assert main(["simulate"]) == 2
    import pyarrow.parquet as pq

    path = tmp_path / "l4.parquet"
    pq.write_table(_table(2, 5, np.full((2, 5), 5.0), np.full((2, 5), 100.0),
                          model="NVIDIA L4"), path)
    assert main(["simulate", str(path), "--policy", "mig", "--no-plan"]) == 2
    assert main(["simulate", str(NANOGPT), "--gpu-model", "Voodoo5"]) == 2


# --------------------------------------------------------------------------- achieved vs peak

L40S_CAPTURE = ROOT / "tests" / "data" / "dcgm" / "l40s_upcloud_conformance.prom"


def _capture_series(values: dict[str, list[float]]) -> pa.Table:
    """The real L40S dcgm-exporter page, scraped once a minute with the given readings in
    place of its (idle) values."""
    import re

    from gpuaudit.measure.fleet.dcgm import parse_metrics_text

    text = L40S_CAPTURE.read_text()
    n = len(next(iter(values.values())))
    tables = []
    for i in range(n):
        page = text
        for metric, seq in values.items():
            page = re.sub(rf"^({metric}\{{[^}}]*\}}) \S+$", rf"\g<1> {seq[i]}", page,
                          flags=re.M)
        t, _ = parse_metrics_text(page, ts_ns=(T0 + 60 * i) * 1_000_000_000,
                                  default_host="gpu1", where=str(L40S_CAPTURE))
        tables.append(t)
    return pa.concat_tables(tables)


T0 = 1_704_067_200


def test_achieved_vs_peak_and_memory_bound_right_size():
    from gpuaudit.capacity.achieved import achieved_vs_peak

    idle = build_profiles(_capture_series({"DCGM_FI_DEV_GPU_UTIL": [0.0] * 5}), step_s=60)
    (a,) = achieved_vs_peak(idle)  # the capture as recorded: idle, nothing achieved
    assert a.gpu_model == "L40S 48GB" and not a.memory_bound
    assert a.bandwidth_gb_per_s == pytest.approx(a.dram_active * 864) and a.dram_active < 1e-3
    busy = _capture_series({"DCGM_FI_DEV_GPU_UTIL": [60.0] * 10,
                            "DCGM_FI_PROF_DRAM_ACTIVE": [0.7] * 10,
                            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": [0.05] * 10,
                            "DCGM_FI_DEV_FB_USED": [20_000.0] * 10})
    p = build_profiles(busy, step_s=60)
    (b,) = achieved_vs_peak(p)
    spec = spec_for("L40S")
    assert b.bandwidth_gb_per_s == pytest.approx(0.7 * spec.memory_bandwidth_gb_per_s, rel=1e-6)
    assert b.tensor_tflops == pytest.approx(0.05 * spec.bf16_dense_tflops, rel=1e-6)
    assert b.memory_bound
    rs = rightsize(p, current_rate=resolve_rate("L40S"))
    assert any("memory-bound" in n for n in rs.notes)
    l4 = next(c for c in rs.candidates if c.gpu_model == "L4 24GB")
    # scaled by bandwidth (864 / 300 GB/s), not by tensor peak (362 / 121 TFLOP/s)
    assert l4.basis == "estimate (bandwidth ratio)"
    assert l4.est_busy_pct * l4.gpus == pytest.approx(60.0 * 864 / 300, rel=1e-3)
    assert rs.mem_need_mib == pytest.approx(20_000 * 1.1)


@settings(max_examples=30)
@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1),
       st.floats(0.0, 1.0))
def test_capacity_findings_respect_the_combined_savings_rules(consol, right, seed, queue):
    from gpuaudit.api import audit
    from gpuaudit.recommend import Finding

    rng = np.random.default_rng(seed)
    n, steps = 3, 40
    util = rng.uniform(0, 100, (n, steps)) * (rng.random((n, 1)) < 0.8)
    mem = rng.uniform(500, 20_000, (n, steps))
    findings = [Finding("capacity_consolidation_share", consol, "sim", source="capacity"),
                Finding("capacity_right_size_share", right, "rs", source="capacity"),
                Finding("queue_idle_while_waiting_share", queue, "q", source="capacity")]
    report = audit(_table(n, steps, util, mem), findings=findings, provider="aws")
    plan = report.plan
    assert 0 <= plan.efficiency_fraction <= plan.waste_fraction
    assert plan.total_fraction <= 1
    assert plan.monthly_savings_usd <= plan.monthly_cost_usd
    by = {r.id: r for r in plan.recommendations}
    if consol > 1e-5 and plan.waste_fraction > 0:  # below 1e-6 a fraction rounds to 0
        sim = by["consolidation_simulated"]
        assert sim.counted and sim.fraction <= sim.cap <= plan.waste_fraction + Decimal("1e-6")
        for rid in ("mig", "mps", "time_slicing"):
            assert rid not in by or not by[rid].counted
    if right > 1e-5:
        assert by["right_size_simulated"].counted
        assert "right_size" not in by or not by["right_size"].counted
    # the scheduling finding: never above the idle cost measured, and the idle group (idle
    # shutdown and scheduling act on the same hours) never above it together
    idle_share = report.cost.total.phase_cost["idle"] / report.cost.total.observed_cost
    sched = by.get("schedule_waiting_pods")
    if queue > 1e-5 and idle_share > Decimal("1e-6"):
        assert sched is not None and sched.counted
        assert sched.fraction == min(Decimal(str(queue)), idle_share).quantize(Decimal("1e-6"))
        assert sched.cap == idle_share.quantize(Decimal("1e-6"))
    idle_group = [r for r in plan.recommendations if r.remediation.group == "idle" and r.counted]
    keep = Decimal(1)
    for r in idle_group:
        keep *= 1 - r.fraction
    assert min(1 - keep, max((r.cap for r in idle_group), default=Decimal(0))) <= \
        idle_share + Decimal("1e-6")


def test_main_model_is_the_most_common_and_a_tie_goes_to_the_first_by_name():
    """rightsize, simulate and their commands all take the current / target GPU from it, so a
    tie must not depend on set order (string hashing differs between processes)."""
    import dataclasses

    p = build_profiles(open_samples(NANOGPT), step_s=10)

    def with_models(*models: str | None) -> str | None:
        return dataclasses.replace(p, gpu_model=models).main_model

    assert with_models("L4", "A100", None, "L4") == "L4"
    assert with_models("L4", "A100", "A100", "L4", None, None) == "A100"
    assert with_models("L4", "H100") == "H100"
    assert with_models(None, None) is None
