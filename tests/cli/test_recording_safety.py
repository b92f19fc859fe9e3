"""Nothing lost: a killed recording is read by `gpuaudit report` itself, and a recording is
never overwritten or mixed by a second `sample` (issue 22, items 3 and 4).

Real processes, the real pynvml, the fake libnvidia-ml.so.1 (as tests/cli/test_run_cli.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from gpuaudit.errors import InputError
from gpuaudit.measure.live.fake_nvml import SCENARIO_ENV, build_fake_library
from gpuaudit.measure.live.recorder import (
    JOURNAL_SUFFIX,
    LOCK_SUFFIX,
    Extras,
    OutputLock,
    Recorder,
    read_recording,
)
from gpuaudit.schema import build_table

GPUAUDIT = [sys.executable, "-c", "import sys; from gpuaudit.cli import main; sys.exit(main())"]
TWO_GPUS = {"gpus": [{"gpm": True, "pattern": {"kind": "square", "period_s": 0.1}}, {}]}


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_library(tmp_path_factory.mktemp("fakenvml")).parent


def _env(libdir: Path, tmp: Path) -> dict[str, str]:
    path = tmp / "scenario.json"
    path.write_text(json.dumps(TWO_GPUS))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{libdir}:{env.get('LD_LIBRARY_PATH', '')}"
    env[SCENARIO_ENV] = str(path)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _start_sample(libdir: Path, tmp: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*GPUAUDIT, "sample", "--hz", "50", "--flush-s", "0.1",
                             "--no-process", "-o", str(out), *extra],
                            env=_env(libdir, tmp), stderr=subprocess.PIPE, text=True)


def _wait_for_journal(out: Path, size: int = 8000) -> Path:
    journal = Path(str(out) + JOURNAL_SUFFIX)
    end = time.monotonic() + 30
    while time.monotonic() < end and (not journal.exists() or journal.stat().st_size < size):
        time.sleep(0.05)
    assert journal.exists(), "the sampler never journaled"
    return journal


def _killed_recording(libdir: Path, tmp: Path) -> tuple[Path, Path]:
    out = tmp / "killed.parquet"
    p = _start_sample(libdir, tmp, out)
    journal = _wait_for_journal(out)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert not out.exists()
    return out, journal


def _run(libdir: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUAUDIT, *args], env=_env(libdir, tmp), capture_output=True,
                          text=True, timeout=120)


def test_report_reads_a_killed_recording_and_says_what_was_lost(libdir: Path,
                                                                tmp_path: Path) -> None:
    out, journal = _killed_recording(libdir, tmp_path)
    before = journal.read_bytes()
    for target in (out, journal):  # the recording's path, or its journal named directly
        p = _run(libdir, tmp_path, "report", str(target), "--price", "2", "--format", "json")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        notes = json.dumps(doc)
        assert "recovered from the journal" in notes
        assert "were lost (at most one flush interval" in notes
        assert len(doc["gpus"]) == 2  # both GPUs' flushed samples are in the report
    assert journal.read_bytes() == before  # report never rewrites the user's files
    assert not out.exists()


def test_report_of_a_missing_recording_is_a_clear_error(libdir: Path, tmp_path: Path) -> None:
    p = _run(libdir, tmp_path, "report", str(tmp_path / "nothing.parquet"), "--price", "2")
    assert p.returncode == 2
    assert "does not exist" in p.stderr and "partial.arrows" in p.stderr
    assert "Traceback" not in p.stderr


def test_sample_refuses_a_killed_runs_path_and_leaves_its_journal(libdir: Path,
                                                                  tmp_path: Path) -> None:
    out, journal = _killed_recording(libdir, tmp_path)
    before = journal.read_bytes()
    p = _run(libdir, tmp_path, "sample", "--duration", "0.3", "--hz", "50", "--no-process",
             "-o", str(out))
    assert p.returncode == 2, p.stderr
    assert "already exists" in p.stderr and "--append" in p.stderr and "--force" in p.stderr
    assert "Traceback" not in p.stderr
    assert journal.read_bytes() == before


def test_sample_append_continues_a_killed_recording(libdir: Path, tmp_path: Path) -> None:
    out, journal = _killed_recording(libdir, tmp_path)
    with pa.ipc.open_stream(pa.OSFile(str(journal), "rb")) as r:
        killed_rows = sum(b.num_rows for b in _complete(r))
    p = _run(libdir, tmp_path, "sample", "--duration", "0.4", "--hz", "50", "--no-process",
             "--append", "-o", str(out))
    assert p.returncode == 0, p.stderr
    rec = read_recording(out)
    assert rec.table.num_rows > killed_rows
    ts = rec.table.column("ts").cast(pa.int64()).to_pylist()
    assert ts[:killed_rows] == sorted(ts[:killed_rows])
    assert not journal.exists()
    # a finished recording continues too
    p = _run(libdir, tmp_path, "sample", "--duration", "0.3", "--hz", "50", "--no-process",
             "--append", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert read_recording(out).table.num_rows > rec.table.num_rows


def _complete(reader: pa.ipc.RecordBatchStreamReader) -> list[pa.RecordBatch]:
    got = []
    while True:
        try:
            got.append(reader.read_next_batch())
        except (StopIteration, pa.ArrowInvalid, OSError):
            return got


def test_sample_force_replaces(libdir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"
    assert _run(libdir, tmp_path, "sample", "--duration", "0.3", "--hz", "50", "-o",
                str(out)).returncode == 0
    p = _run(libdir, tmp_path, "sample", "--duration", "0.3", "--hz", "50", "-o", str(out))
    assert p.returncode == 2 and "already exists" in p.stderr
    p = _run(libdir, tmp_path, "sample", "--duration", "0.3", "--hz", "50", "--force",
             "-o", str(out))
    assert p.returncode == 0, p.stderr
    p = _run(libdir, tmp_path, "sample", "--duration", "0.3", "--force", "--append",
             "-o", str(out))
    assert p.returncode == 2 and "contradict" in p.stderr


def test_two_samplers_on_one_output_the_second_is_refused(libdir: Path,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "shared.parquet"
    first = _start_sample(libdir, tmp_path, out, "--label", "who=A")
    _wait_for_journal(out, size=2000)
    second = _run(libdir, tmp_path, "sample", "--duration", "0.3", "--hz", "50",
                  "--no-process", "--label", "who=B", "-o", str(out))
    assert second.returncode == 2, second.stderr
    assert f"another process (pid {first.pid}) is recording to" in second.stderr
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    rec = read_recording(out)
    labels = {dict(m).get("who") for m in rec.table.column("labels").to_pylist()}
    assert labels == {"A"}  # nothing of B's run mixed in
    assert not Path(str(out) + LOCK_SUFFIX).exists()


# -- the recorder alone --------------------------------------------------------------------

def _batch(ts_s: list[int]) -> pa.RecordBatch:
    n = len(ts_s)
    table = build_table({"ts": [t * 10**9 for t in ts_s], "host": ["h"] * n,
                         "gpu_uuid": ["GPU-a"] * n, "util_gpu_pct": [50.0] * n}, n)
    return table.to_batches()[0]


def test_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    out = tmp_path / "x.parquet"
    lock = OutputLock(out)
    with pytest.raises(InputError, match=f"pid {os.getpid()}"):
        OutputLock(out)
    lock.release()
    OutputLock(out).release()


def test_append_keeps_marks_and_refuses_another_interval(tmp_path: Path) -> None:
    out = tmp_path / "x.parquet"
    r = Recorder(out, interval_s=1.0, origin="t", start_ns=0)
    r.write(_batch([0, 1]))
    r.close(Extras(marks=[(0, "first run")]))
    with pytest.raises(InputError, match="sampled every 1 s, this run every 2 s"):
        Recorder(out, interval_s=2.0, origin="t", start_ns=0, mode="append")
    r = Recorder(out, interval_s=1.0, origin="t", start_ns=5 * 10**9, mode="append")
    r.write(_batch([5, 6]))
    r.close(Extras(marks=[(5 * 10**9, "second run")]))
    rec = read_recording(out)
    assert rec.table.num_rows == 4
    assert [m[1] for m in json.loads(rec.meta["marks"])] == ["first run", "second run"]
    assert rec.meta["start"].startswith("1970-01-01T00:00:00")
