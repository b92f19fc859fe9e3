"""A worker started ahead of its task (gpuaudit._workers): only for a large Parquet file,
taken by the first range that needs a worker, giving the same result; one never taken ends
with the command, silently."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from coretables import recording, series_table
from test_classify_parallel import _ramp_table, assert_same_usage

from gpuaudit import _workers
from gpuaudit.classify import classify
from gpuaudit.measure.files import open_samples
from gpuaudit.measure.parquet_io import write_recording


def _file(tmp_path):
    path = tmp_path / "r.parquet"
    write_recording(recording(_ramp_table()), path, row_group_rows=100)
    return path


def test_a_worker_is_started_ahead_only_for_a_large_parquet_file(tmp_path, monkeypatch):
    path = _file(tmp_path)
    csv = tmp_path / "r.csv"
    csv.write_bytes(b"x" * (path.stat().st_size + 10))
    monkeypatch.setattr(_workers, "PRESTART_BYTES", path.stat().st_size + 1)
    _workers.prestart(path)  # too small
    assert _workers.take() is None
    monkeypatch.setattr(_workers, "PRESTART_BYTES", 1)
    _workers.prestart(csv)  # large, but not Parquet
    assert _workers.take() is None
    _workers.prestart(path)
    proc = _workers.take()
    assert proc is not None and proc.poll() is None
    assert _workers.take() is None  # handed out once
    proc.stdin.close()  # a task that never comes: it stops, answering nothing
    assert proc.stdout.read() == b"" and proc.wait() == 0
    proc.stdout.close()


def test_the_worker_started_ahead_takes_a_range_and_gives_the_same_usage(tmp_path,
                                                                         monkeypatch):
    path = _file(tmp_path)
    whole = classify(open_samples(path), workers=1)
    monkeypatch.setattr(_workers, "PRESTART_BYTES", 1)
    _workers.prestart(path)
    assert "classify" in _workers._ready
    assert_same_usage(whole, classify(open_samples(path), workers=2))
    assert "classify" not in _workers._ready  # taken


def test_a_worker_never_taken_ends_with_the_command_silently(tmp_path):
    """The CLI starts one for a large file; a run that never needs it (one process asked
    for) leaves no process behind and nothing on stderr."""
    path = tmp_path / "r.parquet"
    write_recording(recording(series_table({"GPU-a": [1.0, 50.0, 0.0] * 20})), path)
    code = textwrap.dedent(f"""
        import sys
        from gpuaudit import _workers
        _workers.PRESTART_BYTES = 1
        _workers.prestart({str(path)!r})
        print(_workers._ready["classify"].pid)
        from gpuaudit.classify import classify
        from gpuaudit.measure.files import open_samples
        classify(open_samples({str(path)!r}), workers=1)
        """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_workers.spawn.__code__.co_filename).rsplit("/gpuaudit/", 1)[0],
                    env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    pid = int(res.stdout.split()[0])
    try:  # gone (or its number taken by some other program since)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"classify.parallel" not in f.read()
    except FileNotFoundError:
        pass


def test_the_worker_started_ahead_imports_the_file_reader_before_its_task():
    """Its task is a Parquet file's range: the reader (PyArrow, Parquet) is imported while
    it waits, not when the task comes."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", _workers._WARM_WORKER],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()}
    assert {"gpuaudit.measure.files.reader", "pyarrow.parquet", "numba"} <= imported
