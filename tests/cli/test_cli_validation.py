"""Every numeric and enumerated option of every command refuses hostile values cleanly.

The options are enumerated from click itself (every command in ``gpuaudit.cli.COMMANDS``, every
parameter it declares), so a new option cannot escape: one whose type is a bare click
FLOAT/INT/FloatRange/IntRange (which let ``nan`` and ``inf`` through) or an unvalidated string
fails ``test_every_option_is_validated_or_declared_free_text``. Each validated option is then
driven through the real entry point (``gpuaudit.cli.main`` as click's CliRunner calls it) with
hostile values drawn by hypothesis from the option's own declared range: nan, inf, -inf,
values below and above the bounds, non-numbers, fractions where a whole number is meant,
missing folders. Every one must end with exit status 2, an ``error:`` line naming the option
and no traceback.
"""

from __future__ import annotations

import math
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.cli import COMMANDS, cli
from gpuaudit.cli.params import (
    Duration,
    Money,
    Number,
    OutputDir,
    OutputFile,
    Parsed,
    PromDuration,
    Time,
    TimeZone,
)
from gpuaudit.validate import Quantity

DATA = Path(__file__).parents[1] / "data"
SMI_LOG = DATA / "nvidia_smi" / "smi_units.csv"

# The arguments each command needs besides the option under test (the option goes first, so
# it is parsed before anything runs); nothing here is reached unless validation is missing.
NEEDS: dict[str, list[str]] = {
    "report": [str(SMI_LOG)],
    "trace": [str(SMI_LOG)],
    "run": ["--", "true"],
    "scrape": ["http://127.0.0.1:9/metrics", "-o", "/tmp/gpuaudit-validation-never.parquet"],
    "rightsize": [str(SMI_LOG)],
    "simulate": [str(SMI_LOG)],
    "queue": ["--prometheus", "http://127.0.0.1:9"],
    "bill": [str(SMI_LOG)],
}

# Options that take free text (names, label keys, URLs, PromQL matchers, input files): not
# numbers or enumerations; each is checked where it is used. Anything else must be validated.
FREE_TEXT = {
    "--gpu-model": "a GPU model name, resolved by the catalog (PricingError lists known ones)",
    "--provider": "a provider name, resolved by the catalog (PricingError lists known ones)",
    "--catalog": "an input file (load_user_catalog reports a missing or bad file)",
    "--map": "a column mapping, parsed by measure.files.parse_mapping",
    "--fields": "nvidia-smi field names, checked by the log reader",
    "--by": "label keys; an unknown key is warned about in the report",
    "--host": "a host name",
    "--label": "KEY=VALUE, parsed by cli.run.parse_labels",
    "--selector": "PromQL label matchers",
    "--prometheus": "a URL",
    "--recording": "an input file that must exist (click.Path(exists=True))",
    "--map-file": "an input file that must exist (click.Path(exists=True))",
    "--web.config.file": "an input file, read and checked by integrate.webconfig",
    "--match": "LABEL=VALUE, parsed by cli.fleet._matchers",
    "--bearer-token-file": "an input file",
    "--bearer-token-env": "an environment variable name",
    "--basic-auth": "USER:ENV_VAR",
    "--ca-file": "an input file",
    "--title": "a dashboard title",
    "--uid": "a dashboard uid",
    "--source": "an input file (integrate.exporter.source_path reports a missing one)",
    "--listen": "HOST:PORT, parsed by integrate.exporter.parse_listen (tested below)",
    "--namespace": "a Kubernetes namespace",
    "--bench": "an input file that must exist (click.Path(exists=True))",
    "--trace": "a trace file or folder that must exist (click.Path(exists=True)); the loader "
               "reports a bad trace",
    "--telemetry": "an input file that must exist (click.Path(exists=True))",
    "--budgets": "an input file that must exist (click.Path(exists=True))",
    "--host-alias": "HOST=RESOURCE_ID, parsed by cli.bill",
    "--spark-master": "a Spark master URL; one Spark refuses is error/fix, exit 2 "
                      "(tests/billing/test_bill_spark.py)",
    "--spark-conf": "KEY=VALUE, parsed by cli.bill (tests/billing/test_bill_spark.py)",
}
# Enumerated or structured options a command checks first thing in its body (before any
# work), each driven below with its hostile values like the validated ones
CHECKED_IN_BODY: dict[tuple[str, str], list[str]] = {
    ("bill", "--format"): ["xml", "", "JSON", "pdf", "nan", "focus,json", "terminal "],
}
# Structured text read by a gpuaudit parser (cli.params.Parsed): each needs hostile examples
PARSED_HOSTILE: dict[str, list[str]] = {
    "--throughput": ["nan", "inf/s", "-5/s", "0", "abc", "", "5/fortnight", "1e999/h", "inf"],
    "--max-input-bytes": ["nan", "-1", "0", "abc", "", "10XB", "1e999", "inf"],
    "--memory-limit": ["nan", "-1", "0", "abc", "", "10XB", "1e999", "inf", "1KB", "1048575"],
}
ARGUMENTS = {"path", "paths", "urls", "command", "bill_path"}  # (simulate's path is optional)  # positional: input paths, URLs, a command
VALIDATED = (Number, Money, Duration, PromDuration, Time, TimeZone, OutputFile, OutputDir,
             Parsed, click.Choice)


