"""``FileSource.batches(dictionaries=...)`` (what classify's engine reads when it groups by
namespace, pod or container, issue 27's bill row): those columns come as the file's own
dictionaries, holding the same values row for row as the plain read, over row groups whose
dictionaries differ and batches that cut them anywhere; every other column is the plain
read's; classify gives the same cells from either."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit import schema
from gpuaudit.classify import classify
from gpuaudit.classify.phases import engine_batches
from gpuaudit.measure.files import open_samples, write_recording
from gpuaudit.schema import Recording, build_table

NS = 1_000_000_000
TEXT = ("namespace", "pod")


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    n_gpu = draw(st.integers(1, 4))
    n_t = draw(st.integers(1, 10))
    cols: dict[str, list[object]] = {k: [] for k in ("ts", "host", "gpu_uuid", "util_gpu_pct",
                                                      "namespace", "pod")}
    for k in range(n_t):
        for g in range(n_gpu):
            cols["ts"].append((1_700_000_000 + 60 * k) * NS)
            cols["host"].append("h1")
            cols["gpu_uuid"].append(f"GPU-{g}")
            cols["util_gpu_pct"].append(draw(st.sampled_from([0.0, 55.0, 100.0])))
            # values that change from row to row: each row group's dictionary differs
            cols["namespace"].append(draw(st.sampled_from([None, "team-a", "team-b"])))
            cols["pod"].append(draw(st.sampled_from([None, "p1", "p2", "p3"])))
    cols["ts"] = pa.array(np.array(cols["ts"], dtype=np.int64)).cast(schema.TS_TYPE)
    return build_table(cols)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), st.integers(1, 7), st.integers(1, 9),
       st.sampled_from([("pod",), ("namespace", "pod"), ("pod", "container")]))
def test_property_dictionaries_hold_the_plain_reads_values(table, rows_per_group, batch_rows,
                                                           asked):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.parquet"
        write_recording(Recording(table=table, source="t", origin="t", interval_s=60.0), path,
                        row_group_rows=rows_per_group)
        plain = list(open_samples(path, batch_rows=batch_rows).batches())
        coded = list(open_samples(path, batch_rows=batch_rows).batches(dictionaries=asked))
        by = ("namespace", "pod", "period:120")
        want = classify(Recording(table=table, source="t", origin="t", interval_s=60.0),
                        by=by, workers=1).cells
        got = classify(open_samples(path, batch_rows=batch_rows), by=by, workers=1).cells
    assert [b.num_rows for b in coded] == [b.num_rows for b in plain]
    for p, c in zip(plain, coded):
        for name in schema.SAMPLE_SCHEMA.names:
            if name in asked and name in TEXT:
                # (a column null in every row group is not read: nulls, as plain text)
                assert pa.types.is_dictionary(c.column(name).type) or (
                    table.column(name).null_count == table.num_rows), name
                assert c.column(name).cast(pa.string()).equals(p.column(name)), name
            else:
                assert c.column(name).equals(p.column(name)), name
    # (cells are numbered in the order the batches meet them: the same rows either way)
    order = [(k, "ascending") for k in ("gpu_uuid", "namespace", "pod", "period:120")]
    assert got.sort_by(order).equals(want.sort_by(order))


def test_the_engine_asks_for_its_text_keys_only() -> None:
    class Source:
        reads_lean = True
        reads_dictionaries = True

        def __init__(self) -> None:
            self.asked: dict[str, object] = {}

        def batches(self, **kw: object) -> list[pa.RecordBatch]:
            self.asked = kw
            return []

    for by, want in ((("namespace", "period:3600"), {"dictionaries": ["namespace"]}),
                     (("period:3600",), {"lean": True}), (("host", "label:team"), {}),
                     (("pod", "container", "host"), {"dictionaries": ["pod", "container"]})):
        src = Source()
        engine_batches(src, by)
        assert src.asked == want, by

    class Proxy:  # forwards batches() but does not declare the option: not asked
        reads_lean = False

        def batches(self, **kw: object) -> list[pa.RecordBatch]:
            assert not kw
            return []

    engine_batches(Proxy(), ("pod",))


def test_other_sources_ignore_it(tmp_path: Path) -> None:
    csv = tmp_path / "smi.csv"
    csv.write_text("timestamp, name, pci.bus_id, uuid, utilization.gpu [%]\n"
                   "2026/01/01 00:00:00.000, NVIDIA H100, 00000000:01:00.0, GPU-1, 5 %\n")
    batches = list(open_samples(csv, host="h").batches(dictionaries=["pod"]))
    assert batches[0].column("pod").type == pa.string()
