"""`gpuaudit report` imports only what it uses (issue 27, beside the `--help` module-set test
in test_cli_help.py): the pipeline it runs, none of the other commands' compositions, no
module a report on a small recording does not need."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "diagnosis"

#: The other commands' compositions and stages, and packages the report does not use (msgspec
#: is used: the JSON encoder; numba:
#: only for batches large enough for classify's compiled pass, see classify.fused).
NOT_USED = {"gpuaudit.api.bill", "gpuaudit.api.fleet", "gpuaudit.api.queue",
            "gpuaudit.api.rightsize", "gpuaudit.api.simulate", "gpuaudit.api.trace",
            "gpuaudit.price.billing", "gpuaudit.capacity", "gpuaudit.traces",
            "gpuaudit.measure.fleet", "gpuaudit.integrate", "gpuaudit.classify._kernel"}
HEAVY = {"pandas", "duckdb", "httpx", "rich", "pynvml", "prometheus_client",
         "numba", "llvmlite"}


def _modules(*argv: str) -> tuple[int, set[str]]:
    code = ("import sys, json\nfrom gpuaudit.cli import run_argv\n"
            "rc = run_argv(sys.argv[1:])\nprint(json.dumps([rc, sorted(sys.modules)]))")
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       timeout=120)
    rc, mods = json.loads(p.stdout.strip().splitlines()[-1])
    return rc, set(mods)


def test_report_imports_only_what_it_uses(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    rc, mods = _modules("report", str(DATA / "straggler_lag_8xh100_10hz.parquet"), "--price",
                        "2", "--format", "json", "-o", str(out))
    assert rc == 0 and json.loads(out.read_text())["phases"]
    used = {"gpuaudit.api.audit", "gpuaudit.classify.passes", "gpuaudit.price.cost",
            "gpuaudit.recommend.plan", "gpuaudit.report.json", "numpy", "pyarrow"}
    assert used <= mods, sorted(used - mods)  # the check itself sees imports
    loaded = {m for m in mods if m in NOT_USED or m.split(".")[0] in HEAVY
              or any(m.startswith(f"{n}.") for n in NOT_USED)}
    assert not loaded, sorted(loaded)
