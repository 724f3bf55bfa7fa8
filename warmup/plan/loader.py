"""YAML → :class:`~warmup.plan.model.Plan`, with ``file:line: key.path: what is wrong`` errors.

Only plain YAML is accepted: ``yaml.compose`` with the safe loader, no tags beyond the core
scalars, no aliases (alias bombs), no duplicate keys, no tabs, UTF-8 only, a size limit.  Every
key is checked against :data:`SPEC` (the same table :func:`json_schema` turns into
``plans/schema.json``), and every expression is parsed and its names checked here, at load, so
a bad plan never half-runs.

Longer than 500 lines: one step per key of the plan format, each with its own error lines,
all sharing the context that places an error at its file, line and key path.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
from typing import Any, Callable

import yaml

from cache_tools import inputfile
from warmup.plan import expr as E
from warmup.plan import shipped
from warmup.errors import PlanError
from warmup.plan.facts import FACT_NAMES
from warmup.plan.model import (DEFAULT_MAX_REQUESTS, MAX_REQUESTS_CEILING, OVER_LIMIT,
                               REQUEST_BOOL_FEATURES, SAMPLING_KEYS, SAMPLING_VARIANTS, Located,
                               Phase, Plan, Shape, Size, SizeRange, FEATURES, KINDS)
from warmup.plan.spec import (DEFAULTS, IDENT, LIMITS, PHASE, REQUEST, RESERVED_CLASSES,
                              SHAPE_COMMON, SHAPE_KIND, TOP, Field)

MAX_FILE_BYTES = 256 * 1024
MAX_NODES = 20_000
MAX_NESTING = 24  # YAML lists/mappings inside each other (a plan needs 6)
SUPPORTED_VERSIONS = (1,)
_SCALAR_TAGS = {
    "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null", "tag:yaml.org,2002:float",
}
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"


# --- YAML with locations ----------------------------------------------------------------------
class _Ctx:
    def __init__(self, file: str) -> None:
        self.file = file
        self.nodes = 0

    def fail(self, node: yaml.Node | None, path: str, what: str, hint: str = "") -> PlanError:
        line = node.start_mark.line + 1 if node is not None else 1
        return PlanError(f"{self.file}:{line}: {path or '<top>'}: {what}", hint=hint)

    def at(self, node: yaml.Node, path: str) -> Located:
        return Located(self.file, node.start_mark.line + 1, path)


def load(path: str | os.PathLike[str]) -> Plan:
    """Load and validate a plan: a plan file, or a shipped plan by name (``default``)."""
    return loads(*read(path))


def read(path: str | os.PathLike[str]) -> tuple[bytes, str]:
    """The bytes of a plan file or a shipped plan (bounded by :data:`MAX_FILE_BYTES`, a FIFO
    by time too) and the file's name for error lines."""
    p = shipped.resolve(path)
    try:
        return inputfile.read(p, MAX_FILE_BYTES), str(p)
    except inputfile.TooLarge as exc:
        raise _too_large(str(p), exc) from None
    except OSError as exc:
        raise PlanError(f"{p}: cannot read plan: {exc.strerror or exc}",
                        hint="check the path") from None


def _too_large(file: str, exc: inputfile.TooLarge) -> PlanError:
    return PlanError(f"{file}:1: <top>: file is {exc}",
                     hint="a plan is a short list of shape classes; split or shrink it")


