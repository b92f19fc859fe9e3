"""Native mode counts GPU events that have no launch event; HTA-compatible mode drops them
(docs/traces.md, table of differences; issue 14, item 9).

The real A100 DDP trace (HTA's tests/data, see README) with the runtime events of its NCCL
launches (``cudaLaunchKernelExC``, 21 of them) removed, as a profile that lost them records
them (HTA #290: cuLaunchKernelEx launches missing). HTA drops the last ProfilerStep by each
event's launch time, and an event without one is dropped whatever its time; gpuaudit's native
mode judges it by its own start, so the all-reduce kernels before the last step still count."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from gpuaudit.traces.analysis import AnalysisOptions, analyze
from gpuaudit.traces.loader import load_traces

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def _without_nccl_launches(tmp: Path) -> tuple[Path, int]:
    doc = json.loads(gzip.decompress((DATA / "a100_1rank_ddp_nccl.json.gz").read_bytes()))
    ev = doc["traceEvents"]
    nccl = {e["args"]["correlation"] for e in ev
            if e.get("cat") == "kernel" and "nccl" in e["name"]}
    doc["traceEvents"] = [e for e in ev if not (
        e.get("cat") == "cuda_runtime" and e.get("args", {}).get("correlation") in nccl)]
    removed = len(ev) - len(doc["traceEvents"])
    out = tmp / "a100_no_nccl_launch.json"
    out.write_text(json.dumps(doc))
    return out, removed


def test_native_counts_launchless_events_hta_compat_drops_them(tmp_path: Path) -> None:
    path, removed = _without_nccl_launches(tmp_path)
    assert removed == 21
    t = load_traces([path])
    g = t.ranks[0].gpu
    assert int((~g.has_launch).sum()) == 21
    native = analyze(t, AnalysisOptions()).ranks[0]
    compat = analyze(t, AnalysisOptions(hta_compat=True)).ranks[0]
    whole = analyze(load_traces([DATA / "a100_1rank_ddp_nccl.json.gz"])).ranks[0]
    # native mode: the same kernels as the intact trace (each judged by its own start)
    assert native.kernel_count == whole.kernel_count
    assert native.comm_ns == whole.comm_ns
    # HTA-compatible mode: every launchless event gone, communication with it
    lost = native.kernel_count - compat.kernel_count
    assert lost > 0 and compat.comm_ns < native.comm_ns / 10
    # and the idle share moves by points, not rounding
    idle_native = native.idle_ns / native.window_ns
    idle_compat = compat.idle_ns / compat.window_ns
    assert idle_compat - idle_native > 0.02
    # with the last step kept, nothing is dropped for want of a launch in either mode
    keep = AnalysisOptions(include_last_step=True)
    keep_c = AnalysisOptions(include_last_step=True, hta_compat=True)
    assert analyze(t, keep).ranks[0].kernel_count == analyze(t, keep_c).ranks[0].kernel_count
