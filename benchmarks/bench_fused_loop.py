"""classify's compiled loop alone (``classify.fused.stream_batch``) on real batches: CPU time a
row, and the state it leaves, to compare two trees of the source bit for bit.

    # 40 batches (4.6M rows) of the report's first range, captured once:
    PYTHONPATH=src python benchmarks/bench_fused_loop.py capture \\
        benchmarks/_work/fleet_1000gpu_28h_1hz.parquet benchmarks/_work/loop40.pkl
    # each tree replays them (CPU time of this thread, best and median of --repeat):
    PYTHONPATH=OLD/src python benchmarks/bench_fused_loop.py replay benchmarks/_work/loop40.pkl \\
        --state benchmarks/_work/state_old.pkl
    PYTHONPATH=src python benchmarks/bench_fused_loop.py replay benchmarks/_work/loop40.pkl \\
        --state benchmarks/_work/state_new.pkl --same-as benchmarks/_work/state_old.pkl

The capture runs ``gpuaudit report FILE`` in this process and keeps the batches this process
feeds the loop from its 6th on (with the engine's state before them); the replay feeds them to
a copy of that state, batch after batch, as the engine does.
"""

from __future__ import annotations

import argparse
import copy
import os
import pickle
import runpy
import sys
import time
from typing import Any

import numpy as np


def capture(parquet: str, out: str, batches: int) -> None:
    from gpuaudit.classify import fused

    real = fused.stream_batch
    calls = [0]
    kept: dict[str, Any] = {"init": None, "batches": []}
    me = os.getpid()

    def keeping(rows: Any, pending: Any, n_series: int, cap_s: float, *state: Any) -> Any:
        calls[0] += 1
        if os.getpid() == me and calls[0] >= 6 and len(kept["batches"]) < batches:
            if kept["init"] is None:
                kept["init"] = copy.deepcopy((pending, *state))
            kept["batches"].append((copy.deepcopy(rows), n_series, cap_s))
            if len(kept["batches"]) == batches:
                with open(out, "wb") as f:
                    pickle.dump(kept, f)
        return real(rows, pending, n_series, cap_s, *state)

    fused.stream_batch = keeping
    sys.argv = ["gpuaudit", "report", parquet, "--format", "json", "-o", os.devnull]
    try:
        runpy.run_module("gpuaudit", run_name="__main__")
    except SystemExit:
        pass
    if len(kept["batches"]) < batches:
        raise SystemExit(f"only {len(kept['batches'])} large batches reached the loop")


def _arrays(o: Any, name: str = "") -> dict[str, np.ndarray]:
    """Every array reachable from ``o`` (dicts, sequences, objects' attributes) by path."""
    if isinstance(o, np.ndarray):
        return {name: o}
    items: Any = ()
    if isinstance(o, dict):
        items = o.items()
    elif isinstance(o, (list, tuple)):
        items = enumerate(o)
    elif hasattr(o, "__dict__"):
        items = vars(o).items()
    out: dict[str, np.ndarray] = {}
    for k, v in items:
        out.update(_arrays(v, f"{name}.{k}"))
    return out


def replay(path: str, repeat: int, state_out: str | None, same_as: str | None) -> None:
    from gpuaudit.classify import fused

    assert fused.available(), "numba must import"
    with open(path, "rb") as f:
        kept = pickle.load(f)
    rows_total = sum(b[0]["code"].shape[0] for b in kept["batches"])

    def run() -> tuple[float, Any]:
        pending, *state = copy.deepcopy(kept["init"])
        spent = 0.0
        for rows, n_series, cap_s in kept["batches"]:
            t0 = time.thread_time()
            out = fused.stream_batch(rows, pending, n_series, cap_s, *state)
            spent += time.thread_time() - t0
            assert out is not None
            pending = out[0]
        return spent, (pending, *state)

    run()  # loads (or compiles) the machine code
    times = []
    for _ in range(repeat):
        spent, final = run()
        times.append(spent)
    times.sort()
    print(f"{rows_total} rows: {times[0] / rows_total * 1e9:.1f} ns a row best, "
          f"{times[len(times) // 2] / rows_total * 1e9:.1f} median of {repeat}")
    arrays = _arrays(final)
    if state_out:
        with open(state_out, "wb") as f:
            pickle.dump(arrays, f)
    if same_as:
        with open(same_as, "rb") as f:
            other = pickle.load(f)
        differ = sorted(k for k in set(arrays) | set(other)
                        if k not in arrays or k not in other
                        or not np.array_equal(arrays[k], other[k], equal_nan=True))
        print("state bit-identical" if not differ else f"state DIFFERS: {differ[:10]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("parquet")
    c.add_argument("out")
    c.add_argument("--batches", type=int, default=40)
    r = sub.add_parser("replay")
    r.add_argument("captured")
    r.add_argument("--repeat", type=int, default=5)
    r.add_argument("--state", help="write the final state's arrays here")
    r.add_argument("--same-as", help="compare the final state with one written before")
    args = ap.parse_args()
    if args.cmd == "capture":
        capture(args.parquet, args.out, args.batches)
    else:
        replay(args.captured, args.repeat, args.state, args.same_as)


if __name__ == "__main__":
    main()