def loads(raw: bytes | str, file: str = "<plan>") -> Plan:
    """Validate plan text (bytes are decoded as UTF-8)."""
    ctx = _Ctx(file)
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    if len(raw) > MAX_FILE_BYTES:
        raise _too_large(file, inputfile.TooLarge(len(raw), MAX_FILE_BYTES))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_no = raw[: exc.start].count(b"\n") + 1
        raise PlanError(f"{file}:{line_no}: <top>: byte 0x{raw[exc.start]:02x} is not UTF-8",
                        hint="save the plan as UTF-8") from None
    if not text.strip() or all(ln.strip().startswith("#") or not ln.strip() for ln in text.splitlines()):
        raise PlanError(f"{file}:1: <top>: the plan is empty",
                        hint="start from a shipped plan: sglang-warmup plan list")
    for i, line in enumerate(text.splitlines(), 1):
        if "\t" in line:
            raise PlanError(f"{file}:{i}: <top>: tab character (column {line.index(chr(9)) + 1})",
                            hint="indent YAML with spaces only")
    try:
        depth = 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise PlanError(f"{file}:{event.start_mark.line + 1}: <top>: YAML alias "
                                f"*{event.anchor} is not allowed in plans",
                                hint="write the value out; aliases can expand exponentially")
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_NESTING:
                    raise PlanError(f"{file}:{event.start_mark.line + 1}: <top>: lists and "
                                    f"mappings nested more than {MAX_NESTING} levels deep",
                                    hint="a plan nests phases > shapes > sizes; flatten it")
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line_no = mark.line + 1 if mark else 1
        raise PlanError(f"{file}:{line_no}: <top>: invalid YAML: {exc.problem or exc}",
                        hint="fix the YAML syntax") from None
    except yaml.reader.ReaderError as exc:
        line_no = text[: exc.position].count("\n") + 1
        raise PlanError(f"{file}:{line_no}: <top>: invalid YAML: character {exc.character!r} is not "
                        "allowed in YAML", hint="remove control characters from the plan") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PlanError(f"{file}:1: <top>: invalid YAML: {first}",
                        hint="fix the YAML syntax") from None
    if node is None:
        raise PlanError(f"{file}:1: <top>: the plan is empty",
                        hint="start from a shipped plan: sglang-warmup plan list")
    _check_tree(ctx, node)
    return _build_plan(ctx, node, hashlib.sha256(raw).hexdigest())


def _check_tree(ctx: _Ctx, root: yaml.Node) -> None:
    """Reject explicit tags (``!!python/...``) anywhere, and oversized documents, before any
    value is built."""
    stack, count = [root], 0
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ctx.fail(node, "<top>", f"more than {MAX_NODES} YAML nodes", hint="shrink the plan")
        if node.tag not in _SCALAR_TAGS and node.tag not in (_SEQ, _MAP):
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise ctx.fail(node, "<top>", f"YAML tag {tag} is not allowed",
                           hint="plans hold plain values only (numbers, text, lists, mappings)")
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.extend((k, v))


def _scalar(ctx: _Ctx, node: yaml.Node, path: str) -> Any:
    ctx.nodes += 1
    if ctx.nodes > MAX_NODES:
        raise ctx.fail(node, path, f"more than {MAX_NODES} YAML nodes", hint="shrink the plan")
    if not isinstance(node, yaml.ScalarNode):
        kind = "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
        raise ctx.fail(node, path, f"expected a single value, got {kind}",
                       hint="write one value here, not a list or mapping")
    if node.tag not in _SCALAR_TAGS:
        raise ctx.fail(node, path, f"YAML tag {node.tag.replace('tag:yaml.org,2002:', '!!')} is not allowed",
                       hint="plans hold plain values only")
    try:
        return yaml.SafeLoader("").construct_object(node)
    except ValueError:  # an integer of more digits than int() converts (4,300)
        raise ctx.fail(node, path, f"an integer of {len(node.value):,} digits is beyond ±2^40",
                       hint="write a whole number up to 2^40") from None


def _mapping(ctx: _Ctx, node: yaml.Node, path: str, spec: dict[str, Field],
             extra_hint: str = "") -> dict[str, tuple[yaml.Node, yaml.Node]]:
    ctx.nodes += 1
    if node.tag != _MAP or not isinstance(node, yaml.MappingNode):
        if isinstance(node, yaml.MappingNode):
            raise ctx.fail(node, path, f"YAML tag {node.tag} is not allowed")
        raise ctx.fail(node, path, f"expected a mapping, got {_what(node)}",
                       hint="write `key: value` lines")
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for knode, vnode in node.value:
        key = _scalar(ctx, knode, path)
        kpath = f"{path}.{key}" if path else str(key)
        if not isinstance(key, str):
            raise ctx.fail(knode, kpath, f"keys must be text, got {key!r}", hint="quote the key")
        if key in out:
            raise ctx.fail(knode, kpath, f"duplicate key (first at line {out[key][0].start_mark.line + 1})",
                           hint="keep one of them")
        if spec and key not in spec:
            close = difflib.get_close_matches(key, list(spec), n=1)
            hint = (f"did you mean '{close[0]}'? " if close else "") + "valid keys: " + ", ".join(spec)
            raise ctx.fail(knode, kpath, f"unknown key '{key}'{extra_hint}", hint=hint)
        out[key] = (knode, vnode)
    for name, f in spec.items():
        if f.required and name not in out:
            raise ctx.fail(node, f"{path}.{name}" if path else name, "required key is missing",
                           hint=f.doc or f"add `{name}:`")
    return out


