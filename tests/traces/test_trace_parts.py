"""A large trace's events decoded in parts by helper processes (gpuaudit.traces._kineto_parts):
the columns one pass gives, whatever the cuts, the shapes decision or the helpers' fate.

The helpers are real processes (fresh interpreters running the module's program); only the
sizes that decide when parts pay are made small here, so small documents are cut."""

from __future__ import annotations

import gzip
import json
import mmap
import os
import signal
import subprocess
import sys
import time
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_trace_kineto_json import _same, events
from trace_synth import kernel, launch, span, write

from gpuaudit import _workers
from gpuaudit.errors import InputError
from gpuaudit.traces import _kineto_json as kj
from gpuaudit.traces import _kineto_parts as kp
from gpuaudit.traces import loader

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
REAL = ["a100_1rank_ddp_nccl.json.gz", "v100_1rank_ns_resolution.json.gz",
        "mi250_rocm_minitoy.json.gz", "cpu_linear_flops.json.gz",
        "two_ranks/sampled_rank-0.json.gz", "two_ranks/sampled_rank-1.json.gz"]


class _Spy:
    """How many helper parts were taken into the columns (not decoded again here)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.absorbed = 0
        real = kj._Accumulator.absorb

        def absorb(acc: kj._Accumulator, part: kj._PartState) -> None:
            self.absorbed += 1
            real(acc, part)

        monkeypatch.setattr(kj._Accumulator, "absorb", absorb)


def _parts(monkeypatch: pytest.MonkeyPatch, cpus: int, part_bytes: int = 64) -> _Spy:
    """Cut any document into up to ``cpus`` parts, each helper started when reached."""
    monkeypatch.setattr(_workers, "available_cpus", lambda: cpus)
    monkeypatch.setattr(kp, "PART_BYTES", part_bytes)
    monkeypatch.setattr(kp, "HELPER_PART_BYTES", part_bytes)
    return _Spy(monkeypatch)


def _one_pass(data: bytes | bytearray, slice_bytes: int) -> tuple[dict[str, object],
                                                                   kj.Columns]:
    return kj.decode(bytearray(data), Path("t.json"), loader._ALL_CATS, loader._select,
                     slice_bytes=slice_bytes)


def _in_parts(data: bytes | bytearray, slice_bytes: int) -> tuple[dict[str, object],
                                                                  kj.Columns]:
    return kj.decode(bytearray(data), Path("t.json"), loader._ALL_CATS, loader._select,
                     slice_bytes=slice_bytes, events=kp.decode_events)


def _same_all(a: kj.Columns, b: kj.Columns) -> None:
    _same(a, b)
    assert a.names == b.names  # the same table, in the same first-seen order
    for f in ("name_idx", "flops", "flops_ok", "flops_derived"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert list(a.unknown_cats.items()) == list(b.unknown_cats.items())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(events(), st.integers(2, 4), st.integers(40, 400), st.integers(1, 300))
def test_parts_read_what_one_pass_reads(monkeypatch: pytest.MonkeyPatch,
                                        evs: list[dict[str, object]], cpus: int,
                                        part_bytes: int, slice_bytes: int) -> None:
    """Random events, names full of false cuts (``}, {`` inside strings), 2-4 parts of any
    size, slices of any size: the columns, the names' order and the unknown categories of one
    pass."""
    data = json.dumps({"a": 1, "traceEvents": evs, "z": [2]}, indent=1).encode()
    meta, whole = _one_pass(data, slice_bytes)
    _parts(monkeypatch, cpus, part_bytes)
    meta2, parts = _in_parts(data, slice_bytes)
    assert meta == meta2
    _same_all(whole, parts)


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("cpus", [2, 3])
def test_real_traces_in_parts_equal_one_pass(monkeypatch: pytest.MonkeyPatch, name: str,
                                             cpus: int) -> None:
    data = gzip.decompress((DATA / name).read_bytes())
    _, whole = _one_pass(data, 1 << 16)
    spy = _parts(monkeypatch, cpus, part_bytes=len(data) // (cpus + 1))
    _, parts = _in_parts(data, 1 << 16)
    _same_all(whole, parts)
    assert spy.absorbed == cpus - 1  # every helper's part was taken, none decoded again


def test_the_loader_and_the_report_in_parts_equal_one_pass(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """Through load_trace: the kernel table, the spans and the notes of the real A100 trace."""
    path = DATA / "a100_1rank_ddp_nccl.json.gz"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_workers, "available_cpus", lambda: 1)
        ref = loader.load_trace(path)
    spy = _parts(monkeypatch, 2, part_bytes=1 << 20)
    got = loader.load_trace(path)
    assert spy.absorbed == 1
    assert got.kernels.equals(ref.kernels)
    assert got.spans.names == ref.spans.names and got.notes == ref.notes
    for a, b in ((got.spans.ts_ns, ref.spans.ts_ns), (got.spans.dur_ns, ref.spans.dur_ns),
                 (got.runtime_ts_ns, ref.runtime_ts_ns)):
        np.testing.assert_array_equal(a, b)


def test_a_part_boundary_inside_a_string_is_decoded_here(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Every candidate cut lies inside a name: the first part does not decode to its end,
    so this process reads on in one pass, and no helper's part is used."""
    name = 'x"}, {"y' * 40
    evs = [kernel(name, 10 + i, 1, i) for i in range(40)]
    data = json.dumps({"traceEvents": evs}, indent=1).encode()
    first_cut = kj._CUT.search(data)
    assert first_cut is not None
    # the cut inside the first event's name
    assert data.index(b'"name"') < first_cut.start() < data.index(b'"pid"')
    _, whole = _one_pass(data, 1 << 20)
    spy = _parts(monkeypatch, 2, part_bytes=64)
    monkeypatch.setattr(kp, "plan", lambda arr, lo, end, parts: [
        (lo, first_cut.start() + 1 - data.index(b"[")),
        (first_cut.end() - 1 - data.index(b"["), end)])
    _, got = _in_parts(data, 1 << 20)
    _same_all(whole, got)
    assert spy.absorbed == 0
    assert [got.names[i] for i in got.name_idx.tolist()] == [name] * 40


