"""``sglang-warmup plan``: check plans, show their expansion against a server's facts."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any, List, Optional

import typer

from cache_tools.render import lines, table
from warmup import settings
from warmup.cli import options, output
from warmup.cli.options import Format
from warmup.errors import FactsError
from warmup.plan import facts as facts_mod
from warmup.plan import facts_file as facts_file_mod
from warmup.plan import loader, shipped
from warmup.plan import schema as schema_mod
from warmup.plan.model import Expansion
from warmup.plan.expand import expand
from warmup.plan.lets import with_lets

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command("check")
def check(plans: list[Path] = typer.Argument(..., help="plan files or shipped plan names"),
          fmt: Format = options.FORMAT) -> None:
    """Validate plan files (syntax, keys, expressions); nothing is sent anywhere."""
    loaded = [(path, loader.load(path)) for path in plans]
    if fmt == "json":
        output.data_json([{"path": str(path), "plan": p.name, "phases": len(p.phases),
                           "shape_classes": len(p.shapes)} for path, p in loaded])
        return
    for path, p in loaded:
        output.data(f"{path}: ok ({p.name}: {len(p.phases)} phases, "
                    f"{len(p.shapes)} shape classes)")


def get_facts(server_args: Optional[str], facts_file: Optional[Path], url: Optional[str],
              model_config: Optional[str], api_key: Optional[str] = None, *,
              quiet: bool = False, verbose: bool = False) -> facts_mod.ServerFacts:
    """One of the three fact sources, exactly one given."""
    given = [x for x in (server_args, facts_file, url) if x]
    if len(given) != 1:
        raise FactsError("give exactly one of --server-args, --facts or --url",
                         hint='e.g. --server-args "--model-path /models/llama --chunked-prefill-size 8192"')
    if server_args:
        with output.sglang_step("resolving the launch flags with SGLang's parser",
                                quiet=quiet, verbose=verbose):
            return facts_mod.from_launch_flags(server_args, model_config=model_config)
    if facts_file:
        return facts_file_mod.from_file(facts_file)
    assert url  # the one given
    from warmup.serve.transport import HttpTransport

    return HttpTransport(url, api_key=options.api_key(api_key)).facts_sync()


_SERVER_ARGS = typer.Option(None, "--server-args", help="SGLang launch flags, resolved offline by SGLang")
_FACTS = typer.Option(None, "--facts", help="a facts file (YAML/JSON)")
_URL = typer.Option(None, "--url", help="a running SGLang server (reads /server_info)")
_MODEL_CONFIG = typer.Option(None, "--model-config",
                             help="directory with the model's config.json, for offline resolution")


@app.command("show")
def show(
    plan: Path = typer.Argument(..., help="a plan file, or a shipped plan's name (plan list)"),
    server_args: Optional[str] = _SERVER_ARGS,
    facts_file: Optional[Path] = _FACTS,
    url: Optional[str] = _URL,
    model_config: Optional[str] = _MODEL_CONFIG,
    api_key: Optional[str] = options.API_KEY,
    fmt: Format = options.FORMAT,
    steps: bool = typer.Option(False, "--steps", help="list every step, not only the classes"),
    skip_family: Optional[List[str]] = typer.Option(
        None, "--skip-family", help="leave a family of classes out (repeat or comma-separate; "
                                    "default: WARMUP_SKIP_FAMILIES)"),
    let: Optional[List[str]] = options.LET,
    quiet: bool = options.QUIET,
    verbose: bool = options.VERBOSE,
) -> None:
    """Expand a plan against a server's facts: requests grouped by class, with token counts."""
    p = with_lets(loader.load(plan), options.lets(let) if let else settings.LETS.get(),
                         source="--let" if let else settings.LETS.name)
    f = get_facts(server_args, facts_file, url, model_config, api_key, quiet=quiet,
                  verbose=verbose)
    families = (tuple(x.strip() for v in skip_family for x in v.split(",") if x.strip())
                if skip_family else settings.SKIP_FAMILIES.get())
    exp = expand(p, f, skip_families=families)
    if fmt == "json":
        output.data_json(exp.to_dict())
        return
    output.data(render_expansion(exp, steps=steps, width=output.width()))


