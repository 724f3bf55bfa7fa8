"""The JSON Schema of plan files (the shipped ``plans/schema.json``), generated from the
loader's own table of keys, so the schema and the loader cannot disagree (a test keeps the
shipped file equal to it)."""

from __future__ import annotations

import json
from typing import Any

from warmup.plan import expr as E
from warmup.plan.spec import (DEFAULTS, IDENT, LIMITS, PHASE, REQUEST, RESERVED_CLASSES,
                              SHAPE_COMMON, SHAPE_KIND, TOP, Field)
from warmup.plan.model import FEATURES, KINDS, MAX_REQUESTS_CEILING, OVER_LIMIT, SAMPLING_KEYS, \
    SAMPLING_VARIANTS


def json_schema() -> dict[str, Any]:
    """The JSON Schema of plan files, generated from :data:`SPEC` (``plans/schema.json``)."""
    expr = {"anyOf": [{"type": "integer", "minimum": 1},
                      {"type": "string", "maxLength": E.MAX_LENGTH}]}
    bool_expr = {"anyOf": [{"type": "boolean"}, {"type": "string", "maxLength": E.MAX_LENGTH}]}
    expr_list = {"type": "array", "minItems": 1, "items": expr}
    ident = {"type": "string", "pattern": IDENT.pattern}
    variant_name = {"type": "string", "pattern": IDENT.pattern}
    types: dict[str, Any] = {
        "int_expr": expr, "bool_expr": bool_expr, "expr_list": expr_list,
        "expr_groups": {"type": "array", "minItems": 1, "items": expr_list},
        "range_or_list": {"anyOf": [expr_list, {"type": "object", "additionalProperties": False,
                                                "required": ["from", "to"],
                                                "properties": {"from": expr, "to": expr}}]},
        "ident": ident, "text": {"type": "string"}, "int": {"type": "integer", "minimum": 1},
        "bool": {"type": "boolean"}, "kind": {"enum": list(KINDS)},
        "int_expr0": {"anyOf": [{"type": "integer", "minimum": 0},
                                {"type": "string", "maxLength": E.MAX_LENGTH}]},
        "over_limit": {"enum": list(OVER_LIMIT)},
        "max_requests": {"type": "integer", "minimum": 1, "maximum": MAX_REQUESTS_CEILING},
        "features": {"type": "array", "minItems": 1, "items": {"enum": list(FEATURES)}},
        "token_classes": {"type": "array", "minItems": 1, "items": {"enum": ["aligned", "odd"]}},
        "variant_names": {"type": "array", "minItems": 1, "items": variant_name},
        "sampling": variant_name,
    }

    def obj(spec: dict[str, Field], **extra: Any) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": False,
                "required": [k for k, f in spec.items() if f.required],
                "properties": {k: dict(types[f.type], **({"description": f.doc} if f.doc else {}))
                               for k, f in spec.items()}, **extra}

    types["request"] = obj(REQUEST)
    all_shape_keys = dict(SHAPE_COMMON)
    for kind_spec in SHAPE_KIND.values():
        all_shape_keys.update(kind_spec)
    shape = obj(all_shape_keys)
    shape["required"] = [k for k, f in SHAPE_COMMON.items() if f.required]
    shape["properties"]["class"] = dict(shape["properties"]["class"],
                                        **{"not": {"enum": list(RESERVED_CLASSES)}})
    shape["allOf"] = [
        {"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
         "then": {"required": [k for k, f in spec.items() if f.required],
                  "propertyNames": {"enum": list(SHAPE_COMMON) + list(spec)}}}
        for kind, spec in SHAPE_KIND.items()
    ]
    types["shapes"] = {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/shape"}}
    types["phases"] = {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/phase"}}
    types["let"] = {"type": "object",
                    "additionalProperties": {"anyOf": [{"type": "integer"}, {"type": "boolean"},
                                                       {"type": "string", "maxLength": E.MAX_LENGTH}]},
                    "propertyNames": {"pattern": "^[A-Za-z][A-Za-z0-9_]{0,63}$"}}
    types["defaults"] = obj(DEFAULTS)
    types["limits"] = obj(LIMITS)
    types["sampling_variants"] = {
        "type": "object",
        "propertyNames": {"pattern": IDENT.pattern, "not": {"enum": list(SAMPLING_VARIANTS)}},
        "additionalProperties": {"type": "object", "additionalProperties": False,
                                 "properties": {k: {"type": "number", "minimum": 0}
                                                for k in sorted(SAMPLING_KEYS)}}}
    top = obj(TOP)
    top["properties"]["version"] = {"const": 1, "description": TOP["version"].doc}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "sglang-warmup shape plan",
        **top,
        "$defs": {"phase": obj(PHASE), "shape": shape},
    }


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"

