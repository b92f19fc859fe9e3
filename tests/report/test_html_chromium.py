"""The HTML report in real headless Chromium (Debian's /usr/bin/chromium).

Driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: commands on fd 3,
replies on fd 4, NUL-separated JSON), so no websocket library and no port are needed. Each
page load collects uncaught exceptions, console errors, log errors (CSP violations land
there) and dialogs; screenshots at 1280 and 390 px are decoded with Pillow and every chart
region must hold a real share of non-background pixels.
"""

from __future__ import annotations

import base64
import io
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_html_report import EVIL_POD, EVIL_TEAM, synthetic_table

from gpuaudit.api import audit

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium is not installed"),
]
Image = pytest.importorskip("PIL.Image")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--mute-audio", "--remote-debugging-pipe"]


class Browser:
    """A minimal DevTools-protocol client over Chromium's debugging pipe."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="gpuaudit-chromium-")
        cmd = " ".join([CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"])
        # fd 3 = our stdin pipe (commands), fd 4 = our stdout pipe (replies)
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec 3<&0 4>&1 0</dev/null 1>/dev/null; exec {cmd}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", session=True)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        buf = b""
        while True:
            chunk = self.proc.stdout.read1(1 << 16)
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                msg, buf = buf.split(b"\0", 1)
                self.inbox.put(json.loads(msg))

    def call(self, method: str, session: bool = False, timeout: float = 30.0,
             **params: Any) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\0")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            m = self.inbox.get(timeout=max(0.1, deadline - time.monotonic()))
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return dict(m.get("result", {}))
            if "method" in m:
                self.events.append(m)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        for ev in self.events:
            if ev["method"] == method:
                return ev
        deadline = time.monotonic() + timeout
        while True:
            m = self.inbox.get(timeout=max(0.1, deadline - time.monotonic()))
            if "method" in m:
                self.events.append(m)
                if m["method"] == method:
                    return m

    def evaluate(self, expr: str) -> Any:
        r = self.call("Runtime.evaluate", session=True, expression=expr, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(r["exceptionDetails"])
        return r["result"].get("value")

    def load(self, url: str, width: int) -> None:
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=900,
                  deviceScaleFactor=1, mobile=width < 600)
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_event("Page.loadEventFired")

    def screenshot(self) -> Any:
        metrics = self.call("Page.getLayoutMetrics", session=True)
        size = metrics["cssContentSize"]
        shot = self.call("Page.captureScreenshot", session=True, format="png",
                         captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": size["width"],
                               "height": size["height"], "scale": 1})
        return Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")

    def problems(self) -> list[str]:
        out = []
        for ev in self.events:
            m, p = ev["method"], ev.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(f"exception: {p['exceptionDetails']}")
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(f"console.{p['type']}: {p.get('args')}")
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
            elif m == "Page.javascriptDialogOpening":
                out.append(f"dialog: {p.get('message')}")
        return out

    def close(self) -> None:
        try:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Any:
    b = Browser()
    yield b
    b.close()


@pytest.fixture(scope="module")
def report_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = audit(synthetic_table(), by=("namespace", "pod", "team"), price="2.50",
                   extra={"fleet": {"cluster": "<b>prod</b>", "nodes": [
                       {"node": "n1", "gpus": 8}, {"node": "<i>n2</i>", "gpus": 4}]},
                       "trace": {"kernels": 1234, "top": ["gemm", "<svg onload=alert(3)>"]}})
    path = tmp_path_factory.mktemp("html") / "report.html"
    path.write_text(result.render("html"), encoding="utf-8")
    return path


CHART_RECTS = """JSON.stringify(Array.from(document.querySelectorAll('[data-chart]')).map(
  function(e){var r=e.getBoundingClientRect();
  return {id:e.id,x:r.left+window.scrollX,y:r.top+window.scrollY,w:r.width,h:r.height};}))"""


@pytest.mark.parametrize("width", [1280, 390])
def test_page_loads_clean_and_charts_render(browser: Browser, report_file: Path,
                                            width: int) -> None:
    browser.load(report_file.as_uri(), width)
    assert browser.evaluate("document.documentElement.getAttribute('data-ready')") == "1", \
        "the page's script did not run (CSP hash mismatch?)"
    assert browser.problems() == []
    # responsive: nothing wider than the viewport but the scrollable tables inside
    assert browser.evaluate("document.documentElement.scrollWidth") <= width
    rects = json.loads(browser.evaluate(CHART_RECTS))
    ids = {r["id"] for r in rects}
    assert {"chart-phases", "chart-timeline", "chart-histogram", "chart-waterfall"} <= ids
    img = np.asarray(browser.screenshot()).astype(np.int16)
    for r in rects:
        x0, y0 = int(r["x"]), int(r["y"])
        x1, y1 = int(r["x"] + r["w"]), int(r["y"] + r["h"])
        assert x1 - x0 > 100 and y1 - y0 > 10, r
        region = img[y0:y1, x0:x1]
        ink = (np.abs(region - 255).sum(axis=2) > 60).mean()
        assert ink > 0.05, f"{r['id']} at {width}px is nearly blank ({ink:.1%} ink)"
        colors = {tuple(c) for c in region.reshape(-1, 3)[::7].tolist()}
        assert len(colors) >= 3, f"{r['id']} at {width}px has {len(colors)} colours"


def test_labels_stay_text_in_the_browser(browser: Browser, report_file: Path) -> None:
    browser.load(report_file.as_uri(), 1280)
    assert browser.problems() == []
    assert browser.evaluate("document.scripts.length") == 1
    assert browser.evaluate("document.querySelectorAll('img, iframe, object').length") == 0
    assert browser.evaluate("document.querySelectorAll('#extra-fleet b, #extra-fleet i, "
                            "#extra-trace svg').length") == 0
    assert browser.evaluate("""Array.from(document.querySelectorAll('*')).some(function(e){
      return Array.from(e.attributes).some(function(a){return a.name.indexOf('on')===0;});})
      """) is False
    text = browser.evaluate("document.body.innerText")
    assert EVIL_POD in text
    assert EVIL_TEAM in text
    assert "<b>prod</b>" in text and "<svg onload=alert(3)>" in text


def test_table_sorts_on_click(browser: Browser, report_file: Path) -> None:
    browser.load(report_file.as_uri(), 1280)
    js_col = """(function(i){var t=document.getElementById('breakdown-table');
      return Array.from(t.tBodies[0].rows).map(function(r){
        return parseFloat(r.cells[i].getAttribute('data-v'));});})"""
    idx = browser.evaluate("""Array.from(document.querySelectorAll('#breakdown-table thead th'))
      .findIndex(function(th){return th.textContent==='cost';})""")
    assert idx > 0
    browser.evaluate(f"document.querySelectorAll('#breakdown-table thead th')[{idx}].click()")
    asc = browser.evaluate(f"{js_col}({idx})")
    assert asc == sorted(asc)
    browser.evaluate(f"document.querySelectorAll('#breakdown-table thead th')[{idx}].click()")
    desc = browser.evaluate(f"{js_col}({idx})")
    assert desc == sorted(desc, reverse=True)
    assert browser.problems() == []
