"""scrape: recorded exporter output served over loopback HTTP; attribution rules."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuaudit.cli import main
from gpuaudit.cli.scrape import scrape_to_recording
from gpuaudit.errors import InputError
from gpuaudit.measure.live.recorder import read_recording
from gpuaudit.price.attribution import (
    UNALLOCATED,
    UNATTRIBUTED,
    Attributor,
    MappingFile,
    attribute_table,
    load_mapping,
)
from gpuaudit.schema import build_table

DATA = Path(__file__).parents[1] / "data"


class _Exporter:
    def __init__(self, pages: dict[str, bytes]):
        pages_ = pages

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages_.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *a: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Exporter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def exporter():
    pages = {"/l4": (DATA / "dcgm" / "l4_kops_conformance.prom").read_bytes(),
             "/mig": (DATA / "dcgm" / "a100_mig_1g5gb_nvidia_docs.prom").read_bytes()}
    with _Exporter(pages) as e:
        yield e


def test_scrape_two_endpoints_into_a_recording(exporter, tmp_path):
    out = tmp_path / "fleet.parquet"
    rows = scrape_to_recording([f"{exporter.url}/l4", f"{exporter.url}/mig"], out,
                               every_s=0.2, duration_s=0.6)
    rec = read_recording(out)
    assert rows == rec.table.num_rows
    uuids = set(rec.table.column("gpu_uuid").to_pylist())
    assert {"GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
            "GPU-34319582-d595-d1c7-d1d2-179bcfa61660/gi13"} <= uuids
    assert rows == 3 * 3  # three ticks x (1 L4 + MIG parent + MIG instance)


def test_scrape_cli_and_fleet_from_the_recording(exporter, tmp_path):
    out = tmp_path / "r.parquet"
    assert main(["scrape", f"{exporter.url}/l4", "--every", "0.2", "--duration", "0.4",
                 "-o", str(out)]) == 0
    rep = tmp_path / "r.json"
    assert main(["fleet", "--recording", str(out), "--by", "team", "--price", "1",
                 "--format", "json", "-o", str(rep)]) == 0
    import json

    fleet = json.loads(rep.read_text())["extra"]["fleet"]
    assert [e["group"]["team"] for e in fleet["showback"]] == [UNALLOCATED]


def test_scrape_unreachable_endpoint_is_an_error(tmp_path):
    rc = main(["scrape", "http://127.0.0.1:9/metrics", "--every", "1s", "--duration", "1s",
               "-o", str(tmp_path / "x.parquet")])
    assert rc == 2


def test_resolution_order(tmp_path):
    m = load_mapping(DATA / "fleet" / "teams.toml")
    a = Attributor(m, {("team-nlp", "p1"): {"team_id": "vision"}})
    assert a.resolve("team-nlp", "p1", {})["team"] == "vision"  # pod label wins
    assert a.resolve("team-nlp", "p2", {})["team"] == "nlp"  # namespace mapping
    assert a.resolve("sandbox", "p3", {"cost_center": "cc-42"})["project"] == "chat"
    assert a.resolve("sandbox", "p3", {})["team"] == UNATTRIBUTED
    assert a.resolve(None, None, {})["team"] == UNALLOCATED


def test_bad_mapping_files_say_where(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text("[teams]\nx = 1\n")
    with pytest.raises(InputError, match="unknown section"):
        load_mapping(p)
    p.write_text("[namespace.a]\nteam = 3\n")
    with pytest.raises(InputError, match=r"namespace\.a"):
        load_mapping(p)


@given(st.lists(st.tuples(st.sampled_from(["a", "b", None]), st.sampled_from(["x", "y", None]),
                          st.dictionaries(st.sampled_from(["team_id", "k"]),
                                          st.sampled_from(["t1", "t2"]), max_size=2)),
                min_size=1, max_size=30))
def test_attribute_table_equals_row_by_row(rows):
    n = len(rows)
    table = build_table({
        "ts": pa.array(range(n), pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
        "host": ["h"] * n, "gpu_uuid": [f"g{i}" for i in range(n)],
        "namespace": [r[0] for r in rows], "pod": [r[1] for r in rows],
        "labels": pa.array([list(r[2].items()) for r in rows],
                           type=pa.map_(pa.string(), pa.string())),
    })
    att = Attributor(MappingFile(namespaces={"a": {"team": "ta"}}), {})
    out = attribute_table(table, att).column("labels").to_pylist()
    for r, got in zip(rows, out):
        assert dict(got) == att.resolve(r[0], r[1], r[2])


def test_scrape_reads_the_endpoints_of_a_tick_at_once(tmp_path):
    """A slow node does not hold up the others: the slow endpoint (first in the list) answers
    only once the two others have been asked in the same tick, which a one-by-one scrape
    never does (it would wait out the slow one's patience, and the test fails on that)."""
    page = (DATA / "dcgm" / "l4_kops_conformance.prom").read_bytes()
    asked: set[str] = set()
    both = threading.Event()
    overlapped: list[bool] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/slow":
                overlapped.append(both.wait(10))
            else:
                asked.add(self.path)
                if {"/a", "/b"} <= asked:
                    both.set()
            body = page.replace(b"c2f76b33", self.path.strip("/").encode().ljust(8, b"0"))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rows = scrape_to_recording([f"{url}/slow", f"{url}/a", f"{url}/b"],
                                   tmp_path / "r.parquet", every_s=0.2, duration_s=0.2,
                                   timeout_s=30)
    finally:
        server.shutdown()
        server.server_close()
    assert overlapped == [True]
    assert rows == 3  # one tick, one L4 from each endpoint, in the order given
    uuids = read_recording(tmp_path / "r.parquet").table.column("gpu_uuid").to_pylist()
    assert [u.split("-")[1] for u in uuids] == ["slow0000", "a0000000", "b0000000"]
