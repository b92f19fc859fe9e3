"""The file readers fuzzed in CI (issue 22): tests/fuzz/harness.py mutates real fixtures and
feeds them to every reader in its own process; it must end with no crash (a signal), no
traceback, and a peak RSS under the cap. The example set is fixed (derandomized), so a
failure reproduces with `python tests/fuzz/harness.py --examples 300`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HARNESS = Path(__file__).with_name("harness.py")
RSS_CAP_MIB = 1024  # the readers on these inputs stay far below; a bomb would not


def test_readers_survive_mutated_real_files() -> None:
    p = subprocess.run([sys.executable, str(HARNESS), "--examples", "300"],
                       capture_output=True, text=True, timeout=900,
                       env={**os.environ, "GPUAUDIT_MAX_INPUT_BYTES": "64MiB"})
    assert p.returncode == 0, (p.returncode, p.stdout[-3000:], p.stderr[-6000:])
    assert "Traceback" not in p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    peak_mib = summary.pop("peak_rss_mib")
    assert set(summary) == {"csv", "smi-noheader", "jsonl", "dcgm", "kineto", "focus"}
    for name, counts in summary.items():
        assert counts["ok"] + counts["clear_error"] == 300, name
        assert counts["ok"] > 0, f"{name}: no mutated file was read: the fuzz tests nothing"
    assert peak_mib < RSS_CAP_MIB, f"peak RSS {peak_mib:.0f} MiB"
