"""warmup/cli/values.py: every option of every command coerces a value exactly as typer's own
coercion (pydantic) does: the same value, or the same refusal with the same message."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer import _click
from typer._coercion import build_runtime_param

from warmup.cli import commands, values

#: what a user may type, and what a default may be
RAW = ["7", "007", "0", "1", "65535", "65536", " 7", "+7", "-1", "1_0", "7.0", "1.5", "1.",
       ".5", "1e3", "inf", "nan", "abc", "", "table", "json", "TABLE", "json ", "sh", "k8s",
       "other", "x" * 300, "a\udcff", "/tmp", "rel/path", "-", 7, 0, 3, 2.5, 1.0, True, False,
       Path("/tmp/x")]


def _params():
    """Every parameter (``--help`` included) of every command, with the command."""
    out = []

    def walk(command):
        ctx = _click.Context(command)
        for param in [*command.params, command.get_help_option(ctx)]:
            if param is not None:
                out.append((command, param))
        for name in list(getattr(command, "commands", {})):     # built on demand
            walk(command.get_command(ctx, name))

    for name in commands.COMMANDS:
        walk(commands.load(name))
    return out


PARAMS = _params()


def _outcome(runtime, value, param, ctx):
    try:
        got = runtime.coerce(value, param=param, ctx=ctx)
        return ("value", type(got).__name__, repr(got))        # repr: nan equals nan
    except Exception as exc:  # the refusal: its type and message must be the same
        return ("error", type(exc).__name__, str(exc))


def test_most_parameters_take_the_plain_path():
    plain = [p for _, p in PARAMS if isinstance(p._runtime_param, values.PlainParam)]
    assert len(plain) >= 0.9 * len(PARAMS), [p.name for _, p in PARAMS
                                             if not isinstance(p._runtime_param,
                                                               values.PlainParam)]


@pytest.mark.parametrize("command, param", [
    pytest.param(c, p, id=f"{c.name}-{p.name}") for c, p in PARAMS
    if isinstance(p._runtime_param, values.PlainParam)])
def test_the_plain_coercion_is_typers(command, param, tmp_path):
    ctx = _click.Context(command)
    typers = build_runtime_param(param.type_descriptor)
    many = param.multiple or param.nargs == -1
    raws = [(v,) for v in RAW] + [tuple(RAW[:3]), ("table", "json"), ()] if many else RAW
    for raw in raws + [None]:
        assert _outcome(param._runtime_param, raw, param, ctx) == \
            _outcome(typers, raw, param, ctx), (param.name, raw)
