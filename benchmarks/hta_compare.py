"""Run HolisticTraceAnalysis 0.5.0 on a trace directory (in its own venv); print timings.

Usage: benchmarks/_work/hta-venv/bin/python benchmarks/hta_compare.py TRACE_DIR
Prints one JSON line: load_s (TraceAnalysis constructor), total_s (load + temporal, idle
and kernel-type breakdowns).
"""

import json
import sys
import time

t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis  # noqa: E402

t1 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
ta.get_temporal_breakdown(visualize=False)
for rank in ta.t.get_ranks():
    ta.get_idle_time_breakdown(ranks=[rank], visualize=False)
ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "total_s": t3 - t1}))