def _commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(cli)
    out = []
    for name in sorted(COMMANDS):
        cmd = cli.get_command(ctx, name)
        assert cmd is not None, name
        out.append((name, cmd))
    return out


def _options() -> list[tuple[str, click.Option]]:
    return [(name, p) for name, cmd in _commands() for p in cmd.params
            if isinstance(p, click.Option) and not p.is_flag and not p.is_bool_flag
            and not isinstance(p.type, click.types.BoolParamType)]


def _long(opt: click.Option) -> str:
    return max(opt.opts, key=len)


VALIDATED_OPTIONS = [(c, o) for c, o in _options() if isinstance(o.type, VALIDATED)]


def test_every_option_is_validated_or_declared_free_text() -> None:
    unknown = []
    for name, cmd in _commands():
        for p in cmd.params:
            if isinstance(p, click.Argument):
                if p.name not in ARGUMENTS:
                    unknown.append(f"{name} argument {p.name}")
                continue
            assert isinstance(p, click.Option)
            if p.is_flag or p.count or isinstance(p.type, click.types.BoolParamType):
                continue  # flags, and -v counted
            if isinstance(p.type, Parsed):
                assert _long(p) in PARSED_HOSTILE, f"{name} {_long(p)}: add hostile examples"
                continue
            if isinstance(p.type, VALIDATED):
                continue
            # a bare click number type lets nan/inf/huge values through
            assert not isinstance(p.type, (click.types.FloatParamType, click.types.IntParamType,
                                           click.FloatRange, click.IntRange)), \
                f"{name} {_long(p)}: use gpuaudit.cli.params.Number(<Quantity>)"
            if (name, _long(p)) in CHECKED_IN_BODY:
                continue
            if _long(p) not in FREE_TEXT:
                unknown.append(f"{name} {_long(p)} ({p.type})")
    assert not unknown, ("options that are neither validated (gpuaudit.cli.params) nor "
                         f"declared free text here: {unknown}")
    assert len(VALIDATED_OPTIONS) >= 60  # the walk really found the commands' options


# -- hostile values, from each option's own declared range ------------------------------------
NOT_NUMBERS = ["nan", "NaN", "-nan", "inf", "-inf", "+Infinity", "1e999", "-1e999", "abc", "",
               " ", "1,5", "0x10", "1e", "--", "½", "None"]


def _fmt(x: float) -> str:
    return repr(float(x))


def _numbers(q: Quantity) -> st.SearchStrategy[str]:
    bad: list[st.SearchStrategy[str]] = [st.sampled_from(NOT_NUMBERS)]
    if q.low is not None:
        low = q.low
        below = st.floats(max_value=low, allow_nan=False, allow_infinity=False).filter(
            lambda x: x < low or (q.low_open and x == low))
        bad.append(below.map(_fmt))
        if q.low_open:
            bad.append(st.just(_fmt(low)))
    if q.high is not None:
        high = q.high
        bad.append(st.floats(min_value=high, allow_nan=False, allow_infinity=False,
                             exclude_min=True).map(_fmt))
        bad.append(st.just("1e30"))
    if q.whole:
        lo = q.low if q.low is not None else -1e6
        hi = min(q.high if q.high is not None else 1e6, 1e15)
        bad.append(st.floats(min_value=lo, max_value=hi).filter(
            lambda x: x != int(x)).map(_fmt))
    return st.one_of(bad)


