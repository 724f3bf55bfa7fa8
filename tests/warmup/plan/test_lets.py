"""warmup.plan.lets: an operator overrides a plan's let values; a cap left on a class with
``covers_up_to`` names the prompt lengths no longer warmed."""

from __future__ import annotations

import pytest

from warmup import settings
from warmup.errors import PlanError, WarmupError
from warmup.plan import loader
from warmup.plan.expand import expand
from warmup.plan.facts import ServerFacts
from warmup.plan.lets import with_lets

PLAN = """\
version: 1
name: capped
let:
  top: max_input_len - 8
  cap: top
phases:
  - name: p
    shapes:
      - class: long
        kind: extend
        lengths: [16, "min(cap, 1000)"]
        covers_up_to: top
"""


@pytest.fixture
def pr_like_facts() -> ServerFacts:
    import _facts_cache

    return _facts_cache.pr44627()


@pytest.fixture
def plan(tmp_path):
    p = tmp_path / "capped.yaml"
    p.write_text(PLAN)
    return loader.load(p)


def lengths(exp) -> list[int]:
    return [r.input_len for s in exp.steps for r in s.requests]


def test_an_override_replaces_the_value_and_the_gap_is_named(plan, pr_like_facts):
    exp = expand(plan, pr_like_facts)
    assert lengths(exp) == [16, 1000]
    [skip] = exp.skipped  # 1000 is below the context: the rest is named
    assert skip.item == f"1001..{pr_like_facts.max_input_len - 8}"
    capped = expand(with_lets(plan, [("cap", "100")]), pr_like_facts)
    assert lengths(capped) == [16, 100]
    assert capped.skipped[0].item == f"101..{pr_like_facts.max_input_len - 8}"
    assert "a cap in the plan or --let" in capped.skipped[0].reason


def test_an_override_may_use_facts_and_earlier_lets_only(plan):
    assert dict(with_lets(plan, [("cap", "top // 2")]).let)["cap"].expr.text == "top // 2"
    with pytest.raises(PlanError) as err:
        with_lets(plan, [("top", "cap")])
    assert "unknown name 'cap'" in err.value.message
    with pytest.raises(PlanError) as err:
        with_lets(plan, [("nope", "1")], source="--let")
    assert err.value.message == "--let: nope: the plan capped defines no let 'nope'"
    assert err.value.hint == "its lets: top, cap"
    assert with_lets(plan, []) is plan


@pytest.mark.parametrize("text, parsed", [
    ("long_cap=65536", (("long_cap", "65536"),)),
    ("a=min(1, 2); b = 3 ;", (("a", "min(1, 2)"), ("b", "3"))),
    ("", ()),
])
def test_the_variable(monkeypatch, text, parsed):
    monkeypatch.setenv("WARMUP_LET", text)
    assert settings.LETS.get() == parsed


def test_a_bad_variable_names_itself(monkeypatch):
    monkeypatch.setenv("WARMUP_LET", "long_cap")
    with pytest.raises(WarmupError) as err:
        settings.LETS.get()
    assert err.value.message == ("environment variable WARMUP_LET='long_cap': 'long_cap' is "
                                 "not NAME=EXPRESSION")


def test_reaches_stands_for_the_lengths_past_the_longest_prompt(tmp_path, pr_like_facts):
    """A class that warms one size per kernel key names as not warmed only the lengths past
    what its sizes stand for (``reaches``), never fewer than those past its longest prompt."""
    def plan(reaches: str):
        p = tmp_path / "reach.yaml"
        p.write_text(PLAN.replace("        covers_up_to: top\n",
                                  f"        covers_up_to: top\n        reaches: {reaches}\n"))
        return loader.load(p)

    top = pr_like_facts.max_input_len - 8
    assert expand(plan("cap + 5000"), pr_like_facts).skipped == ()  # it stands for the context
    capped = expand(with_lets(plan("cap + 5000"), [("cap", "2000")]), pr_like_facts)
    assert lengths(capped) == [16, 1000]
    assert capped.skipped[0].item == f"7001..{top}"
    short = expand(with_lets(plan("cap - 5000"), [("cap", "2000")]), pr_like_facts)
    assert short.skipped[0].item == f"1001..{top}"
