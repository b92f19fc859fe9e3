"""The HTML report as text: self-contained, escaped, built only from the audit result."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa

from gpuaudit.api import audit
from gpuaudit.cli import main
from gpuaudit.schema import build_table

EVIL_POD = "<script>alert(1)</script>"
EVIL_TEAM = '"><img src=x onerror=alert(2)>'
SMI_LOG = Path(__file__).parents[1] / "data" / "html_report" / "nanogpt_8xh100_head.csv"


def synthetic_table(seconds: int = 1800, seed: int = 7) -> pa.Table:
    """Three GPUs at 1 s: one mostly idle (held by an evil-named pod), one bursty, one busy."""
    rng = np.random.default_rng(seed)
    t0 = np.datetime64("2025-06-01T12:00:00", "ns").astype(np.int64)
    ts = t0 + np.arange(seconds, dtype=np.int64) * 1_000_000_000
    utils = [
        np.where(rng.random(seconds) < 0.9, 0.0, 40.0),
        np.where((np.arange(seconds) // 30) % 2 == 0, 0.0, 100.0),
        np.clip(rng.normal(85, 8, seconds), 0, 100),
    ]
    pods = [EVIL_POD, "trainer-1", "server-0"]
    teams = [EVIL_TEAM, "vision", "serving"]
    n = 3 * seconds
    order = np.argsort(np.tile(np.arange(seconds), 3), kind="stable")
    labels = pa.array([[("team", t)] for t in np.repeat(teams, seconds)],
                      type=pa.map_(pa.string(), pa.string()))
    cols = {
        "ts": pa.array(np.tile(ts, 3)[order], pa.timestamp("ns", tz="UTC")),
        "host": ["node-a"] * n,
        "gpu_uuid": np.repeat([f"GPU-{i:04d}" for i in range(3)], seconds)[order].tolist(),
        "gpu_model": ["NVIDIA H100 80GB HBM3"] * n,
        "util_gpu_pct": np.concatenate(utils)[order].astype(np.float32),
        "power_w": np.concatenate(utils)[order].astype(np.float32) * 6 + 70,
        "namespace": np.repeat(["ml", "ml", "prod"], seconds)[order].tolist(),
        "pod": np.repeat(pods, seconds)[order].tolist(),
        "labels": labels.take(pa.array(order)),
    }
    return build_table(cols)


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _render() -> str:
    result = audit(synthetic_table(), by=("namespace", "pod", "team"), price="2.50",
                   extra={"fleet": {"<b>cluster</b>": EVIL_POD}, "trace": [{"k": EVIL_TEAM}],
                          "custom": {"x": 1}})
    return result.render("html")


def test_labels_are_escaped_everywhere() -> None:
    page = _render()
    assert EVIL_POD not in page
    assert "<img" not in page and "<b>cluster" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    p = _Collect()
    p.feed(page)
    scripts = [a for t, a in p.tags if t == "script"]
    assert len(scripts) == 1
    assert not any(k.startswith("on") for _t, a in p.tags for k in a)


def test_self_contained_with_a_strict_policy() -> None:
    page = _render()
    p = _Collect()
    p.feed(page)
    for tag, attrs in p.tags:
        for k in ("src", "href"):
            v = attrs.get(k)
            assert v is None or not re.match(r"^(https?:)?//", v), (tag, attrs)
        assert tag not in ("link", "iframe", "img")
    csp = next(a["content"] for t, a in p.tags
               if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert csp is not None and "default-src 'none'" in csp and "unsafe-inline'" not in \
        csp.split("script-src")[1].split(";")[0]


def test_sections_and_figures_come_from_the_result() -> None:
    result = audit(synthetic_table(), by=("team",), price="2.50",
                   extra={"fleet": {"gpus": 3}, "trace": {"kernels": 5}})
    page = result.render("html")
    for sid in ("phases", "timeline", "histogram", "waterfall", "breakdown", "recommendations",
                "extra-fleet", "extra-trace"):
        assert f'id="{sid}"' in page, sid
    c, p = result.cost, result.plan
    from gpuaudit.price.money import cents

    assert f"${cents(c.total.observed_cost):,.2f}" in page
    assert f"${cents(p.monthly_savings_usd):,.2f}" in page
    for r in p.recommendations:
        assert f'id="rec-{r.id}"' in page
    # one timeline row per GPU, one histogram bar per bin
    tl = result.extra["timeline"]
    assert page.count("<polyline") >= len(tl["gpus"])
    assert "WRONG" in page


def test_no_timeline_for_a_one_shot_stream() -> None:
    rec = audit(synthetic_table(300), price="1").usage

    class Stream:
        source, origin, interval_s = "stream", "a live stream", None
        notes: tuple[object, ...] = ()
        events: tuple[str, ...] = ()

        def batches(self):  # type: ignore[no-untyped-def]
            yield from synthetic_table(300).to_batches()

    result = audit(Stream(), price="1")  # type: ignore[arg-type]
    assert "timeline" not in result.extra
    assert result.usage.overall().observed_s == rec.overall().observed_s
    assert "No timeline" in result.render("html")


def test_cli_writes_an_html_report_from_a_real_log(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    rc = main(["report", str(SMI_LOG), "--gpu-model", "H100", "--format", "html", "-o",
               str(out)])
    assert rc == 0
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count('data-chart="') == 4