def _sequence(ctx: _Ctx, node: yaml.Node, path: str, *, nonempty: bool = True) -> list[yaml.Node]:
    ctx.nodes += 1
    if node.tag != _SEQ or not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, path, f"expected a list, got {_what(node)}",
                       hint="write a YAML list, e.g. [1, 219, 256]")
    if nonempty and not node.value:
        raise ctx.fail(node, path, "the list is empty", hint="give at least one item or remove the key")
    return list(node.value)


def _what(node: yaml.Node) -> str:
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    v = yaml.SafeLoader("").construct_object(node) if node.tag in _SCALAR_TAGS else node.value
    return f"{_type_name(v)} {v!r}"


def _type_name(v: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "text",
            type(None): "null"}.get(type(v), type(v).__name__)


_SIZE_HINT = "a size is a positive integer or an expression such as `chunked_prefill_size + 219`"


# --- typed values -----------------------------------------------------------------------------
def _int(ctx: _Ctx, node: yaml.Node, path: str, *, minimum: int = 1) -> int:
    v = _scalar(ctx, node, path)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ctx.fail(node, path, f"expected an integer, got {_type_name(v)} {v!r}",
                       hint="write a whole number")
    if v < minimum:
        raise ctx.fail(node, path, f"must be >= {minimum}, got {v}", hint="write a whole number")
    if v > E.MAX_MAGNITUDE:
        raise ctx.fail(node, path, f"value {E.digits(v)} is beyond ±2^40",
                       hint="write a whole number up to 2^40")
    return v


def _ident(ctx: _Ctx, node: yaml.Node, path: str) -> str:
    v = _scalar(ctx, node, path)
    if not isinstance(v, str) or not IDENT.fullmatch(v):
        raise ctx.fail(node, path, f"{v!r} is not a name",
                       hint="use lower-case letters, digits and _ (start with a letter, <= 64)")
    return v


def _text(ctx: _Ctx, node: yaml.Node, path: str) -> str:
    v = _scalar(ctx, node, path)
    if not isinstance(v, str):
        raise ctx.fail(node, path, f"expected text, got {_type_name(v)} {v!r}", hint="quote it")
    return v


def _bool(ctx: _Ctx, node: yaml.Node, path: str) -> bool:
    v = _scalar(ctx, node, path)
    if not isinstance(v, bool):
        raise ctx.fail(node, path, f"expected true or false, got {v!r}", hint="write true or false")
    return v


def _size(ctx: _Ctx, node: yaml.Node, path: str, names: frozenset[str], *, boolean: bool = False,
          minimum: int = 1) -> Size:
    v = _scalar(ctx, node, path)
    if isinstance(v, bool):
        if not boolean:
            raise ctx.fail(node, path, f"expected an integer or an expression, got {v!r}", hint=_SIZE_HINT)
        text = "True" if v else "False"
    elif isinstance(v, int):
        if not boolean and v < minimum:
            what = "positive" if minimum == 1 else f">= {minimum}"
            raise ctx.fail(node, path, f"sizes must be {what}, got {v}", hint=_SIZE_HINT)
        text = str(v)
    elif isinstance(v, str):
        text = v
    else:
        raise ctx.fail(node, path, f"expected an integer or an expression, got {_type_name(v)} {v!r}",
                       hint=_SIZE_HINT)
    try:
        parsed = E.parse(text, names)
    except E.ExprSyntaxError as exc:
        hint = "expressions use integers, + - * // %, comparisons, and/or/not, x if c else y, " \
               "server facts and: " + ", ".join(sorted(E.FUNCTIONS))
        msg = str(exc)
        if msg.endswith("is beyond ±2^40"):
            hint = "plan values are whole numbers up to 2^40 (1,099,511,627,776)"
        if msg.startswith("unknown name"):
            bad = msg.split("'")[1]
            close = difflib.get_close_matches(bad, sorted(names), n=1)
            hint = (f"did you mean '{close[0]}'? " if close else "") + \
                "`sglang-warmup plan facts` lists the server facts"
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise ctx.fail(node, path, f"`{shown}`: {msg}", hint=hint) from None
    return Size(parsed, ctx.at(node, path))


