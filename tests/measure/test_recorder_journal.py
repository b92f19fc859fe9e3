"""Recorder: journal -> zstd Parquet with metadata; recovery after a kill at any byte."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.errors import InputError
from gpuaudit.measure.live.recorder import (
    JOURNAL_SUFFIX,
    Extras,
    Recorder,
    read_recording,
    recover_recording,
)
from gpuaudit.schema import META_HOST, META_INTERVAL_S, META_SOURCE, META_START, build_table


def _batch(k: int, n: int, util: float = 50.0):
    """Batch number k of n rows, 100 ms apart; batches never overlap (k * 1000 offset)."""
    ts = (np.arange(n, dtype=np.int64) + k * 1000) * 100_000_000 + 1_700_000_000 * 10**9
    t = build_table({"ts": ts, "host": ["h"] * n, "gpu_uuid": ["GPU-1"] * n,
                     "util_gpu_pct": np.full(n, util, np.float32)})
    return t.to_batches()[0]


def _recorder(path: Path) -> Recorder:
    return Recorder(path, interval_s=0.1, origin="test", host="h", start_ns=1_700_000_000 * 10**9)


def test_finalised_file_is_zstd_parquet_with_metadata(tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"
    rec = _recorder(out)
    extras = Extras(labels={"team": "vision"}, counters={"steps": 3, "samples": 96, "tokens": None})
    for k in range(3):
        rec.write(_batch(k, 10), extras)
    extras.marks.append((1, "epoch 1"))
    rec.close(extras)
    assert out.exists() and not Path(str(out) + JOURNAL_SUFFIX).exists()
    pf = pq.ParquetFile(out)
    assert pf.metadata.row_group(0).column(0).compression == "ZSTD"
    meta = pf.schema_arrow.metadata
    assert meta[META_SOURCE] == b"nvml" and meta[META_HOST] == b"h"
    assert float(meta[META_INTERVAL_S]) == 0.1 and meta[META_START].endswith(b"Z")
    r = read_recording(out)
    assert r.table.num_rows == 30 and r.interval_s == 0.1
    assert json.loads(r.meta["labels"]) == {"team": "vision"}
    assert json.loads(r.meta["counters"])["samples"] == 96
    assert json.loads(r.meta["marks"]) == [[1, "epoch 1"]]


def test_journal_alone_is_recovered_with_a_note(tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"
    rec = _recorder(out)
    extras = Extras(counters={"steps": 0, "samples": None, "tokens": None})
    rec.write(_batch(0, 10), extras)
    extras.events.append("something happened")
    rec.write(_batch(1, 10), extras)
    rec.abandon()  # as if SIGKILLed
    r = recover_recording(out)
    assert r.table.num_rows == 20
    assert r.notes and "recovered" in r.notes[0].reason
    assert r.events == ("something happened",)
    r2 = recover_recording(str(out) + JOURNAL_SUFFIX, finalize=True)
    assert r2.table.num_rows == 20 and out.exists()
    assert read_recording(out).table.num_rows == 20


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.0, 1.0))
def test_kill_at_any_byte_loses_at_most_the_last_batch(tmp_path: Path, cut: float) -> None:
    out = tmp_path / f"r{os.getpid()}-{cut}.parquet"
    rec = _recorder(out)
    sizes = [7, 11, 13]
    offsets = []
    for k, n in enumerate(sizes):
        rec.write(_batch(k, n), None)
        offsets.append(Path(str(out) + JOURNAL_SUFFIX).stat().st_size)
    rec.abandon()
    journal = Path(str(out) + JOURNAL_SUFFIX)
    data = journal.read_bytes()
    keep = int(len(data) * cut)
    journal.write_bytes(data[:keep])
    try:
        r = recover_recording(out)
    except InputError:
        assert keep < offsets[0]  # only before the first complete batch
        return
    complete = sum(n for n, off in zip(sizes, offsets) if off <= keep)
    assert r.table.num_rows == complete


def test_missing_recording_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no recording"):
        recover_recording(tmp_path / "nope.parquet")
