"""The public API is discoverable and typed (issue 26 part 2): every name in ``__all__`` of
``gpuaudit`` and ``gpuaudit.integrate`` resolves and is listed by ``dir()``; ``import gpuaudit``
stays light; ``by`` takes a string or a sequence and ``None`` means no grouping; every error
for bad input is an :class:`~gpuaudit.errors.InputError`; each CLI command has its call."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import gpuaudit
import gpuaudit.integrate
from gpuaudit.api.compose import group_keys
from gpuaudit.errors import InputError, PricingError

ROOT = Path(__file__).parents[2]
NANOGPT = ROOT / "src" / "gpuaudit" / "data" / "nanogpt_8xh100.parquet"
TRACES = ROOT / "tests" / "data" / "traces"

#: one call per CLI command that reads data (docs/python-api.md)
ENTRY_POINTS = ("audit", "audit_fleet", "audit_queue", "bill", "rightsize", "simulate",
                "trace", "kernel_summary", "monitor")


def test_every_entry_point_is_exported_listed_and_callable():
    for name in ENTRY_POINTS:
        assert name in gpuaudit.__all__, name
        assert name in dir(gpuaudit), name
        assert callable(getattr(gpuaudit, name)), name
    for name in gpuaudit.__all__:
        assert name in dir(gpuaudit), name
        assert getattr(gpuaudit, name) is not None, name


def test_integrate_lists_its_callbacks():
    from gpuaudit.errors import MissingExtraError

    assert set(gpuaudit.integrate.__all__) == {"HFCallback", "LightningCallback"}
    for name in gpuaudit.integrate.__all__:
        assert name in dir(gpuaudit.integrate), name
        try:  # the core venv has no transformers / lightning: the class says which extra
            assert inspect.isclass(getattr(gpuaudit.integrate, name)), name
        except MissingExtraError as exc:
            assert exc.extra in ("hf", "lightning"), exc


def test_every_lazy_name_is_in_all_and_typed_for_checkers():
    # a name loadable at run time but missing from __all__ or from the TYPE_CHECKING imports
    # is one mypy and pyright see as `object`
    src = (ROOT / "src" / "gpuaudit" / "__init__.py").read_text()
    head, _, _ = src.partition("__all__ = ")
    for name in gpuaudit._LAZY:
        assert name in gpuaudit.__all__, name
        assert f" {name}" in head.split("if TYPE_CHECKING:", 1)[1], name


def test_import_gpuaudit_stays_light():
    code = ("import sys, gpuaudit; dir(gpuaudit); "
            "print(sorted(m for m in ('pyarrow', 'numpy', 'gpuaudit.api', 'gpuaudit.monitor') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert json.loads(out.replace("'", '"')) == []


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gpuaudit.nope  # noqa: B018


@pytest.mark.parametrize("by,keys", [
    (None, ()), ((), ()), ("", ()), ("team", ("team",)), ("team,project", ("team", "project")),
    (" team , project ", ("team", "project")), (["team", "project"], ("team", "project")),
    (("team,project", "user"), ("team", "project", "user")),
])
def test_by_takes_a_string_or_a_sequence(by, keys):
    assert group_keys(by) == keys


def test_by_refuses_what_is_not_a_key_name():
    with pytest.raises(InputError, match="is not a group key name"):
        group_keys(["team", 3])  # type: ignore[list-item]


def test_audit_by_a_string_groups_by_that_key_not_its_letters():
    one = gpuaudit.audit(NANOGPT, by="host", price=1)
    seq = gpuaudit.audit(NANOGPT, by=["host"], price=1)
    assert one.usage.by == seq.usage.by == ("host",)
    assert one.to_dict()["groups"] == seq.to_dict()["groups"]
    two = gpuaudit.audit(NANOGPT, by="host,gpu_model", price=1)
    assert two.usage.by == ("host", "gpu_model")


def test_audit_by_none_is_no_grouping():
    none = gpuaudit.audit(NANOGPT, by=None, price=1)
    assert none.usage.by == ()
    assert none.to_dict()["cost"] == gpuaudit.audit(NANOGPT, price=1).to_dict()["cost"]


def test_fleet_by_none_is_one_fleet_wide_line_and_by_host_works():
    whole = gpuaudit.audit_fleet(recording=NANOGPT, by=None, pricing={"price": 1})
    assert [e["group"] for e in whole.extra["fleet"]["showback"]] == [{}]
    per_host = gpuaudit.audit_fleet(recording=NANOGPT, by="host", pricing={"price": 1})
    assert [e["group"] for e in per_host.extra["fleet"]["showback"]] == [
        {"host": "nanogpt-8xh100"}]


def test_pricing_errors_are_input_errors():
    assert issubclass(PricingError, InputError)
    with pytest.raises(InputError):
        gpuaudit.audit(NANOGPT, gpu_model="no such gpu")


def test_each_capacity_and_trace_call_returns_what_the_cli_renders():
    rs = gpuaudit.rightsize(NANOGPT, gpu_model="H100", throughput="1200/s", plan=False)
    assert rs.to_dict()["kind"] == "rightsize" and rs.audit is None
    assert rs.render("terminal") == str(rs)
    sim = gpuaudit.simulate(NANOGPT, policy="mig", by=None)
    assert sim.to_dict()["kind"] == "simulate"
    assert sim.audit is not None and sim.plan is not None
    tr = gpuaudit.trace(TRACES / "a100_1rank_ddp_nccl.json.gz", gpu_model="A100")
    assert tr.extra["trace"]["kind"] == "kineto"
    ks = gpuaudit.kernel_summary(TRACES / "nsys_cuda_gpu_kern_sum.csv", price="2")
    assert ks.to_dict()["trace"]["cost"]["usd_per_gpu_hour"] == "2"
    with pytest.raises(InputError, match="needs a timeline"):
        ks.render("html")


def test_simulate_refuses_an_unknown_policy():
    with pytest.raises(InputError, match="unknown consolidation policy"):
        gpuaudit.simulate(NANOGPT, policy="nope")