def test_a_helper_that_dies_leaves_its_part_to_this_process(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    data = gzip.decompress((DATA / "v100_1rank_ns_resolution.json.gz").read_bytes())
    _, whole = _one_pass(data, 1 << 18)
    spy = _parts(monkeypatch, 3, part_bytes=1 << 20)
    monkeypatch.setattr(_workers, "TRACE_WORKER", "import os; os._exit(3)")
    _, got = _in_parts(data, 1 << 18)
    _same_all(whole, got)
    assert spy.absorbed == 0


def test_a_helper_that_cannot_start_leaves_its_part_to_this_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = gzip.decompress((DATA / "mi250_rocm_minitoy.json.gz").read_bytes())
    _, whole = _one_pass(data, 1 << 18)
    spy = _parts(monkeypatch, 2, part_bytes=64)
    monkeypatch.setattr(_workers, "spawn", lambda program=None: None)
    _, got = _in_parts(data, 1 << 18)
    _same_all(whole, got)
    assert spy.absorbed == 0


def test_a_wrong_event_in_a_helpers_part_is_named_by_its_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper fails on it; this process decodes that part again and names the event as
    one pass does (its index in the whole array, not in the part)."""
    evs = [kernel(f"k{i}", 10 * i, 1, i) for i in range(100)]
    evs[77]["name"] = 5
    p = write(tmp_path / "t.json", evs)
    _parts(monkeypatch, 2, part_bytes=p.stat().st_size // 3)
    monkeypatch.setattr(kj, "SLICE_BYTES", 300)
    with pytest.raises(InputError, match="got `int`") as exc:
        loader.load_trace(p)
    assert exc.value.where == f"{p}: traceEvents[77]"


def _ops(n: int, shapes: bool, ts0: int = 0) -> list[dict[str, object]]:
    """CPU operators without ``args.flops``: with input shapes (``shapes``: FLOPs counted
    from them) or with none (as autograd's wrappers are, even under record_shapes)."""
    out: list[dict[str, object]] = []
    for i in range(n):
        args: dict[str, object] = {"External id": i}
        if shapes:
            args["Input Dims"] = [[64, 256], [256, 512]]
            args["Concrete Inputs"] = ["", ""]
        out.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": ts0 + 10 * i,
                    "dur": 5, "args": args})
    return out


