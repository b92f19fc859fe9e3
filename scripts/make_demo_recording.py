"""Rebuild the bundled demo recording from the real nanoGPT 8x H100 nvidia-smi log.

    python scripts/make_demo_recording.py ../shared/data/recordings/nanogpt_8xh100_nvidia_smi.csv

The source is real telemetry (karpathy/nanoGPT pull request #643, gpu_metrics.csv at
f4f827dd0ae5aa920e5e89cc9629a157c48989ce, MIT licence): nanoGPT's baseline training on an
8x H100 host. Nothing is synthesised: the rows are imported as they are; the GPU model (the
log has no name column) and the host are stated, and the origin travels in the Parquet metadata.

The recording's data notes are what a user of the bundled file can check: they point at the
public file (``gpu_metrics.csv:<line>``), never at the path this script was run on, and say
that the builder (not the user's ``--host``) named the host and the model. Its source kind is
``parquet``: the user holds a Parquet recording, imported from an nvidia-smi log as the origin
says. :func:`build` is what a test runs on the same log copied under tests/data/core.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from gpuaudit.measure.files import read_samples, write_recording
from gpuaudit.schema import ImportNote, Recording

PUBLIC_FILE = "gpu_metrics.csv"
HOST = "nanogpt-8xh100"
GPU_MODEL = "NVIDIA H100 80GB HBM3"
ORIGIN = (
    "real recording: karpathy/nanoGPT PR #643 gpu_metrics.csv @ f4f827dd (MIT), nanoGPT "
    "baseline training on 8x NVIDIA H100 80GB (Voltage Park host), nvidia-smi --query-gpu "
    "every ~0.33 s; imported unchanged by scripts/make_demo_recording.py"
)
OUT = Path(__file__).resolve().parents[1] / "src/gpuaudit/data/nanogpt_8xh100.parquet"


def _public(note: ImportNote, src: str) -> ImportNote:
    """The note as the bundled file's user sees it: the public file name in ``where``, the
    builder (not a ``--host`` the user never passed) as the one who named the host."""
    where = note.where
    if where is not None and where.startswith(src):
        where = PUBLIC_FILE + where[len(src):]
    reason = note.reason.replace(
        f"host '{HOST}' taken from --host",
        f"host named '{HOST}' by scripts/make_demo_recording.py")
    return dataclasses.replace(note, reason=reason, where=where)


def build(src: str | Path) -> Recording:
    """The demo recording from the nvidia-smi log at ``src``."""
    src = str(src)
    rec = read_samples(src, host=HOST, gpu_model=GPU_MODEL)
    stated = ImportNote(
        f"no GPU name column: gpu_model '{GPU_MODEL}' stated by scripts/make_demo_recording.py "
        "(the pull request describes an 8x H100 80GB host)", rec.table.num_rows,
        f"{PUBLIC_FILE}:1", "gpu_model")
    notes = (*(_public(n, src) for n in rec.notes), stated)
    return dataclasses.replace(rec, origin=ORIGIN, source="parquet", notes=notes)


def main(src: str) -> None:
    rec = build(src)
    write_recording(rec, OUT)
    print(f"wrote {OUT} ({rec.table.num_rows} rows)")


if __name__ == "__main__":
    main(sys.argv[1])
