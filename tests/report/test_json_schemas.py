"""Every JSON document gpuaudit writes has a published JSON Schema (docs/schemas/, written by
scripts/make_json_schemas.py from real documents) and the documents validate against it
(issue 26). A dropped or renamed field, or a changed type, fails here; a new field is a
re-run of the script, which this test also asks for."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

ROOT = Path(__file__).parents[2]
SPEC = importlib.util.spec_from_file_location("make_json_schemas",
                                              ROOT / "scripts" / "make_json_schemas.py")
assert SPEC is not None and SPEC.loader is not None
gen = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gen)


@pytest.fixture(scope="module", params=sorted(gen.DOCUMENTS))
def case(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    name = request.param
    schema = json.loads((ROOT / "docs" / "schemas" / name).read_text())
    return name, schema, gen.DOCUMENTS[name][1]()


def test_every_document_validates(case: tuple[str, dict[str, Any], list[dict[str, Any]]]
                                  ) -> None:
    name, schema, docs = case
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for doc in docs:
        errors = sorted(validator.iter_errors(json.loads(json.dumps(doc))), key=str)
        assert not errors, f"{name}: {errors[0].json_path}: {errors[0].message}"


def test_the_published_schemas_are_current(case: tuple[str, dict[str, Any],
                                                       list[dict[str, Any]]]) -> None:
    name, schema, docs = case
    fresh = {"$schema": gen.DRAFT, "$id": f"https://gpuaudit.dev/schemas/{name}",
             "title": gen.DOCUMENTS[name][0], **gen.infer(docs)}
    assert json.loads(json.dumps(fresh, sort_keys=True)) == schema, (
        f"docs/schemas/{name} is stale: run .venv/bin/python scripts/make_json_schemas.py")


def test_a_renamed_field_fails_validation(case: tuple[str, dict[str, Any],
                                                      list[dict[str, Any]]]) -> None:
    _name, schema, docs = case
    doc = json.loads(json.dumps(docs[0]))
    key = sorted(schema["required"])[0]
    doc[key + "_renamed"] = doc.pop(key)
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