def test_flops_from_shapes_in_a_helpers_part_are_counted(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Operators with args.flops, then ones without shapes, then ones with shapes and no
    args.flops, the last in the helper's part: their FLOPs are counted from the shapes, as
    one pass counts them."""
    with_flops = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": i, "dur": 1,
                   "args": {"flops": 10}} for i in range(30)]
    evs = with_flops + _ops(30, shapes=False, ts0=400) + _ops(60, shapes=True, ts0=2000)
    data = json.dumps({"traceEvents": evs}).encode()
    _, whole = _one_pass(data, 1 << 10)
    assert whole.flops_derived.sum() == 60 and (whole.kind == 5).sum() == 90
    cut = data.index(b'"Input Dims"') - data.index(b"[")  # in the events array
    spy = _parts(monkeypatch, 2, part_bytes=64)
    monkeypatch.setattr(kp, "plan", lambda arr, lo, end, parts: _cut_before(arr, lo, end, cut))
    _, got = _in_parts(data, 1 << 10)
    _same_all(whole, got)
    assert spy.absorbed == 1


def test_flops_from_shapes_do_not_depend_on_where_slices_end() -> None:
    """What is counted from shapes depends on each operator alone: the same for any slice
    size, whichever operators the first slice holds."""
    with_flops = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": i, "dur": 1,
                   "args": {"flops": 10}} for i in range(20)]
    data = json.dumps({"traceEvents": with_flops + _ops(10, shapes=False, ts0=50)
                       + _ops(40, shapes=True, ts0=100)}).encode()
    ref = _one_pass(data, 1 << 20)[1]
    assert ref.flops_derived.sum() == 40
    for size in (50, 200, 700, 3000):
        _same_all(ref, _one_pass(data, size)[1])


def _cut_before(arr: memoryview, lo: int, end: int, at: int) -> list[tuple[int, int]]:
    """Two parts, the second starting at the element before array byte ``at``."""
    *_, m = kj._CUT.finditer(bytes(arr), lo, at)
    return [(lo, m.start() + 1), (m.end() - 1, end)]


def test_no_part_file_is_left_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    shm = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    before = set(shm.glob("gpuaudit-trace-part-*")) if shm else set()
    data = gzip.decompress((DATA / "a100_1rank_ddp_nccl.json.gz").read_bytes())
    _parts(monkeypatch, 3, part_bytes=1 << 20)
    _in_parts(data, 1 << 18)
    if shm:
        assert set(shm.glob("gpuaudit-trace-part-*")) == before


def test_a_helper_started_ahead_only_for_large_traces(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_workers, "available_cpus", lambda: 2)
    plain = write(tmp_path / "t.json", [kernel(f"k{i}", i, 1, i) for i in range(200)])
    gz = write(tmp_path / "t.json.gz", [kernel(f"k{i}", i, 1, i) for i in range(200)],
               gz=True)
    inflated = len(gzip.decompress(gz.read_bytes()))
    assert _workers.json_size(gz) == inflated > gz.stat().st_size
    monkeypatch.setattr(_workers, "TRACE_PRESTART_BYTES", inflated + 1)
    _workers.prestart_trace([gz])  # one file, too small
    assert _workers.take("trace") is None
    _workers.prestart_trace([tmp_path / "nowhere.json"])  # no such file: nothing, no error
    assert _workers.take("trace") is None
    _workers.prestart_trace([plain, gz])  # two files, large together
    proc = _workers.take("trace")
    assert proc is not None
    _stop_unused(proc)
    monkeypatch.setattr(_workers, "TRACE_PRESTART_BYTES", inflated)
    _workers.prestart_trace([gz])  # small on disk, large inflated (its gzip trailer)
    proc = _workers.take("trace")
    assert proc is not None and proc.poll() is None
    assert _workers.take("trace") is None and _workers.take() is None  # once; not classify's
    _stop_unused(proc)
    monkeypatch.setattr(_workers, "TRACE_PRESTART_BYTES", plain.stat().st_size + 1)
    _workers.prestart_trace([plain])  # too small
    assert _workers.take("trace") is None


def test_the_command_on_a_large_trace_uses_the_helper_and_leaves_nothing(tmp_path: Path
                                                                         ) -> None:
    """``gpuaudit trace`` starts the helper ahead, its part is used, and the command ends
    with no helper left and nothing on stderr; the report equals the one-process report."""
    evs: list[dict[str, object]] = []
    for i in range(3000):
        evs += [launch(10 * i, i), kernel(f"void k{i % 7}<float>(int)", 10 * i + 2, 5, i)]
    evs.append(span("ProfilerStep#1", 0, 30_000))
    path = write(tmp_path / "big.json", evs)
    code = f"""
import sys
from gpuaudit import _workers
from gpuaudit.traces import _kineto_parts as kp, _kineto_json as kj
_workers.TRACE_PRESTART_BYTES = 1
kp.PART_BYTES = 1 << 10
n = [0]
real = kj._Accumulator.absorb
def absorb(acc, part):
    n[0] += 1
    real(acc, part)
kj._Accumulator.absorb = absorb
_workers.available_cpus = lambda: 1 if sys.argv[1] == "one" else 2
from gpuaudit.cli import main
try:
    main(["trace", {str(path)!r}, "--price", "2.5", "--format", "json", "-o", sys.argv[2]])
except SystemExit as exc:
    assert not exc.code, exc.code
print(n[0], [p.pid for p in _workers._ready.values()])
"""
    env = dict(os.environ)
    src = str(Path(kp.__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    outs = {}
    for mode in ("parts", "one"):
        out = tmp_path / f"{mode}.json"
        res = subprocess.run([sys.executable, "-c", code, mode, str(out)], capture_output=True,
                             text=True, env=env, timeout=120)
        assert res.returncode == 0, res.stderr
        assert "Traceback" not in res.stderr and "Warning" not in res.stderr, res.stderr
        absorbed = int(res.stdout.split()[0])
        assert absorbed == (1 if mode == "parts" else 0)
        report = json.loads(out.read_text())
        report.pop("generated_at", None)
        outs[mode] = report
    assert outs["parts"] == outs["one"]


_DEC = st.builds(lambda i, f, d: f"{i}.{f:0{d}d}" if d else str(i),
                 st.integers(0, 10**16 - 1), st.integers(0, 999_999), st.integers(0, 6)
                 ).map(lambda t: t if "." not in t else t[:t.index(".") + 1 + min(
                     len(t) - t.index(".") - 1, 6)])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_DEC, st.sampled_from(["0", "1.", ".5", "00012.500", "9" * 16 + ".999",
                                                  "9223372036854775.807", "9223372036854775.808"])),
                min_size=1, max_size=30))
def test_plain_decimals_in_one_parse_are_exact(texts: list[str]) -> None:
    """The one-parse path (:func:`_milli`) gives Decimal's value x 1000 exactly, or declines
    (more than three decimals, past int64) and the exact path gives it."""
    raws = [msgspec.Raw(t.encode()) for t in texts]
    ns, ok, frac = kj.parse_raw(raws)
    for t, v, good, f in zip(texts, ns.tolist(), ok.tolist(), frac.tolist()):
        want = int((Decimal(t) * 1000).to_integral_value(ROUND_HALF_UP))
        assert f == ("." in t)
        if want < 2**63:
            assert good and v == want, (t, v, want)
        else:
            assert not good and v == 0
    short = all(len(t.partition(".")[2]) <= 3 and len(t.partition(".")[0]) <= 16
                for t in texts) and all(ns.tolist())
    if short and max(int(Decimal(t) * 1000) for t in texts) < 2**63:
        length = np.fromiter(map(len, raws), np.int64, len(raws))
        assert kj._milli(raws, length) is not None  # the common case takes the one parse


def test_a_part_that_cannot_be_handed_over_is_decoded_here(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """No room for the part's file (a container's small /dev/shm, a full disk): this process
    decodes it, and the answer is one pass's."""
    data = gzip.decompress((DATA / "v100_1rank_ns_resolution.json.gz").read_bytes())
    _, whole = _one_pass(data, 1 << 18)
    spy = _parts(monkeypatch, 2, part_bytes=1 << 20)

    def full(*args: object, **kw: object) -> tuple[int, str]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kp.tempfile, "mkstemp", full)
    _, got = _in_parts(data, 1 << 18)
    _same_all(whole, got)
    assert spy.absorbed == 0