def _durations(q: Quantity, prom: bool) -> st.SearchStrategy[str]:
    bad = ["nan", "inf", "-inf", "-5s", "abc", "5x", "", "1e999", "s", "5 m", "-1"]
    if prom:
        bad += ["1.5h", "an hour", "900", "0s", "0m"]
    hi = q.high if q.high is not None else 1e12
    outside: list[st.SearchStrategy[str]] = [st.sampled_from(bad)]
    outside.append(st.integers(min_value=int(hi // 86400) + 2, max_value=10**9).map(
        lambda d: f"{d}d"))
    if q.low is not None and q.low > 0 and not prom:
        outside.append(st.floats(min_value=0, max_value=q.low, exclude_max=True).map(_fmt))
    return st.one_of(outside)


def _times() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["nan", "inf", "-inf", "-1", "1e30", "yesterday", "2025-13-45",
                         "2025-01-01T25:00:00", "", "now-1h"]),
        st.floats(min_value=7_258_118_400.0, exclude_min=True, allow_infinity=False,
                  allow_nan=False).map(_fmt),
        st.floats(max_value=0.0, exclude_max=True, allow_infinity=False,
                  allow_nan=False).filter(lambda x: x < 0).map(_fmt))


def _zones() -> st.SearchStrategy[str]:
    return st.sampled_from(["Mars/Olympus", "Europe/Berln", "", "+25:00", "../../etc/passwd",
                            "UTC+99", "America/", "nan", "Olympus Mons"])


def _outputs(tmp: Path) -> st.SearchStrategy[str]:
    return st.sampled_from([str(tmp / "missing-folder" / "x.json"),
                            "/nonexistent-gpuaudit-folder/sub/x.parquet",
                            str(SMI_LOG / "x.json"),  # a "folder" that is a file
                            str(tmp)])  # an existing folder, not a file


def _choices(choices: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(["", "nan", "1", "PDF", "ON-DEMAND", "spot "]),
                     st.text(min_size=1, max_size=12).filter(
                         lambda s: s not in choices and not s.startswith("-")))


def _hostile(opt: click.Option, tmp: Path) -> st.SearchStrategy[str]:
    t = opt.type
    if isinstance(t, Number):  # Money too
        return _numbers(t.quantity)
    if isinstance(t, PromDuration):
        return _durations(t.quantity, prom=True)
    if isinstance(t, Duration):
        return _durations(t.quantity, prom=False)
    if isinstance(t, Time):
        return _times()
    if isinstance(t, TimeZone):
        return _zones()
    if isinstance(t, OutputFile):
        return _outputs(tmp)
    if isinstance(t, OutputDir):
        return st.sampled_from([str(tmp / "missing-folder" / "sql"), str(SMI_LOG),
                                "/nonexistent-gpuaudit-folder/sub/sql"])
    if isinstance(t, Parsed):
        return st.sampled_from(PARSED_HOSTILE[_long(opt)])
    assert isinstance(t, click.Choice)
    return _choices(tuple(str(c) for c in t.choices))


