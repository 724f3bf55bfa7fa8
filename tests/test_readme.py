"""README.md stays true: its figures against the code that makes them, the commands and the
SGLang requirement it names, its links."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
sys.path.insert(0, str(REPO / "tests" / "warmup"))


def test_the_deepseek_plan_figures_are_the_expansion_of_today():
    """'393 requests in 165 steps' is what `plan show deepseek_v4_serving_shapes --server-args
    "$(cat tests/warmup/data/pr44627.flags)"` prints now."""
    import _facts_cache

    from warmup.plan import loader, shipped
    from warmup.plan.expand import expand

    exp = expand(loader.load(shipped.path("deepseek_v4_serving_shapes")), _facts_cache.pr44627())
    said = re.search(r"prints the expansion, ([\d,]+) requests in ([\d,]+) steps", README)
    assert said, "the README no longer says what the main command prints"
    assert (int(said.group(1).replace(",", "")), int(said.group(2).replace(",", ""))) == (
        exp.num_requests, len(exp.steps))
    again = re.search(r"`deepseek_v4_serving_shapes` expands to ([\d,]+) requests", README)
    assert again and int(again.group(1).replace(",", "")) == exp.num_requests
    bench = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert f"{exp.num_requests} requests" in bench   # the figure's source


def test_the_sglang_requirement_is_pyprojects():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    (sglang,) = [d for d in meta["project"]["optional-dependencies"]["sglang"]
                 if d.startswith("sglang")]
    lowest = re.search(r">=\s*([\d.]+)", sglang).group(1)
    named = set(re.findall(r"SGLang \(>= ([\d.]+)", README))
    assert named == {lowest}, (named, sglang)


def test_the_cache_verbs_in_the_table_are_the_commands():
    import typer.main

    from warmup.cli import app

    group = typer.main.get_command(app).get_command(None, "cache")
    real = set(group.list_commands(None))
    row = next(line for line in README.splitlines() if line.startswith("| `cache env"))
    listed = set(re.findall(r"[a-z]+", row.split("`")[1])) - {"cache"}
    assert listed == real, (listed ^ real)


def test_the_readme_names_only_commands_that_exist():
    import typer.main

    from warmup.cli import app

    root = typer.main.get_command(app)
    commands = set(root.list_commands(None))
    blocks = re.findall(r"```.*?```", README, re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", README, flags=re.S))
    code = "\n".join(blocks + spans)
    for cmd in re.findall(r"(?:^|\s)sglang-warmup ([a-z]+)", code, re.M):
        assert cmd in commands, cmd
    for row in README.splitlines():
        if row.startswith("| `"):
            first = row.split("`")[1].split()[0]
            assert first in commands, first


def test_the_two_commands_are_what_ci_runs():
    block = README.split("## The two commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [x for x in block.splitlines() if x and not x.startswith("#")]
    assert lines == ['bash scripts/setup.sh && .venv/bin/sglang-warmup plan show '
                     'deepseek_v4_serving_shapes --server-args "$(cat '
                     'tests/warmup/data/pr44627.flags)"', "bash scripts/test.sh"]
    assert "exec bash scripts/test.sh" in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("target", sorted(set(re.findall(r"\]\((docs/[^)]+)\)", README))))
def test_every_link_leads_somewhere(target):
    path, _, anchor = target.partition("#")
    assert (REPO / path).is_file(), path
    if anchor:
        headings = re.findall(r"^#+ (.+)$", (REPO / path).read_text(encoding="utf-8"), re.M)
        assert anchor in {_anchor(h) for h in headings}, (path, anchor)
