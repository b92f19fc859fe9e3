"""Write tests/data/traces/cpu_linear_flops.json.gz: a REAL torch.profiler trace with FLOP
counts, CPU only (no GPU kernels), for the loader's ``args.flops`` path.

    python -m venv /tmp/t && /tmp/t/bin/pip install torch==2.13.0
    /tmp/t/bin/python tests/data/traces/make_cpu_flops_trace.py

A tiny two-layer MLP (linear -> relu -> linear, batch 64, 256 -> 512 -> 128) run 20 times
under ``torch.profiler.profile(activities=[CPU], with_flops=True)`` in 4 ProfilerSteps, exported
with ``export_chrome_trace`` and gzipped. Timings differ run to run; FLOP counts do not.

torch 2.13's ``export_chrome_trace`` does not write the FLOP counts it computes into the
JSON (checked: no ``args.flops`` on any event, with or without ``record_shapes``), although
the profiler holds them per operator (``KinetoEvent.flops()``, what ``key_averages()`` sums).
This script copies each operator's own count into its event as ``args.flops`` (matched by
``args["External id"]`` == the event's correlation id), the form older PyTorch exports carry
and the loader reads. The counts are the profiler's, not computed here.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

OUT = Path(__file__).with_name("cpu_linear_flops.json.gz")


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 128))
    x = torch.randn(64, 256)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for _step in range(4):
            for _ in range(5):
                y = model(x)
                y = y * 2.0 + 1.0
            prof.step()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        doc = json.loads(raw.read_text())
    assert prof.profiler is not None and prof.profiler.kineto_results is not None
    flops = {e.correlation_id(): e.flops() for e in prof.profiler.kineto_results.events()
             if e.flops() > 0}
    n = 0
    for ev in doc["traceEvents"]:
        args = ev.get("args") or {}
        if ev.get("cat") == "cpu_op" and args.get("External id") in flops:
            assert "flops" not in args
            args["flops"] = flops[args["External id"]]
            n += 1
    with gzip.open(OUT, "wt", compresslevel=9) as dst:
        json.dump(doc, dst)
    total = sum(e.flops for e in prof.key_averages() if e.flops)
    assert sum(flops.values()) == total, (sum(flops.values()), total)
    print(f"{n} operator events got args.flops")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes); torch {torch.__version__}; "
          f"profiler total flops {total}")


if __name__ == "__main__":
    main()