def _size_list(ctx: _Ctx, node: yaml.Node, path: str, names: frozenset[str]) -> tuple[Size, ...]:
    return tuple(_size(ctx, n, f"{path}[{i}]", names) for i, n in enumerate(_sequence(ctx, node, path)))


def _enum(ctx: _Ctx, node: yaml.Node, path: str, choices: tuple[str, ...] | list[str], what: str) -> str:
    v = _scalar(ctx, node, path)
    if v not in choices:
        close = difflib.get_close_matches(str(v), list(choices), n=1)
        raise ctx.fail(node, path, f"unknown {what} {v!r}",
                       hint=(f"did you mean '{close[0]}'? " if close else "") + "choose one of: "
                       + ", ".join(choices))
    return v


# --- the plan ---------------------------------------------------------------------------------
def _build_plan(ctx: _Ctx, node: yaml.Node, sha: str) -> Plan:
    """The plan of a parsed YAML document: its head, variants, defaults, limits, lets, phases."""
    top = _mapping(ctx, node, "", TOP)
    _version(ctx, top["version"][1])
    name = _ident(ctx, top["name"][1], "name")
    description = _text(ctx, top["description"][1], "description") if "description" in top else ""
    flush = _bool(ctx, top["flush"][1], "flush") if "flush" in top else True
    variants = _variants(ctx, top["sampling_variants"][1]) if "sampling_variants" in top else {}
    variant_names = tuple(SAMPLING_VARIANTS) + tuple(variants)
    sampling, max_new_tokens = _defaults(ctx, top, variant_names)
    max_requests, over_limit = _limits(ctx, top)
    lets = _lets(ctx, top["let"][1]) if "let" in top else []
    names = frozenset(FACT_NAMES) | {n for n, _ in lets}
    phases = _phases(ctx, top["phases"][1], names, variant_names)
    return Plan(name=name, description=description, file=ctx.file, phases=tuple(phases),
                let=tuple(lets), sampling=sampling, max_new_tokens=max_new_tokens,
                max_requests=max_requests, over_limit=over_limit, flush=flush, sampling_variants=variants,
                source_sha256=sha)


def _version(ctx: _Ctx, vnode: yaml.Node) -> None:
    version = _scalar(ctx, vnode, "version")
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        raise ctx.fail(vnode, "version", f"unsupported plan version {version!r}",
                       hint="this sglang-warmup reads version: 1")


def _variants(ctx: _Ctx, node: yaml.Node) -> dict[str, dict[str, Any]]:
    """``sampling_variants``: named sets of sampling parameters, each a number 0..2^40."""
    variants: dict[str, dict[str, Any]] = {}
    vmap = _mapping(ctx, node, "sampling_variants", {})
    for vname, (kn, vn) in vmap.items():
        vpath = f"sampling_variants.{vname}"
        _ident(ctx, kn, vpath)
        if vname in SAMPLING_VARIANTS:
            raise ctx.fail(kn, vpath, f"'{vname}' is a built-in variant",
                           hint="choose another name")
        params = _mapping(ctx, vn, vpath, {k: Field("number") for k in sorted(SAMPLING_KEYS)})
        variants[vname] = {}
        for pk, (_, pv) in params.items():
            val = _scalar(ctx, pv, f"{vpath}.{pk}")
            if isinstance(val, bool) or not isinstance(val, (int, float)) or \
                    not 0 <= val <= E.MAX_MAGNITUDE:  # NaN is in no range
                raise ctx.fail(pv, f"{vpath}.{pk}", "expected a number from 0 to 2^40, got "
                               f"{E.digits(val) if isinstance(val, int) else repr(val)}",
                               hint="sampling parameters are numbers, e.g. {temperature: 0.7}")
            variants[vname][pk] = val
    return variants