def test_a_part_goes_to_the_temporary_folder_where_dev_shm_has_no_room(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Small:
        f_bavail, f_frsize = 10, 4096

    monkeypatch.setattr(kp.os, "statvfs", lambda path: Small())
    assert kp._part_dir(1 << 20) is None
    monkeypatch.undo()
    if os.access("/dev/shm", os.W_OK):
        assert kp._part_dir(1) == "/dev/shm"


@pytest.mark.parametrize("gz", [True, False])
def test_ctrl_c_while_a_helper_decodes_stops_both_quietly(tmp_path: Path, gz: bool) -> None:
    """A Ctrl-C at the terminal (SIGINT to the foreground process group) while the helper
    decodes its part (handed over in a file for a gzip trace, mapped from the trace itself
    for a plain one): the command says it was aborted (exit 130), the helper prints nothing
    (it runs in a session of its own and is stopped by the command), and neither a helper nor
    a part's file is left behind."""
    evs: list[dict[str, object]] = []
    for i in range(60_000):
        evs += [launch(10 * i, i), kernel(f"void k{i % 7}<float>(int)", 10 * i + 2, 5, i)]
    path = write(tmp_path / ("big.json.gz" if gz else "big.json"), evs, gz=gz)
    parts_dir = tmp_path / "parts"
    parts_dir.mkdir()
    code = f"""
import sys
from gpuaudit import _workers
from gpuaudit.traces import _kineto_parts as kp
_workers.TRACE_PRESTART_BYTES = 1
_workers.available_cpus = lambda: 2
kp._part_dir = lambda n: {str(parts_dir)!r}
kp.PART_BYTES = 1 << 20
from gpuaudit.cli import main
sys.exit(main(["trace", {str(path)!r}, "--price", "2.5", "-o", "/dev/null"]))
"""
    env = dict(os.environ)
    src = str(Path(kp.__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, env=env,
                            start_new_session=True)  # its own group, as a terminal's job
    deadline = time.monotonic() + 60
    while not (list(parts_dir.iterdir()) if gz else _mapping(path)) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert proc.poll() is None, "the command ended before handing a part over"
    helpers = _helper_pids()
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "aborted" in err
    assert not list(parts_dir.iterdir())
    time.sleep(0.2)
    assert not (helpers & _helper_pids())


def _mapping(path: Path) -> bool:
    """Whether a helper has mapped ``path``."""
    for pid in _helper_pids():
        try:
            if str(path) in Path(f"/proc/{pid}/maps").read_text():
                return True
        except OSError:
            pass
    return False


def _helper_pids() -> set[int]:
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"_kineto_parts" in f.read():
                    out.add(int(pid))
        except OSError:
            pass
    return out


def _ranks_dir(tmp_path: Path, n: int, events_per_rank: int = 400) -> Path:
    d = tmp_path / "ranks"
    d.mkdir()
    for r in range(n):
        evs: list[dict[str, object]] = []
        for i in range(events_per_rank):
            evs += [launch(10 * i, i), kernel(f"void k{(i + r) % 5}<float>(int)",
                                              10 * i + 2, 5 + r, i)]
        evs.append(span("ProfilerStep#1", 0, 10 * events_per_rank))
        write(d / f"rank{r}.json{'.gz' if r % 2 else ''}", evs, rank=r, gz=bool(r % 2))
    return d


def _same_ranks(a: loader.Trace, b: loader.Trace) -> None:
    assert [r.rank for r in a.ranks] == [r.rank for r in b.ranks]
    assert a.notes == b.notes
    for x, y in zip(a.ranks, b.ranks):
        assert x.path == y.path and x.notes == y.notes and x.meta == y.meta
        assert x.kernels.equals(y.kernels)
        assert x.spans.names == y.spans.names
        np.testing.assert_array_equal(x.runtime_ts_ns, y.runtime_ts_ns)


def _ranks_spy(monkeypatch: pytest.MonkeyPatch, cpus: int) -> list[int]:
    """Cut any folder between ``cpus`` processes; the list counts the files helpers
    loaded (their RankTraces, not loaded again here)."""
    monkeypatch.setattr(_workers, "available_cpus", lambda: cpus)
    monkeypatch.setattr(kp, "PART_BYTES", 1)
    taken: list[int] = []
    real = kp._ranks_answer

    def answer(proc: subprocess.Popen[bytes], n: int, kind: type) -> list[object]:
        got = real(proc, n, kind)
        taken.append(sum(r is not None for r in got))
        return got

    monkeypatch.setattr(kp, "_ranks_answer", answer)
    return taken


@pytest.mark.parametrize("cpus", [2, 3])
def test_ranks_loaded_side_by_side_equal_one_process(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     cpus: int) -> None:
    d = _ranks_dir(tmp_path, 5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_workers, "available_cpus", lambda: 1)
        ref = loader.load_traces([d])
    taken = _ranks_spy(monkeypatch, cpus)
    got = loader.load_traces([d])
    _same_ranks(ref, got)
    assert len(taken) == cpus - 1 and sum(taken) >= cpus - 1  # helpers' ranks were used


def test_the_real_two_ranks_side_by_side_equal_one_process(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    d = DATA / "two_ranks"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_workers, "available_cpus", lambda: 1)
        ref = loader.load_traces([d])
    taken = _ranks_spy(monkeypatch, 2)
    _same_ranks(ref, loader.load_traces([d]))
    assert taken == [1]


def test_the_first_bad_rank_in_file_order_is_the_error(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """Two damaged files, one in each process's share: the error is the first file's, as
    one process raises it, whichever process met it."""
    d = _ranks_dir(tmp_path, 4)
    for name in ("rank0.json", "rank2.json"):
        p = d / name
        p.write_bytes(p.read_bytes()[:-50])  # cut short
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_workers, "available_cpus", lambda: 1)
        with pytest.raises(InputError) as one:
            loader.load_traces([d])
    _ranks_spy(monkeypatch, 2)
    for order in (None, "reversed"):
        if order:  # this process meets rank 2's error first; the helper has rank 0's
            monkeypatch.setattr(kp, "_balance", lambda sizes, n: [[2, 3], [0, 1]])
        with pytest.raises(InputError) as got:
            loader.load_traces([d])
        assert got.value.where == one.value.where and str(got.value) == str(one.value)
        assert "rank0.json" in got.value.where


def test_a_rank_helper_that_dies_leaves_its_files_to_this_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _ranks_dir(tmp_path, 3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_workers, "available_cpus", lambda: 1)
        ref = loader.load_traces([d])
    taken = _ranks_spy(monkeypatch, 3)
    monkeypatch.setattr(_workers, "TRACE_WORKER", "import os; os._exit(3)")
    _same_ranks(ref, loader.load_traces([d]))
    assert taken == [0, 0]


def test_shares_are_balanced_and_in_file_order() -> None:
    shares = kp._balance([10, 50, 20, 20, 5, 45], 2)
    assert sorted(i for s in shares for i in s) == list(range(6))
    assert all(s == sorted(s) for s in shares)
    assert sorted(sum([10, 50, 20, 20, 5, 45][i] for i in s) for s in shares) == [75, 75]


def test_a_helper_is_started_ahead_for_a_folder_of_ranks(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    d = _ranks_dir(tmp_path, 2)
    monkeypatch.setattr(_workers, "available_cpus", lambda: 2)
    monkeypatch.setattr(_workers, "TRACE_PRESTART_BYTES",
                        sum(_workers.json_size(p) for p in d.iterdir()))
    _workers.prestart_trace([d])
    proc = _workers.take("trace")
    assert proc is not None
    _stop_unused(proc)
    monkeypatch.setattr(_workers, "TRACE_PRESTART_BYTES",
                        sum(_workers.json_size(p) for p in d.iterdir()) + 1)
    _workers.prestart_trace([d])
    assert _workers.take("trace") is None


def _stop_unused(proc: subprocess.Popen[bytes]) -> None:
    """A helper whose task never comes stops when its stdin closes, answering nothing."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    assert proc.stdout.read() == b"" and proc.wait() == 0
    proc.stdout.close()


# -- a large plain file in parts, read from the file itself (decode_file) ------------------


def _file_parts(monkeypatch: pytest.MonkeyPatch, cpus: int, part_bytes: int,
                probe_bytes: int = 1 << 20) -> _Spy:
    spy = _parts(monkeypatch, cpus, part_bytes)
    monkeypatch.setattr(kp, "_PROBE_BYTES", probe_bytes)
    return spy


def _from_file(path: Path, slice_bytes: int | None = None
               ) -> tuple[dict[str, object], kj.Columns] | None:
    return kp.decode_file(path, loader._ALL_CATS, loader._select, slice_bytes)


def _reads_one_pass(path: Path, slice_bytes: int) -> kj.Columns:
    """The file read in parts (it must be: not sent back to be read whole) gives one pass's
    meta and columns; returns them."""
    ref = _one_pass(path.read_bytes(), slice_bytes)
    got = _from_file(path, slice_bytes)
    assert got is not None and got[0] == ref[0]
    _same_all(ref[1], got[1])
    return got[1]


def _no_whole_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(path: Path) -> None:
        raise AssertionError(f"{path} was read whole")

    monkeypatch.setattr(kj, "read_document", fail)


_TAILS = {"plain": {"z": [2], "traceName": "t"},
          "objects after": {"samples": [{"a": 1}, {"b": [{}]}], "z": 2}}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(events(), st.integers(2, 4), st.integers(40, 400), st.integers(1, 300),
       st.integers(16, 4096), st.sampled_from(sorted(_TAILS)), st.booleans(), st.booleans())
def test_a_plain_file_in_parts_reads_what_one_pass_reads(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        evs: list[dict[str, object]], cpus: int, part_bytes: int, slice_bytes: int,
        probe_bytes: int, tail: str, decoy: bool, indent: bool) -> None:
    """Random events (false cuts inside strings, arrays of objects in args), parts and slices
    of any size, probes of any size, a tail with or without an array of objects after the
    events, a decoy ``"traceEvents": [`` inside a header string: the file's parts give one
    pass's meta and columns, or nothing (and then the document is read whole)."""
    doc: dict[str, object] = {"a": 1}
    if decoy:
        doc["note"] = 'x "traceEvents": [{"ph": "X"}], '
    doc["traceEvents"] = evs
    doc.update(_TAILS[tail])
    data = json.dumps(doc, indent=1 if indent else None).encode()
    path = tmp_path_factory.mktemp("plain") / "t.json"
    path.write_bytes(data)
    meta, whole = _one_pass(data, slice_bytes)
    _file_parts(monkeypatch, cpus, part_bytes, probe_bytes)
    got = _from_file(path, slice_bytes)
    if got is not None:
        assert got[0] == meta
        _same_all(whole, got[1])
    if tail == "plain" and not decoy and probe_bytes >= len(data):
        # the whole file probed, nothing unusual: read in parts wherever there are two
        lo = data.index(b"[", data.index(b'"traceEvents"')) + 1
        end = [m.end() - 1 for m in kj._EVENTS_CLOSE.finditer(data)][-1]
        two = end - lo >= 2 * part_bytes and len(kp.plan(memoryview(data), lo, end, 2)) == 2
        assert (got is not None) == two


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("cpus", [2, 3])
def test_real_traces_from_the_file_in_parts_equal_one_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, cpus: int) -> None:
    """The real traces as plain files: loaded in parts (each helper's part taken, the
    document never read whole), the same RankTrace as one process."""
    data = gzip.decompress((DATA / name).read_bytes())
    path = tmp_path / "t.json"
    path.write_bytes(data)
    ref = loader.load_trace(path, parts=False)
    meta, whole = _one_pass(data, 1 << 16)
    spy = _file_parts(monkeypatch, cpus, part_bytes=len(data) // (cpus + 1))
    got = _from_file(path, 1 << 16)
    assert got is not None and got[0] == meta
    _same_all(whole, got[1])
    assert spy.absorbed == cpus - 1
    _no_whole_read(monkeypatch)
    rank = loader.load_trace(path)
    assert rank.kernels.equals(ref.kernels) and rank.notes == ref.notes
    assert rank.spans.names == ref.spans.names and rank.meta == ref.meta
    np.testing.assert_array_equal(rank.runtime_ts_ns, ref.runtime_ts_ns)


def _big_plain(tmp_path: Path, n: int = 3000) -> Path:
    evs: list[dict[str, object]] = []
    for i in range(n):
        evs += [launch(10 * i, i), kernel(f"void k{i % 7}<float>(int)", 10 * i + 2, 5, i)]
    evs.append(span("ProfilerStep#1", 0, 10 * n))
    return write(tmp_path / "big.json", evs)


def test_a_helper_that_dies_leaves_its_file_part_to_this_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _big_plain(tmp_path)
    spy = _file_parts(monkeypatch, 3, part_bytes=path.stat().st_size // 4)
    monkeypatch.setattr(_workers, "TRACE_WORKER", "import os; os._exit(3)")
    _reads_one_pass(path, 1 << 16)
    assert spy.absorbed == 0


def test_a_helper_that_sees_another_file_leaves_its_part_to_this_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper maps its part only from the file this process saw (size, modification
    time, inode): here it sees another, answers nothing, and this process reads the part."""
    path = _big_plain(tmp_path)
    spy = _file_parts(monkeypatch, 2, part_bytes=path.stat().st_size // 3)
    monkeypatch.setattr(kp, "_stamp", lambda st: (st.st_size, st.st_mtime_ns + 1, st.st_ino))
    _reads_one_pass(path, 1 << 16)
    assert spy.absorbed == 0


def test_a_file_that_changes_while_read_is_read_again_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _big_plain(tmp_path)
    ref = loader.load_trace(path, parts=False)
    _file_parts(monkeypatch, 2, part_bytes=path.stat().st_size // 3)
    real = kp._decode_span

    def decode_then_touch(*args: object) -> bool:
        ok = real(*args)  # type: ignore[arg-type]
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        return ok

    monkeypatch.setattr(kp, "_decode_span", decode_then_touch)
    assert _from_file(path) is None
    rank = loader.load_trace(path)  # read whole, after the parts were refused
    assert rank.kernels.equals(ref.kernels)


@pytest.mark.parametrize("where", [0.2, 0.8])  # this process's part, a helper's part
def test_a_bad_event_in_a_file_part_is_named_as_one_pass_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: float) -> None:
    evs = [kernel(f"k{i}", 10 * i, 1, i) for i in range(400)]
    evs[int(len(evs) * where)]["name"] = 5
    path = write(tmp_path / "t.json", evs)
    with pytest.raises(InputError) as ref:
        loader.load_trace(path, parts=False)
    spy = _file_parts(monkeypatch, 2, part_bytes=path.stat().st_size // 3)
    assert _from_file(path) is None
    with pytest.raises(InputError) as exc:
        loader.load_trace(path)
    assert str(exc.value) == str(ref.value)
    assert f"traceEvents[{int(len(evs) * where)}]" in str(exc.value)
    assert spy.absorbed == 0


@pytest.mark.parametrize("damage", ["truncated", "garbage in a part", "no closing bracket"])
def test_damaged_json_in_a_plain_file_is_the_one_pass_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    """No pass validated the document before its parts: a part that does not decode sends
    it back to be read whole, which names the damage and its byte as before."""
    data = _big_plain(tmp_path).read_bytes()
    if damage == "truncated":
        data = data[: len(data) * 2 // 3]
    elif damage == "garbage in a part":
        at = data.index(b"},", len(data) * 3 // 4)
        data = data[:at] + b"}} ," + data[at + 2:]
    else:
        data = data[: data.rindex(b"]")] + data[data.rindex(b"]") + 1:]
    path = tmp_path / "damaged.json"
    path.write_bytes(data)
    with pytest.raises(InputError) as ref:
        loader.load_trace(path, parts=False)
    _file_parts(monkeypatch, 2, part_bytes=len(data) // 3)
    assert _from_file(path) is None
    with pytest.raises(InputError) as exc:
        loader.load_trace(path)
    assert str(exc.value) == str(ref.value)


def test_a_large_header_or_a_gzip_file_is_not_read_in_file_parts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the events array is not found in the probes, nothing is started: the document
    is read whole (a gzip trace is inflated, then decoded in parts as before)."""
    evs = [kernel(f"k{i}", 10 * i, 1, i) for i in range(300)]
    big_head = write(tmp_path / "head.json", evs, deviceProperties=[{"x": "y" * 5000}])
    gz = write(tmp_path / "t.json.gz", evs, gz=True)
    _file_parts(monkeypatch, 2, part_bytes=64, probe_bytes=4096)

    def no_spawn(program: str | None = None) -> None:
        raise AssertionError("a helper was started")

    monkeypatch.setattr(_workers, "spawn", no_spawn)
    assert _from_file(big_head) is None and _from_file(gz) is None


def test_a_file_cut_inside_a_string_is_decoded_on_here(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper's part starts at a false cut (inside the first event's name): this
    process's part does not decode to it, so this process reads on from where it stopped,
    in one pass, and the helper's answer is not used."""
    name = 'x"}, {"y' * 40
    path = write(tmp_path / "t.json", [kernel(name, 10 + i, 1, i) for i in range(40)])
    data = path.read_bytes()
    first = kj._CUT.search(data)
    assert first is not None
    assert data.index(b'"name"') < first.start() < data.index(b'"pid"')
    spy = _file_parts(monkeypatch, 2, part_bytes=64)
    monkeypatch.setattr(kp, "_file_cut", lambda f, pos, end: (first.start() + 1,
                                                               first.end() - 1))
    _no_whole_read(monkeypatch)
    got = _reads_one_pass(path, 1 << 20)
    assert spy.absorbed == 0
    assert [got.names[i] for i in got.name_idx.tolist()] == [name] * 40


@pytest.mark.parametrize(("doc", "ok"), [
    (b'{"a": 1, "traceEvents": [], "z": [2]}', True),
    (b'{"traceEvents": []}', True),
    (b'{"traceEvents": [], "traceEvents": [1]}', False),  # the later value is the one
    (b'{"traceEvents": [], "traceEvents": []}', False),  # ... even where it is alike
    (b'{"note": "\\"traceEvents\\": [", "traceEvents": []}', True),
    (b'{"traceEvents": [] ', False),  # not closed
    (b'{"traceEvents": []}, 1', False),  # something after the object
    (b'[{"traceEvents": []}]', False),  # not an object
    (b'{"x": {"traceEvents": []}}', False),  # not the top-level key
])
def test_the_header_and_tail_are_proven_around_the_events(doc: bytes, ok: bool) -> None:
    at = doc.index(b"[]")
    meta = kj.meta_around(doc, at)
    assert (meta is not None) == ok
    if ok:  # what decode() gives for the document with any events put back
        full = doc[:at] + b'[{"ph": "X", "cat": "kernel", "name": "k"}]' + doc[at + 2:]
        assert meta == kj.decode(bytearray(full), Path("t.json"), loader._ALL_CATS,
                                 loader._select)[0]


def test_arrays_of_objects_in_events_are_not_the_arrays_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every event's args end with an array of objects (``}]`` all through the tail that is
    probed): the events array's own end is still found, and the file is read in parts."""
    evs = [kernel(f"k{i}", 10 * i, 1, i) for i in range(300)]
    for ev in evs:
        ev["args"]["nested"] = [{"a": [{}]}]  # type: ignore[index]
    path = write(tmp_path / "t.json", evs)
    spy = _file_parts(monkeypatch, 2, part_bytes=path.stat().st_size // 3, probe_bytes=4096)
    _reads_one_pass(path, 1 << 12)
    assert spy.absorbed == 1


def test_a_helper_lets_its_decoded_pages_go_and_reads_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper's mapped part is let go page by page behind its slices (never the page the
    next slice starts in), and what it answers is what one pass reads."""
    path = _big_plain(tmp_path)
    data = path.read_bytes()
    page = mmap.PAGESIZE

    class Pages:  # records what is let go
        def __init__(self) -> None:
            self.calls: list[tuple[int, int]] = []

        def madvise(self, advice: int, start: int, length: int) -> None:
            assert advice == mmap.MADV_DONTNEED
            self.calls.append((start, length))

    lo = data.index(b"{", data.index(b'"traceEvents"'))
    pages = Pages()
    done = kp._releaser(pages, lo)  # type: ignore[arg-type]
    assert done is not None
    for upto in (lo + 10, lo + 3 * page + 5, lo + 3 * page + 9, lo + 9 * page, len(data)):
        done(upto)
        start, length = pages.calls[-1] if pages.calls else (lo - lo % page, 0)
        assert start % page == 0 and length % page == 0
        assert start + length <= upto - 1  # the page holding the byte before `upto` stays
    assert [s for s, _ in pages.calls] == sorted({s for s, _ in pages.calls})  # in order, once
    assert pages.calls[0][0] == lo - lo % page
    # in place, through the real mapping, with slices small enough to let pages go
    ref = _one_pass(data, 1 << 12)
    end = [m.end() - 1 for m in kj._EVENTS_CLOSE.finditer(data)][-1]
    state = kp._file_part(kp._FileTask(loader._ALL_CATS, loader._select, 1 << 12, str(path),
                                       lo, end, kp._stamp(path.stat())))
    assert state is not None
    acc = kj._Accumulator(loader._ALL_CATS, loader._select)
    acc.absorb(state)
    _same_all(ref[1], acc.finish())
