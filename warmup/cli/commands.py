"""The ``sglang-warmup`` app: every command and group in one table (name, module, one-line help),
and a click group that imports a command's module only when that command runs.

``import warmup.cli`` imported every command group (audit, learn, traffic, the archive
workers, ...) before it knew which one would run: a third of a second at every start, on a
``cache restore`` in an init container too.  Here the root group lists its commands from
:data:`COMMANDS` (``--help`` imports none of them) and builds one when click resolves it, from
its module, with typer (``typer.main.get_command``) exactly as it was registered before; a
group builds its own commands the same way, one when it is resolved (``_Subgroup``); their
parameters then coerce plain values without pydantic (``values.speed_up``).

Help is click's plain text (``rich_markup_mode=None``): rich's import alone took 0.1 s of
every ``--help``.
"""

from __future__ import annotations

import copy
import importlib
from typing import Any, NamedTuple

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from warmup import cli
from warmup.cli import values

#: ``serve`` and ``prebake`` pass everything after ``--`` to SGLang unparsed.
_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


class Command(NamedTuple):
    """One entry of the table: where the command is and what the root's ``--help`` says."""

    module: str
    #: a ``typer.Typer`` (a group) or the command's function
    attribute: str
    #: the first paragraph of the command's help (its docstring's, or ``registered`` help)
    help: str
    #: the command's help is ``help`` itself (else its function's docstring)
    registered: bool = False
    context_settings: Any = None


#: Every command and group, sorted; each module owns its commands' options.
COMMANDS: dict[str, Command] = {
    "audit": Command("warmup.cli.audit", "audit_command",
                     "Replay traffic twice on a ready server; name the step behind every "
                     "post-ready compile."),
    "cache": Command("warmup.cli.cache", "app",
                     "Persist, verify, relocate and share the JIT caches (pack, restore, push, "
                     "...).", registered=True),
    "coverage": Command("warmup.cli.coverage", "coverage_command",
                        "Show the compile keys per plan class and whether a second replay "
                        "compiled anything."),
    "doctor": Command("warmup.cli.doctor", "doctor_command",
                      "Check that compile events are hooked, phased and counted as they will "
                      "be in SGLang."),
    "learn": Command("warmup.cli.learn", "learn_command",
                     "Turn audited post-ready misses into plan classes (YAML, --diff or "
                     "--write)."),
    "patches": Command("warmup.cli.patches", "app",
                       "Report the prefill-graph fixes for the installed SGLang.",
                       registered=True),
    "plan": Command("warmup.cli.plan", "app", "Check and expand shape plans.", registered=True),
    "prebake": Command("warmup.cli.prebake", "prebake_command",
                       "Run SGLang once with a plan against empty caches and pack what it "
                       "compiled: prebake --plan P --out A -- <sglang args>", registered=True,
                       context_settings=_PASS_THROUGH),
    "report": Command("warmup.cli.report", "report_command",
                      "Render a saved report: a run report, an audit, a coverage record, or "
                      "any other JSON\ndocument sglang-warmup wrote (docs/data/*.json: its "
                      "fields and the reports it holds)."),
    "serve": Command("warmup.cli.serve", "serve_command",
                     "Run SGLang with a plan warmed before the port opens: serve --plan P -- "
                     "<sglang args>", registered=True, context_settings=_PASS_THROUGH),
    "sidecar": Command("warmup.cli.sidecar", "sidecar_command",
                       "Warm a server started by someone else over HTTP and gate readiness: "
                       "/ready /live /metrics /report", registered=True),
    "traffic": Command("warmup.cli.traffic", "app",
                       "Traffic samples to audit with: synth (synthetic), convert (from request "
                       "logs).", registered=True),
}


class _Listed:
    """What the root group holds for a command not built yet: enough for ``--help``."""


class _ListedCommand(_Listed, TyperCommand):
    pass


class _ListedGroup(_Listed, TyperGroup):
    pass


def load(name: str) -> Any:
    """The click command of ``name``, built by typer from its module as it was registered
    before, its parameters given the plain coercion.  A group's own commands are built when
    one of them is resolved, or all of them for its ``--help`` (``_Subgroup``)."""
    spec = COMMANDS[name]
    target = getattr(importlib.import_module(spec.module), spec.attribute)
    holder = typer.Typer(add_completion=False, rich_markup_mode=None)
    holder.callback()(_nothing)
    infos: list[Any] = []
    if isinstance(target, typer.Typer):
        if not target.registered_groups and not target.registered_callback:
            # Its commands are handed to the group below unbuilt (the group's copy has none:
            # typer would build them all, 10 ms for the cache group).
            infos = list(target.registered_commands)
            target = copy.copy(target)
            target.registered_commands = []
        holder.add_typer(target, name=name, help=spec.help if spec.registered else None,
                         cls=_Subgroup if infos else TyperGroup)
    else:
        holder.command(name, help=spec.help if spec.registered else None,
                       context_settings=spec.context_settings)(target)
    command = typer.main.get_command(holder).commands[name]  # type: ignore[attr-defined]
    values.speed_up(command)
    if infos:
        command.adopt(infos, holder.pretty_exceptions_short)
    return command


class _Subgroup(TyperGroup):
    """A command group (``cache``, ``plan``, ...) whose commands typer builds one at a time,
    when click resolves one, each as typer's own group would have built it
    (``typer.main.get_command_from_info``); its ``--help`` builds them all."""

    def adopt(self, infos: list[Any], pretty_exceptions_short: bool) -> None:
        self._infos = {}
        self._short = pretty_exceptions_short
        for info in infos:
            name = info.name or typer.main.get_command_name(info.callback.__name__)
            self._infos[name] = info
            self.commands[name] = _ListedCommand(name=name)     # its name, for suggestions

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = self.commands.get(cmd_name)
        if isinstance(command, _Listed):
            command = typer.main.get_command_from_info(
                self._infos[cmd_name], pretty_exceptions_short=self._short,
                rich_markup_mode=None)
            values.speed_up(command)
            self.commands[cmd_name] = command
        return command

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        for name in list(self.commands):
            self.get_command(ctx, name)
        super().format_commands(ctx, formatter)


def _nothing() -> None:
    """A callback, so that ``load``'s holder is a group."""


class LazyGroup(TyperGroup):
    """The root group: every command listed from the table, built on first use (``load``)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        values.speed_up(self)          # its own options (--version)
        self._listing = False
        for name, spec in COMMANDS.items():
            kind = _ListedGroup if spec.attribute == "app" else _ListedCommand
            self.commands.setdefault(name, kind(name=name, help=spec.help))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = self.commands.get(cmd_name)
        if isinstance(command, _Listed) and not self._listing:
            command = self.commands[cmd_name] = load(cmd_name)
        return command

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The commands and their one-line help, from the table (nothing imported)."""
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False


def _version(value: bool) -> None:
    if value:
        typer.echo(cli.version_line())
        raise typer.Exit()


app = typer.Typer(
    name=cli.PROG,
    help="Warm SGLang's JIT kernels before the server listens; persist and audit the caches.",
    cls=LazyGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="print the version of sglang-warmup and of the "
                                            "installed SGLang, and exit")) -> None:
    """Warm SGLang's JIT kernels before the server listens; persist and audit the caches."""