def _defaults(ctx: _Ctx, top: dict, variant_names: tuple[str, ...]) -> tuple[str, int]:
    """``defaults``: (sampling, max_new_tokens)."""
    sampling, max_new_tokens = "alternate", 1
    if "defaults" in top:
        d = _mapping(ctx, top["defaults"][1], "defaults", DEFAULTS)
        if "sampling" in d:
            sampling = _enum(ctx, d["sampling"][1], "defaults.sampling", ("alternate",) + variant_names,
                             "sampling")
        if "max_new_tokens" in d:
            max_new_tokens = _int(ctx, d["max_new_tokens"][1], "defaults.max_new_tokens")
    return sampling, max_new_tokens


def _limits(ctx: _Ctx, top: dict) -> tuple[int, str]:
    """``limits``: (max_requests, over_limit)."""
    max_requests, over_limit = DEFAULT_MAX_REQUESTS, "skip"
    if "limits" in top:
        lim = _mapping(ctx, top["limits"][1], "limits", LIMITS)
        if "max_requests" in lim:
            max_requests = _int(ctx, lim["max_requests"][1], "limits.max_requests")
            if max_requests > MAX_REQUESTS_CEILING:
                raise ctx.fail(lim["max_requests"][1], "limits.max_requests",
                               f"{max_requests} is above the ceiling of {MAX_REQUESTS_CEILING}",
                               hint="a warm-up sends each shape class once or twice; shrink the "
                                    "plan's sizes instead")
        if "over_limit" in lim:
            over_limit = _enum(ctx, lim["over_limit"][1], "limits.over_limit", OVER_LIMIT,
                               "over_limit policy")
    return max_requests, over_limit


def _lets(ctx: _Ctx, node: yaml.Node) -> list[tuple[str, Size]]:
    """``let``: named expressions, each over the facts and the lets before it."""
    names = set(FACT_NAMES)
    lets: list[tuple[str, Size]] = []
    for lname, (kn, vn) in _mapping(ctx, node, "let", {}).items():
        lpath = f"let.{lname}"
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", lname):
            raise ctx.fail(kn, lpath, f"{lname!r} is not a name",
                           hint="letters, digits and _, starting with a letter")
        if lname in FACT_NAMES or lname in E.FUNCTIONS or lname == "bs":
            raise ctx.fail(kn, lpath, f"'{lname}' shadows a server fact or function",
                           hint="choose another name")
        lets.append((lname, _size(ctx, vn, lpath, frozenset(names), boolean=True)))
        names.add(lname)
    return lets


def _phases(ctx: _Ctx, node: yaml.Node, names: frozenset[str],
            variant_names: tuple[str, ...]) -> list[Phase]:
    """``phases``: each with its shapes; phase and class names unique in the plan."""
    phases: list[Phase] = []
    seen_classes: dict[str, int] = {}
    seen_phases: set[str] = set()
    for pi, pnode in enumerate(_sequence(ctx, node, "phases")):
        ppath = f"phases[{pi}]"
        pm = _mapping(ctx, pnode, ppath, PHASE)
        pname = _ident(ctx, pm["name"][1], f"{ppath}.name")
        if pname in seen_phases:
            raise ctx.fail(pm["name"][1], f"{ppath}.name", f"duplicate phase name '{pname}'",
                           hint="phase names are unique in a plan")
        seen_phases.add(pname)
        shapes = []
        for si, snode in enumerate(_sequence(ctx, pm["shapes"][1], f"{ppath}.shapes")):
            spath = f"{ppath}.shapes[{si}]"
            shape = _build_shape(ctx, snode, spath, names, variant_names)
            if shape.name in seen_classes:
                raise ctx.fail(snode, f"{spath}.class",
                               f"duplicate class '{shape.name}' (first at line {seen_classes[shape.name]})",
                               hint="class names are unique in a plan")
            seen_classes[shape.name] = shape.where.line
            shapes.append(shape)
        phases.append(Phase(pname, tuple(shapes)))
    return phases


