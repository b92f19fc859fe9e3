"""Rebuild the bundled demo recording from the real nanoGPT 8x H100 nvidia-smi log.

    python scripts/make_demo_recording.py ../shared/data/recordings/nanogpt_8xh100_nvidia_smi.csv

The source is real telemetry (karpathy/nanoGPT pull request #643, gpu_metrics.csv at
f4f827dd0ae5aa920e5e89cc9629a157c48989ce, MIT licence): nanoGPT's baseline training on an
8x H100 host. Nothing is synthesised: the rows are imported as they are; the GPU model (the
log has no name column) and the host are stated, and the origin travels in the Parquet metadata.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from gpuaudit.measure.files import read_samples, write_recording

ORIGIN = (
    "real recording: karpathy/nanoGPT PR #643 gpu_metrics.csv @ f4f827dd (MIT), nanoGPT "
    "baseline training on 8x NVIDIA H100 80GB (Voltage Park host), nvidia-smi --query-gpu "
    "every ~0.33 s; imported unchanged by scripts/make_demo_recording.py"
)
OUT = Path(__file__).resolve().parents[1] / "src/gpuaudit/data/nanogpt_8xh100.parquet"


def main(src: str) -> None:
    rec = read_samples(src, host="nanogpt-8xh100", gpu_model="NVIDIA H100 80GB HBM3")
    rec = dataclasses.replace(rec, origin=ORIGIN, source="nvidia-smi-csv")
    write_recording(rec, OUT)
    print(f"wrote {OUT} ({rec.table.num_rows} rows)")


if __name__ == "__main__":
    main(sys.argv[1])
