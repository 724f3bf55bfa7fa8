"""The operator's overrides of a plan's ``let`` values (``--let NAME=EXPR``, ``WARMUP_LET``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from warmup.errors import PlanError
from warmup.plan import expr as E
from warmup.plan.facts import FACT_NAMES
from warmup.plan.model import Located, Plan, Size


def with_lets(plan: Plan, overrides: Iterable[tuple[str, str]], *,
              source: str = "WARMUP_LET") -> Plan:
    """``plan`` with some of its ``let`` values replaced by the operator's expressions (``serve
    --let``, ``WARMUP_LET``), each checked as the plan's own would be: it may use the server's
    facts and the lets defined before it.  A name the plan does not define is refused."""
    overrides = list(overrides)
    if not overrides:
        return plan
    defined = [name for name, _ in plan.let]
    lets = dict(plan.let)
    for name, text in overrides:
        if name not in lets:
            raise PlanError(f"{source}: {name}: the plan {plan.name} defines no let {name!r}",
                            hint="its lets: " + (", ".join(defined) or "none"))
        names = frozenset(FACT_NAMES) | frozenset(defined[:defined.index(name)])
        try:
            parsed = E.parse(text, names)
        except E.ExprSyntaxError as exc:
            raise PlanError(f"{source}: {name}={text}: {exc}",
                            hint="an integer expression over server facts and the plan's "
                                 "earlier lets") from None
        lets[name] = Size(parsed, Located(source, 0, f"let.{name}"))
    return replace(plan, let=tuple((name, lets[name]) for name in defined))