def _build_shape(ctx: _Ctx, node: yaml.Node, path: str, names: frozenset[str],
                 variant_names: tuple[str, ...]) -> Shape:
    # Read `kind` first so unknown keys can be reported against that kind's keys.
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, path, f"expected a mapping, got {_what(node)}", hint="write `key: value` lines")
    kind_node = next((v for k, v in node.value
                      if isinstance(k, yaml.ScalarNode) and k.value == "kind"), None)
    if kind_node is None:
        raise ctx.fail(node, f"{path}.kind", "required key is missing",
                       hint="kind is one of: " + ", ".join(KINDS))
    kind = _enum(ctx, kind_node, f"{path}.kind", KINDS, "kind")
    spec = {**SHAPE_COMMON, **SHAPE_KIND[kind]}
    m = _mapping(ctx, node, path, spec, extra_hint=f" for kind '{kind}'")
    cls = _ident(ctx, m["class"][1], f"{path}.class")
    if cls in RESERVED_CLASSES:
        raise ctx.fail(m["class"][1], f"{path}.class", f"'{cls}' is reserved: the phase file "
                       "names the driver's own steps so", hint="rename the class")
    kw: dict[str, Any] = {}
    for key, (_kn, vn) in m.items():
        if key in ("class", "kind"):
            continue
        kpath = f"{path}.{key}"
        t = spec[key].type
        if t == "text":
            kw[key] = _text(ctx, vn, kpath)
        elif t == "int_expr":
            kw[key] = _size(ctx, vn, kpath, names | ({"bs"} if key == "tokens_per_request" else set()))
        elif t == "bool_expr":
            kw[key] = _size(ctx, vn, kpath, names, boolean=True)
        elif t == "expr_list":
            kw[key] = _size_list(ctx, vn, kpath, names)
        elif t == "expr_groups":
            kw[key] = tuple(_size_list(ctx, g, f"{kpath}[{i}]", names)
                            for i, g in enumerate(_sequence(ctx, vn, kpath)))
        elif t == "range_or_list":
            kw[key] = _range_or_list(ctx, vn, kpath, names)
        elif t == "features":
            kw[key] = tuple(_enum(ctx, f, f"{kpath}[{i}]", tuple(FEATURES), "feature")
                            for i, f in enumerate(_sequence(ctx, vn, kpath)))
        elif t == "token_classes":
            kw[key] = tuple(_enum(ctx, f, f"{kpath}[{i}]", ("aligned", "odd"), "token class")
                            for i, f in enumerate(_sequence(ctx, vn, kpath)))
        elif t == "variant_names":
            kw[key] = tuple(_enum(ctx, f, f"{kpath}[{i}]", variant_names, "sampling variant")
                            for i, f in enumerate(_sequence(ctx, vn, kpath)))
        elif t == "sampling":
            kw[key] = _enum(ctx, vn, kpath, ("alternate",) + variant_names, "sampling")
        elif t == "request":
            kw[key] = _request(ctx, vn, kpath, names)
        elif t == "ident":
            kw[key] = _ident(ctx, vn, kpath)
        elif t == "bool":
            kw[key] = _bool(ctx, vn, kpath)
        else:  # pragma: no cover - SPEC and this switch are kept in step by tests
            raise AssertionError(t)
    why = kw.pop("why", "")
    return Shape(name=cls, kind=kind, why=why, where=ctx.at(node, path), **kw)


def _request(ctx: _Ctx, node: yaml.Node, path: str,
             names: frozenset[str]) -> tuple[tuple[str, Size | bool], ...]:
    """``request:``: SGLang request fields turned on for every request of the class; integer
    ones are expressions that may read ``input_len``."""
    m = _mapping(ctx, node, path, REQUEST)
    out: list[tuple[str, Size | bool]] = []
    for key, (_, vn) in m.items():
        if key in REQUEST_BOOL_FEATURES:
            out.append((key, _bool(ctx, vn, f"{path}.{key}")))
        else:
            out.append((key, _size(ctx, vn, f"{path}.{key}", names | {"input_len"}, minimum=0)))
    return tuple(out)


def _range_or_list(ctx: _Ctx, node: yaml.Node, path: str,
                   names: frozenset[str]) -> tuple[Size, ...] | SizeRange:
    """A list of sizes, or ``{from: a, to: b}`` (inclusive)."""
    if isinstance(node, yaml.MappingNode):
        m = _mapping(ctx, node, path, {"from": Field("int_expr", True), "to": Field("int_expr", True)})
        lo = _size(ctx, m["from"][1], f"{path}.from", names)
        hi = _size(ctx, m["to"][1], f"{path}.to", names)
        return SizeRange(lo, hi)
    return _size_list(ctx, node, path, names)

Validator = Callable[[str], Plan]
