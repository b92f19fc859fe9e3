"""Regenerate the mapped-CSV and JSON Lines fixtures from the first rows of the real nanoGPT log.

Run from the repository root: ``python tests/data/files/make_files.py``. The utilization,
power and timestamps are real (``../nvidia_smi/nanogpt_8xh100_nvidia_smi.csv``); the pod, team
and run columns are invented to exercise ``--map``.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path

HERE = Path(__file__).parent
REAL = HERE.parent / "nvidia_smi" / "nanogpt_8xh100_nvidia_smi.csv"
N_STAMPS = 3


def main() -> None:
    with REAL.open() as f:
        rows = list(csv.DictReader(f))[: 8 * N_STAMPS]
    out = ["ts_ms,gpu_util,pod_name,team,run,watts"]
    for r in rows:
        t = dt.datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00"))
        ms = round(t.timestamp() * 1000)
        util = float(r["utilization_gpu_percent"]) / 100.0
        idx = int(r["gpu_index"])
        out.append(f"{ms},{util + 0.25 * (idx % 2):.2f},trainer-{idx},team-{'ab'[idx % 2]},"
                   f"run-7,{r['power_W'].strip()}")
    (HERE / "mapped_ratio.csv").write_text("\n".join(out) + "\n")
    lines = []
    for r in rows:
        lines.append(json.dumps({
            "ts": r["timestamp"], "gpu_uuid": f"GPU-nanogpt-{r['gpu_index']}",
            "gpu_index": int(r["gpu_index"]), "util_gpu_pct": float(r["utilization_gpu_percent"]),
            "power_w": float(r["power_W"]), "temp_c": float(r["temperature_C"]),
            "labels": {"team": "llm", "job": "nanogpt"},
        }))
    (HERE / "table.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