@app.command("facts")
def show_facts(
    server_args: Optional[str] = _SERVER_ARGS,
    facts_file: Optional[Path] = _FACTS,
    url: Optional[str] = _URL,
    model_config: Optional[str] = _MODEL_CONFIG,
    api_key: Optional[str] = options.API_KEY,
    quiet: bool = options.QUIET,
    verbose: bool = options.VERBOSE,
) -> None:
    """Print the server facts a plan can read (JSON; usable as a --facts file)."""
    f = get_facts(server_args, facts_file, url, model_config, api_key, quiet=quiet,
                  verbose=verbose)
    output.data(facts_mod.dump(f))


@app.command("schema")
def schema() -> None:
    """Print the JSON Schema of plan files (the shipped plans/schema.json)."""
    output.data(schema_mod.schema_text(), nl=False)


@app.command("list")
def list_plans(fmt: Format = options.FORMAT) -> None:
    """The plans shipped with sglang-warmup, by name (use the name wherever a plan goes)."""
    rows: list[dict[str, Any]] = []
    for name in shipped.names():
        plan = loader.load(name)
        rows.append({"name": name, "phases": len(plan.phases), "classes": len(plan.shapes),
                     "description": " ".join(plan.description.split()), "file": plan.file})
    if fmt == "json":
        output.data_json(rows)
        return
    output.data(table(["name", "phases", "classes", "description"],
                      [[r["name"], r["phases"], r["classes"], _first_sentence(r["description"])]
                       for r in rows]))


def _first_sentence(text: str, limit: int = 90) -> str:
    first = text.split(". ")[0].rstrip(".")
    return first if len(first) <= limit else first[: limit - 1] + "…"


def render_expansion(exp: Expansion, *, steps: bool = False, width: int | None = None) -> str:
    """The expansion for people: facts, then one row per class (and per step with --steps);
    with ``width`` (a terminal's), the tables fit it and long lines wrap."""
    f = exp.facts
    tokens = sum(s.tokens for s in exp.steps)
    hit = sum(h.tokens for h in exp.prefix_hits().values())
    out = [f"plan {exp.plan}: {len(exp.steps)} steps, {exp.num_requests} requests, "
           f"{tokens:,} prompt tokens"
           + (f" ({tokens - hit:,} computed, the rest cache hits)" if hit else "")
           + ("; then flush the cache" if exp.flush else "")]
    out.append(f"facts ({f.source}): chunk={f.chunked_prefill_size} page={f.page_size} "
               f"context={f.context_length} max_running={f.max_running_requests} "
               f"decode_graph_max_bs={f.decode_graph_max_bs} prefill_graph={f.prefill_graph_backend} "
               f"buckets={_short(f.prefill_graph_buckets)} context_bucket={f.prefill_graph_context} "
               f"mixed_chunk={f.enable_mixed_chunk} radix={not f.disable_radix_cache}")
    for a in f.assumed:
        out.append(f"  assumed: {a}")
    groups: "OrderedDict[tuple[str, str], list]" = OrderedDict()
    for s in exp.steps:
        groups.setdefault((s.phase, s.shape_class), []).append(s)
    rows = []
    for (phase, cls), ss in groups.items():
        lens = sorted({r.input_len for s in ss for r in s.requests})
        sizes = sorted({len(s.requests) + len(s.background) for s in ss})
        rows.append([phase, cls, ss[0].kind, len(ss), sum(s.num_requests for s in ss),
                     _short(lens), _short(sizes), sum(s.tokens for s in ss)])
    out.append("")
    out.append(table(["phase", "class", "kind", "steps", "requests", "prompt tokens",
                      "requests/step", "total tokens"], rows, width=width, drop=(7, 6, 0)))
    if exp.skipped:
        out.append("")
        out.append(table(["phase", "class", "item", "skipped because"],
                         [[k.phase, k.shape_class, k.item or "(whole class)", k.reason]
                          for k in exp.skipped], width=width, drop=(0,)))
    output.warn(f"warning: {w}" for w in exp.warnings)
    if steps:
        out.append("")
        out.append(table(["#", "class", "mode", "lengths", "sampling", "note"],
                         [[s.index, s.shape_class, s.mode, _short([r.input_len for r in s.requests]),
                           _short(sorted({r.sampling_name for r in s.requests})), s.note]
                          for s in exp.steps], width=width, drop=(5,)))
    return lines(out, width)


def _short(values, limit: int = 8) -> str:
    vals = list(values)
    if not vals:
        return "-"
    if len(vals) > limit:
        return ", ".join(map(str, vals[:limit // 2])) + f", … ({len(vals)}), " + \
            ", ".join(map(str, vals[-2:]))
    return ", ".join(map(str, vals))
