"""Server facts from a facts file (YAML or JSON, read bounded) or from the facts another document
carries (an audit's): every value checked, a refusal naming the file, the fact and the fix."""

from __future__ import annotations

import json
import math
import os
from dataclasses import fields
from pathlib import Path
from typing import Any, Mapping

from cache_tools import inputfile
from warmup.errors import FactsError, shown
from warmup.plan.facts import (DEFAULT_MAX_PREFILL_TOKENS, ServerFacts, from_settings,
                               setting_int, sglang_default)

#: A facts file (``plan facts`` writes about 1 KiB; ``plan show --format json`` with the
#: expansion, some 60 KiB for the shipped plans).
MAX_FILE_BYTES = 16 * 1024 * 1024
#: Facts a dump may leave out (they have defaults), and the facts that are lists in JSON.
_OPTIONAL = frozenset({"sglang_version", "source", "assumed", "default_sampling_params"})
_LISTS = frozenset({"decode_graph_bs", "prefill_graph_buckets", "assumed"})
_READ_HINT = "pass a readable YAML or JSON file (`sglang-warmup plan facts` writes one)"


#: The bounds of a fact read from a file or another document: an integer from 1 to 2^40 (the
#: bound of plan expressions), a list of at most 1,024 items (expressions' too).
MAX_INT = 1 << 40
MAX_ITEMS = 1024


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_INT


def _sampling(v: Any) -> bool:
    return isinstance(v, Mapping) and len(v) <= MAX_ITEMS and all(
        isinstance(k, str) and isinstance(x, (int, float)) and not isinstance(x, bool)
        and math.isfinite(x) for k, x in v.items())


#: Each field's type (its annotation) -> what it must be, and the test.
_EXPECTED: dict[str, tuple[str, Any]] = {
    "int": ("an integer from 1 to 2^40", _count),
    "int | None": ("an integer from 1 to 2^40, or null", lambda v: v is None or _count(v)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "str": ("text", lambda v: isinstance(v, str)),
    "str | None": ("text, or null", lambda v: v is None or isinstance(v, str)),
    "tuple[int, ...]": (f"a list of at most {MAX_ITEMS:,} integers from 1 to 2^40",
                        lambda v: isinstance(v, tuple) and len(v) <= MAX_ITEMS
                        and all(_count(x) for x in v)),
    "tuple[str, ...]": ("a list of texts", lambda v: isinstance(v, tuple)
                        and all(isinstance(x, str) for x in v)),
    "Mapping[str, Any]": ("an object of sampling parameters (finite numbers)", _sampling),
}


def check(facts: ServerFacts) -> None:
    """Every fact of its type and in range, else FactsError naming the first that is not (facts
    from a file or another document; SGLang's own settings are not checked)."""
    for f in fields(ServerFacts):
        what, test = _EXPECTED[str(f.type)]
        value = getattr(facts, f.name)
        if not test(value):
            raise FactsError(f"{f.name}: expected {what}, not "
                             f"{shown(list(value) if isinstance(value, tuple) else value)}",
                             hint="`sglang-warmup plan facts` prints a valid set of facts")


def from_file(path: str | os.PathLike[str]) -> ServerFacts:
    """Facts from a YAML or JSON file: either a ``ServerFacts`` dump (``plan facts`` and
    ``plan show --format json`` print one) or a flat mapping of SGLang server-arg names."""
    p = Path(path)
    data = _read(p)
    if "facts" in data and isinstance(data["facts"], dict):
        data = data["facts"]
    if "prefill_graph_backend" in data:  # a ServerFacts dump
        return from_dump(data, str(p), source="file",
                         hint="dump a complete set with `sglang-warmup plan facts`")
    try:
        facts = from_settings(data, source="file",
                              context_length=setting_int("context_length", data.get("context_length")),
                              max_req_input_len=setting_int("max_req_input_len", data.get("max_req_input_len")),
                              max_total_tokens=setting_int("max_total_num_tokens", data.get("max_total_num_tokens")),
                              vocab_size=setting_int("vocab_size", data.get("vocab_size")),
                              model_type=data.get("model_type"))
        check(facts)
    except FactsError as exc:
        raise FactsError(f"{p}: {exc.message}", hint=exc.hint) from None
    return facts


def from_dump(d: Any, where: str, *, hint: str, source: str | None = None) -> ServerFacts:
    """ServerFacts from a dump (``ServerFacts.to_dict()``): the names, their presence, types
    and ranges checked; a refusal is ``WHERE: what`` with ``hint``."""
    if not isinstance(d, Mapping):
        raise FactsError(f"{where}: expected an object of facts", hint=hint)
    known = {f.name for f in fields(ServerFacts)}
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        raise FactsError(f"{where}: unknown fact(s): {', '.join(unknown)}",
                         hint="valid names: " + ", ".join(sorted(known)))
    missing = sorted(known - set(d) - _OPTIONAL)
    if missing:
        raise FactsError(f"{where}: missing {len(missing)} fact(s): {', '.join(missing)}",
                         hint=hint)
    values = {k: _listed(v) if k in _LISTS else v for k, v in d.items()}
    said = values.get("assumed", ())
    if values.get("max_prefill_tokens") is None and isinstance(said, tuple):
        assumed = list(said)  # a dump older than SGLang's default assumed in from_settings
        values["max_prefill_tokens"] = sglang_default(assumed, "max_prefill_tokens", None,
                                                      DEFAULT_MAX_PREFILL_TOKENS)
        values["assumed"] = tuple(assumed)
    if source is not None:
        values["source"] = source
    facts = ServerFacts(**values)
    try:
        check(facts)
    except FactsError as exc:
        raise FactsError(f"{where}: {exc.message}", hint=hint) from None
    return facts


def _listed(v: Any) -> Any:
    """A JSON list as the tuple ServerFacts holds (null: empty); anything else as it is, for
    :func:`check` to refuse."""
    return () if v is None else tuple(v) if isinstance(v, list) else v


def _read(p: Path) -> dict:
    """The mapping a facts file holds."""
    try:
        text = inputfile.read(p, MAX_FILE_BYTES).decode("utf-8")
    except inputfile.TooLarge as exc:
        raise FactsError(f"{p}: facts file is {exc}", hint=_READ_HINT) from None
    except UnicodeDecodeError as exc:
        raise FactsError(f"{p}: facts file is not UTF-8 (byte {exc.start})",
                         hint=_READ_HINT) from None
    except OSError as exc:
        raise FactsError(f"{p}: cannot read facts file: {exc.strerror or exc}",
                         hint=_READ_HINT) from None
    data = _parsed(p, text)
    if not isinstance(data, dict):
        raise FactsError(f"{p}: a facts file must be a mapping", hint="write `name: value` lines")
    return data


def _parsed(p: Path, text: str) -> Any:
    """The document: JSON first (YAML 1.1 reads JSON's 5e5 as a string, JSON as the number it
    is), else YAML (a flow mapping is not JSON)."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except RecursionError:
            raise FactsError(f"{p}: not valid YAML/JSON: nested too deeply",
                             hint=_READ_HINT) from None
        except ValueError:  # not JSON after all (a YAML flow mapping): read as YAML
            pass
    import yaml

    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise FactsError(f"{p}: not valid YAML/JSON: nested too deeply", hint=_READ_HINT) from None
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer of 4,300+ digits
        raise FactsError(f"{p}: not valid YAML/JSON: {' '.join(str(exc).split())[:200]}",
                         hint="fix the syntax") from None
