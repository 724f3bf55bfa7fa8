"""The values of our options, turned into Python values without pydantic when they are plain.

Typer 0.29 coerces every parameter's value through a pydantic ``TypeAdapter``, built when the
command runs: importing pydantic and building the adapters costs 0.1-0.2 s on every command,
more than the rest of a ``cache`` command's start-up.  :func:`speed_up` gives each parameter of
a command a coercion that takes the plain case itself (a text for a ``str``, a ``Path``, digits
for an ``int``, a number for a ``float``, one of a ``Literal``'s values, lists of those) and
hands anything else to typer's own coercion, pydantic and all: every value is accepted or
refused exactly as typer does it, with typer's messages (``tests/warmup/cli/test_values.py``
holds the two to the same results).  Where typer's internals are not the ones this was written
against, nothing is changed: the commands are then only slower.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Optional, get_args, get_origin

try:  # typer 0.29's coercion: every parameter's value goes through a RuntimeParam
    from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
    from typer._param_types import coerce_cli_path
    from typer.core import _TyperParameter
except ImportError:  # another typer: leave its coercion alone
    RuntimeParam = None  # type: ignore[assignment,misc]

#: a value that the plain coercion leaves to typer's
_TYPERS = object()
_DIGITS = re.compile(r"[0-9]{1,18}")
_DECIMAL = re.compile(r"[0-9]{1,15}(?:\.[0-9]{0,15})?")


#: the plain coercion of one value: (value, param, ctx) -> the value, or _TYPERS
Plain = Callable[[Any, Any, Any], Any]


def _text(value: Any, param: Any, ctx: Any) -> Any:
    return value if isinstance(value, str) else _TYPERS


def _flag(value: Any, param: Any, ctx: Any) -> Any:
    return value if type(value) is bool else _TYPERS


def _int(value: Any, param: Any, ctx: Any) -> Any:
    if type(value) is int:
        return value
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    return _TYPERS


def _float(value: Any, param: Any, ctx: Any) -> Any:
    if type(value) in (int, float):
        return float(value)
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return float(value)
    return _TYPERS


def _bounded(convert: Plain, low: Any, high: Any) -> Plain:
    """``convert``, and a value out of ``[low, high]`` left to typer (which refuses it)."""
    def coerce(value: Any, param: Any, ctx: Any) -> Any:
        got = convert(value, param, ctx)
        if got is _TYPERS or (low is not None and got < low) or \
                (high is not None and got > high):
            return _TYPERS
        return got
    return coerce


def _choice(choices: tuple[str, ...]) -> Plain:
    def coerce(value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and value in choices and \
                (ctx is None or ctx.token_normalize_func is None):
            return value
        return _TYPERS
    return coerce


def _path(info: Any) -> Plain:
    """typer's own path checks (``coerce_cli_path``), given a ``Path`` instead of a text (for
    which it builds a pydantic adapter to make one)."""
    def coerce(value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and value:
            value = Path(value)
        elif not isinstance(value, Path):
            return _TYPERS
        return coerce_cli_path(value, info, path_type=Path, param=param, ctx=ctx)
    return coerce


def _leaf(annotation: Any, info: Any) -> Optional[Plain]:
    """The plain coercion of one value of ``annotation``; None when typer's must do it."""
    if info.parser is not None:
        return None
    if annotation is str:
        return _text
    if annotation is bool:
        return _flag
    if annotation is int and not info.clamp:
        return _bounded(_int, info.min, info.max)
    if annotation is float and not info.clamp:
        return _bounded(_float, info.min, info.max)
    if annotation is Path and info.path_type is None:
        return _path(info)
    if get_origin(annotation) is Literal:
        choices = get_args(annotation)
        if info.case_sensitive and all(isinstance(c, str) for c in choices):
            return _choice(choices)
    return None


def _plain(annotation: Any, info: Any) -> Optional[Plain]:
    """The plain coercion of a parameter's value (a list of leaves for ``List[X]``)."""
    if get_origin(annotation) is not list:
        return _leaf(annotation, info)
    (item,) = get_args(annotation) or (None,)
    leaf = _leaf(item, info)
    if leaf is None:
        return None

    def many(value: Any, param: Any, ctx: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            return _TYPERS
        out = [leaf(v, param, ctx) for v in value]
        return _TYPERS if any(v is _TYPERS for v in out) else out
    return many


if RuntimeParam is not None:
    @dataclass(frozen=True)
    class PlainParam(RuntimeParam):
        """A parameter's coercion: the plain case here, anything else typer's."""

        descriptor: Any
        plain: Any

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            got = self.plain(value, param, ctx)
            if got is _TYPERS:
                return build_runtime_param(self.descriptor)._coerce_value(value, param, ctx)
            return got


def speed_up(command: Any) -> None:
    """Give every parameter of ``command`` and of its subcommands, ``--help`` included (made
    when first asked for), the plain coercion where it has one."""
    if RuntimeParam is None:
        return
    for param in getattr(command, "params", ()):
        _speed_up(param)
    made = getattr(command, "get_help_option", None)
    if made is not None:
        def get_help_option(ctx: Any) -> Any:
            option = made(ctx)
            if option is not None:
                _speed_up(option)
            return option
        command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        speed_up(sub)


def _speed_up(param: Any) -> None:
    descriptor = getattr(param, "type_descriptor", None)
    if not isinstance(param, _TyperParameter) or not isinstance(descriptor, TypeDescriptor) \
            or descriptor.file_annotation is not None or \
            getattr(param, "_runtime_param", "absent") is not None:
        return
    plain = _plain(descriptor.annotation, descriptor.parameter_info)
    if plain is not None:
        param._runtime_param = PlainParam(parameter_info=descriptor.parameter_info,
                                          annotation=descriptor.annotation,
                                          descriptor=descriptor, plain=plain)