def _invoke(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(cli, args, catch_exceptions=True)
    text = res.output + (res.stderr if res.stderr_bytes is not None else "")
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        text += "".join(traceback.format_exception(res.exception))
    return res.exit_code, text


def _assert_clean_refusal(command: str, opt: click.Option, value: str) -> None:
    needs = NEEDS.get(command, [])
    if "-o" in needs and "-o" in opt.opts:  # the option under test is the needed one
        needs = needs[: needs.index("-o")]
    args = [command, f"{_long(opt)}={value}" if value.startswith("-") or value == ""
            else _long(opt), *([] if value.startswith("-") or value == "" else [value]),
            *needs]
    code, text = _invoke(args)
    assert "Traceback" not in text, (args, text)
    assert code == 2, (args, code, text)
    lines = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert lines, (args, text)
    assert "Error:" not in text, (args, text)  # one spelling: lower case
    assert _long(opt) in lines[0], (args, lines[0])


@pytest.mark.parametrize(("command", "opt"), VALIDATED_OPTIONS,
                         ids=[f"{c} {_long(o)}" for c, o in VALIDATED_OPTIONS])
def test_hostile_values_exit_2_naming_the_option(command: str, opt: click.Option,
                                                 tmp_path_factory: pytest.TempPathFactory,
                                                 ) -> None:
    tmp = tmp_path_factory.mktemp("out")

    @settings(max_examples=20)
    @given(value=_hostile(opt, tmp))
    def check(value: str) -> None:
        _assert_clean_refusal(command, opt, value)

    check()


@pytest.mark.parametrize(("command", "option"), list(CHECKED_IN_BODY))
def test_options_checked_in_the_body_refuse_hostile_values(command: str, option: str) -> None:
    ctx = click.Context(cli)
    cmd = cli.get_command(ctx, command)
    assert cmd is not None
    opt = next(p for p in cmd.params if isinstance(p, click.Option) and option in p.opts)
    for value in CHECKED_IN_BODY[(command, option)]:
        _assert_clean_refusal(command, opt, value)


# -- the cases issue 14 lists, by name ---------------------------------------------------------
ISSUE_CASES = [
    ("report", "--price", "nan"), ("report", "--price", "inf"), ("report", "--price", "1e30"),
    ("report", "--price", "-2"), ("audit", "--price", "nan"), ("trace", "--price", "inf"),
    ("report", "--tokens", "nan"), ("report", "--tokens", "-5"),
    ("report", "--interval", "nan"), ("report", "--interval", "-1"),
    ("report", "--interval", "0"), ("report", "--energy-price", "-1"),
    ("report", "--energy-price", "nan"), ("report", "--steps", "inf"),
    ("audit", "--hz", "0"), ("audit", "--hz", "nan"), ("audit", "--duration", "-5"),
    ("report", "--tz", "Mars/Olympus"), ("report", "--output", "/missing/dir/x"),
    ("sample", "--duration", "nan"), ("exporter", "--interval", "inf"),
    ("fleet", "--since", "nan"), ("fleet", "--step", "0"), ("scrape", "--every", "-1"),
    ("alerts", "--memory-pressure", "85"), ("alerts", "--for", "1.5h"),
]


@pytest.mark.parametrize(("command", "option", "value"), ISSUE_CASES)
def test_issue_14_cases(command: str, option: str, value: str) -> None:
    ctx = click.Context(cli)
    cmd = cli.get_command(ctx, command)
    assert cmd is not None
    opt = next(p for p in cmd.params if isinstance(p, click.Option) and option in p.opts)
    _assert_clean_refusal(command, opt, value)


def test_messages_name_the_unit_and_the_bound() -> None:
    code, text = _invoke(["report", "--price", "1e30", str(SMI_LOG)])
    assert code == 2 and "1,000 USD per GPU-hour" in text
    code, text = _invoke(["report", "--tokens", "-5", str(SMI_LOG)])
    assert code == 2 and "tokens" in text and "more than 0" in text
    code, text = _invoke(["audit", "--hz", "0"])
    assert code == 2 and "Hz" in text and "0.01" in text
    code, text = _invoke(["report", "--tz", "Europe/Berln", str(SMI_LOG)])
    assert code == 2 and "Europe/Berlin" in text  # the close name is suggested
    code, text = _invoke(["report", "-o", "/missing/dir/x", str(SMI_LOG)])
    assert code == 2 and "'/missing/dir' does not exist" in text and "mkdir -p" in text
    assert not Path("/missing").exists()  # nothing created


@settings(max_examples=30)
@given(listen=st.one_of(st.sampled_from(["nonsense", "host:99999", "host:-1", ":nan", "", ":",
                                         "127.0.0.1:65536", "127.0.0.1:1e3"]),
                        st.integers(min_value=65536).map(lambda p: f"127.0.0.1:{p}")))
def test_exporter_listen_address_is_checked(listen: str) -> None:
    code, text = _invoke(["exporter", f"--listen={listen}", "--source", str(SMI_LOG),
                          "--price", "1"])
    assert code == 2 and "Traceback" not in text
    assert any(ln.startswith("error:") and "--listen" in ln for ln in text.splitlines()), text


# -- the same values are accepted where they make sense -----------------------------------------
@pytest.mark.parametrize(("command", "opt"),
                         [(c, o) for c, o in VALIDATED_OPTIONS if isinstance(o.type, Number)],
                         ids=[f"{c} {_long(o)}" for c, o in VALIDATED_OPTIONS
                              if isinstance(o.type, Number)])
def test_values_in_range_are_accepted(command: str, opt: click.Option) -> None:
    q = opt.type.quantity  # type: ignore[attr-defined]
    lo = q.low if q.low is not None else -1e6
    hi = q.high if q.high is not None else 1e6

    @settings(max_examples=20)
    @given(x=st.floats(min_value=lo, max_value=hi, exclude_min=q.low_open))
    def check(x: float) -> None:
        if q.whole:
            x = float(math.floor(x)) if math.floor(x) >= lo else float(math.ceil(x))
            if q.low_open and x == lo:
                return
        got = opt.type.convert(repr(x), opt, None)
        assert float(got) == pytest.approx(x, rel=1e-12, abs=0.0)

    check()


# -- error spelling across commands: click's own usage errors too -------------------------------
@pytest.mark.parametrize("args", [
    ["nosuchcommand"], ["report"], ["report", "--nosuchflag", str(SMI_LOG)],
    ["fleet", "--format", "pdf"], ["alerts", "--underutil-pct"], ["trace"],
    ["report", str(DATA / "no-such-file.csv")], ["scrape", "http://x"],
])
def test_every_error_says_error_in_lower_case(args: list[str]) -> None:
    code, text = _invoke(args)
    assert code == 2, text
    assert "Error:" not in text and "error: " in text and "Traceback" not in text
