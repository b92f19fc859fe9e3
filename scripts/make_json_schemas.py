"""Write the JSON Schema of every JSON document gpuaudit produces to docs/schemas/.

    .venv/bin/python scripts/make_json_schemas.py          # rewrite docs/schemas/*.json
    .venv/bin/python scripts/make_json_schemas.py --check  # exit 1 if they are stale

Each schema is inferred from real documents, made here from the bundled and test data:
every key present in all of them is required with its JSON types, a key present in some is
described but optional, and objects stay open (``additionalProperties``), because a minor
schema version may add fields (docs/json-schema.md). So a document that drops or renames a
field, or changes its type, fails validation (``tests/report/test_json_schemas.py``), and a
new field is a re-run of this script.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "schemas"
DATA = ROOT / "tests" / "data"
DEMO = ROOT / "src" / "gpuaudit" / "data" / "nanogpt_8xh100.parquet"
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def infer(values: Sequence[Any]) -> dict[str, Any]:
    """The schema that every value in ``values`` satisfies (see the module's docstring)."""
    types = sorted({_type(v) for v in values})
    if "integer" in types and "number" in types:
        types.remove("integer")
    out: dict[str, Any] = {"type": types[0] if len(types) == 1 else types}
    objs = [v for v in values if isinstance(v, dict)]
    if objs:
        keys = sorted({k for o in objs for k in o})
        out["properties"] = {k: infer([o[k] for o in objs if k in o]) for k in keys}
        required = [k for k in keys if all(k in o for o in objs)]
        if required:
            out["required"] = required
    items = [x for v in values if isinstance(v, list) for x in v]
    if items:
        out["items"] = infer(items)
    return out


def _report_docs() -> list[dict[str, Any]]:
    from gpuaudit.api import audit, audit_fleet
    from gpuaudit.api.trace import trace

    docs = [audit(DEMO, gpu_model="H100", provider="aws").to_dict(),
            audit(DEMO, price=Decimal("2"), by="job").to_dict(),
            audit(DATA / "diagnosis" / "fsdp_offload_8xh100_10hz.parquet",
                  gpu_model="H100", provider="aws").to_dict(),
            trace([DATA / "traces" / "a100_1rank_ddp_nccl.json.gz"], price=Decimal("2"))
            .to_dict(),
            audit_fleet(recording=DATA / "diagnosis" / "straggler_4xa100_1hz.parquet",
                        pricing={"price": "1"}).to_dict()]
    return docs


def _bill_docs() -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "tests" / "billing"))
    import billgen

    from gpuaudit.api import bill

    sc = billgen.scenario()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        focus = billgen.write_csv(billgen.focus_rows(sc, "plain"), d / "focus.csv",
                                  billgen.FOCUS_COLUMNS)
        run = billgen.write_telemetry(sc, d / "run.parquet")
        return [bill(focus, telemetry=run, by="team").to_dict()]


def _capacity_docs() -> list[dict[str, Any]]:
    from gpuaudit.api.rightsize import rightsize
    from gpuaudit.api.simulate import simulate

    return [rightsize(DEMO, throughput="1200/s", provider="aws").to_dict(),
            simulate(DATA / "diagnosis" / "straggler_4xa100_1hz.parquet", policy="all",
                     gpu_model="A100").to_dict()]


#: file name -> (title, the documents it describes)
DOCUMENTS: dict[str, tuple[str, Callable[[], list[dict[str, Any]]]]] = {
    "report.schema.json": ("gpuaudit.report: report, audit, fleet, trace, run --format json",
                           _report_docs),
    "bill.schema.json": ("gpuaudit.report with extra.bill: bill --format json", _bill_docs),
    "capacity.schema.json": ("gpuaudit.capacity: rightsize, simulate, queue --format json",
                             _capacity_docs),
}


def build(name: str) -> dict[str, Any]:
    title, make = DOCUMENTS[name]
    return {"$schema": DRAFT, "$id": f"https://gpuaudit.dev/schemas/{name}", "title": title,
            **infer(make())}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    OUT.mkdir(parents=True, exist_ok=True)
    for name in DOCUMENTS:
        text = json.dumps(build(name), indent=1, sort_keys=True) + "\n"
        path = OUT / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"stale: {', '.join(stale)}: run scripts/make_json_schemas.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
