"""PromQL text: escaped label values, matcher lists, durations, fresh-sample expressions and
step-aligned chunks of a range.

Rank 0, beside the schema: the Prometheus client (``measure``) and the phase classification
pushed down as PromQL (``classify``) both write PromQL, and neither may import the other.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping

from gpuaudit.errors import InputError

__all__ = ["NODE_CPU", "alternation", "duration", "escape_label_value", "fresh",
           "node_cpu_pct", "parse_selector", "regex_of", "selector",
           "time_chunks", "with_matcher"]


def escape_label_value(value: str) -> str:
    """``value`` as a PromQL double-quoted string body: backslash, quote and newline escaped.

    PromQL strings follow Go's escaping; escaping these three (plus carriage return and tab)
    means no label value can end the string early and inject PromQL.
    """
    return (value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            .replace("\r", "\\r").replace("\t", "\\t"))


def selector(matchers: Mapping[str, str] | None = None, *, regex: Mapping[str, str] | None = None,
             ) -> str:
    """A label-matcher list ``{k="v",k2=~"re"}`` with every value escaped ('' when empty)."""
    parts = [f'{k}="{escape_label_value(v)}"' for k, v in sorted((matchers or {}).items())]
    parts += [f'{k}=~"{escape_label_value(v)}"' for k, v in sorted((regex or {}).items())]
    for k in [*(matchers or {}), *(regex or {})]:
        if not k or not (k[0].isalpha() or k[0] == "_") or not all(
                c.isalnum() or c == "_" for c in k):
            raise InputError(f"invalid label name {k!r}",
                             fix="label names are [a-zA-Z_][a-zA-Z0-9_]*")
    return "{" + ",".join(parts) + "}" if parts else ""


def time_chunks(start_s: float, end_s: float, step_s: float,
                max_points: int) -> list[tuple[float, float]]:
    """[start, end] cut into inclusive, step-aligned pieces of at most ``max_points`` points."""
    if end_s < start_s:
        raise InputError(f"range end {end_s} is before start {start_s}",
                         fix="--start must be before --end")
    out = []
    span = step_s * (max_points - 1)
    a = start_s
    while a <= end_s:
        b = min(a + span, end_s)
        out.append((a, b))
        a = b + step_s
    return out


def duration(seconds: float) -> str:
    """A PromQL duration in whole milliseconds (``86400000ms``)."""
    return f"{round(seconds * 1000)}ms"


def fresh(sel: str, step_s: float) -> str:
    """``last_over_time(<sel>[step - 1ms])``: the sample scraped within the last step only.

    At each step of a range query (or subquery) this sees a sample once, and a GPU that
    stopped reporting has no value (no 5-minute lookback hold), so a missing scrape is
    unobserved time, as in the local classify engine.
    """
    return f"last_over_time({sel}[{duration(step_s - 0.001)}])"


def with_matcher(sel: str, extra: str) -> str:
    """``sel`` (a matcher list or '') with the matcher ``extra`` added."""
    inner = sel[1:-1] if sel else ""
    return "{" + ",".join(x for x in (inner, extra) if x) + "}"



def regex_of(values: set[str]) -> str:
    """An escaped RE2 alternation for a label matcher selecting exactly ``values``."""
    return escape_label_value(alternation(sorted(values)))


def alternation(values: list[str]) -> str:
    """An RE2 alternation matching exactly ``values`` (Prometheus anchors regex matchers)."""
    special = set("\\.+*?()|[]{}^$")
    return "|".join("".join("\\" + c if c in special else c for c in v) for v in values)


_MATCHER = re.compile(
    r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\')'
    r"\s*(,|$)")


def parse_selector(text: str, *, what: str = "--selector") -> str:
    """A user's label matchers (``cluster="prod",team=~"ml.*"``, braces optional) checked as
    PromQL and written back canonically; a typo is an :class:`InputError` naming the column
    where it breaks, instead of a rules file Prometheus rejects."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    if not body.strip():
        return ""
    out = []
    pos = 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None:
            raise InputError(
                f"{what} {text!r} is not a list of PromQL label matchers (it breaks at "
                f"character {pos + 1}: {body[pos:pos + 20]!r})",
                fix='write label="value" pairs separated by commas, with =, !=, =~ or !~: '
                'cluster="prod",team=~"ml.*"')
        name, op, quoted = m.group(1), m.group(2), m.group(3)
        try:
            value = ast.literal_eval(quoted)
        except (ValueError, SyntaxError) as exc:
            raise InputError(f"{what}: the value {quoted} of {name} is not a valid string",
                             fix="escape quotes and backslashes in label values") from exc
        out.append(f'{name}{op}"{escape_label_value(str(value))}"')
        pos = m.end()
        if m.group(4) == "," and pos >= len(body):
            break
    return ",".join(out)


#: node_exporter's per-CPU, per-mode CPU time counter
NODE_CPU = "node_cpu_seconds_total"


def node_cpu_pct(step_s: float, *, by_hostname: bool = False) -> str:
    """PromQL for each node's CPU busy share, percent of all its cores, from node_exporter:
    the rate of every mode but ``idle`` and ``iowait`` over the rate of all modes, by
    ``instance``, with ``node_uname_info``'s ``nodename`` joined on where it is scraped.

    At steps under a minute ``irate(...[2m])`` (the last two scrapes: the finest the counter
    allows, for any scrape interval up to a minute); from a minute on ``rate(...[step])``
    (the mean over the step). ``by_hostname``: one series per ``Hostname`` (the nodename,
    dcgm-exporter's label for the node), for matching against GPU series in PromQL.
    """
    fn, rng = ("rate", duration(step_s)) if step_s >= 60 else ("irate", "2m")
    busy = f'sum by (instance) ({fn}({NODE_CPU}{{mode!~"idle|iowait"}}[{rng}]))'
    total = f"sum by (instance) ({fn}({NODE_CPU}[{rng}]))"
    ratio = f"(100 * {busy} / {total})"
    named = f"{ratio} * on(instance) group_left(nodename) max by (instance, nodename) " \
            "(node_uname_info)"
    if by_hostname:
        return f'max by (Hostname) (label_replace({named}, "Hostname", "$1", "nodename", "(.+)"))'
    return f"{named} or on(instance) {ratio}"
