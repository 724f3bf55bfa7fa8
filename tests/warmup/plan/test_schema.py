"""plans/schema.json is what the loader accepts: generated from the loader's own table, and a real
JSON Schema validator agrees with the loader on shipped plans and on bad ones."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from warmup.plan import loader, schema
from warmup.errors import PlanError

SCHEMA = json.loads(Path("plans/schema.json").read_text())


def test_schema_file_is_the_generated_one():
    assert Path("plans/schema.json").read_text() == schema.schema_text(), \
        "run `sglang-warmup plan schema > plans/schema.json`"


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("path", ["plans/default.yaml", "plans/deepseek_v4_serving_shapes.yaml"])
def test_shipped_plans_validate(path):
    jsonschema.validate(yaml.safe_load(Path(path).read_text()), SCHEMA)
    loader.load(path)


BASE = {"version": 1, "name": "t",
        "phases": [{"name": "p", "shapes": [{"class": "c", "kind": "extend", "lengths": [1, 219]}]}]}


def _with(**shape):
    plan = json.loads(json.dumps(BASE))
    plan["phases"][0]["shapes"][0].update(shape)
    return plan


@pytest.mark.parametrize("bad", [
    {**BASE, "colour": "red"},
    {**BASE, "version": 2},
    {k: v for k, v in BASE.items() if k != "phases"},
    _with(kind="extned"),
    _with(lenghts=[1]),
    _with(base=4096),  # a prefix key on an extend shape
    _with(lengths=[]),
    _with(lengths=[0]),
    _with(lengths=[1.5]),
    _with(requires=["radix"]),
    {**BASE, "name": "My Plan"},
    {**BASE, "sampling_variants": {"greedy": {"temperature": 0}}},
    {**BASE, "defaults": {"max_new_tokens": 0}},
])
def test_schema_and_loader_reject_the_same(bad):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)
    with pytest.raises(PlanError):
        loader.loads(json.dumps(bad), "bad.json")


@pytest.mark.parametrize("kind,extra", [
    ("prefix", {"base": 4096, "extends": [1, 37]}),
    ("batch", {"batch_sizes": {"from": 1, "to": 16}, "tokens_per_request": "64 + bs"}),
    ("sampling", {"variants": ["top_p", "greedy"], "prompt": 219, "concurrency": [1, 4]}),
])
def test_schema_and_loader_accept_the_same(kind, extra):
    plan = json.loads(json.dumps(BASE))
    plan["phases"][0]["shapes"][0] = {"class": "c", "kind": kind, **extra}
    jsonschema.validate(plan, SCHEMA)
    loader.loads(json.dumps(plan), "ok.json")
