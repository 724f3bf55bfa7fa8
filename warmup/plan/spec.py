"""The plan format's keys: one table drives the loader's validation and the JSON Schema, so
they cannot disagree."""

from __future__ import annotations

import re
from dataclasses import dataclass

from warmup.plan.model import (DEFAULT_MAX_REQUESTS, FEATURES, KINDS, MAX_REQUESTS_CEILING,
                               REQUEST_BOOL_FEATURES, REQUEST_FEATURES, REQUEST_INT_FEATURES)

#: A name in a plan (class, phase, variant): lower-case letters, digits and _.
IDENT = re.compile(r"^[a-z][a-z0-9_]{0,63}$")  # use fullmatch: $ also matches before "\n"
#: Class names the warm-up driver itself writes in the phase file (``warmup.observe.phase``'s
#: ``FLUSH`` and ``SGLANG_STARTUP``, a layer this one may not import; a test keeps them equal):
#: no plan class may take one, or the schedulers would take its steps for the driver's.
RESERVED_CLASSES = ("flush", "sglang_startup")


@dataclass(frozen=True)
class Field:
    """One key of a mapping: its type and whether it is required."""

    type: str  # int_expr | bool_expr | expr_list | expr_groups | range_or_list | ident | text
    #            | int | bool | kind | features | token_classes | variant_names | sampling
    required: bool = False
    doc: str = ""


TOP = {
    "version": Field("int", True, "plan format version; 1"),
    "name": Field("ident", True, "the plan's name; also its --warmups entry unless overridden"),
    "description": Field("text"),
    "let": Field("let", False, "named integer expressions over server facts, evaluated in order"),
    "defaults": Field("defaults"),
    "limits": Field("limits"),
    "sampling_variants": Field("sampling_variants", False, "extra sampling variants by name"),
    "flush": Field("bool", False, "flush the cache after the warm-up (default true)"),
    "phases": Field("phases", True),
}
DEFAULTS = {
    "sampling": Field("sampling", False, "alternate (greedy/default), or a variant name"),
    "max_new_tokens": Field("int", False, "tokens generated per prefill-shape request (default 1)"),
}
LIMITS = {"max_requests": Field("max_requests", False, f"expansion limit (default {DEFAULT_MAX_REQUESTS}, "
                                                f"at most {MAX_REQUESTS_CEILING})"),
          "over_limit": Field("over_limit", False, "skip (default: the classes past the limit are "
                                                   "skipped and named) or fail")}
PHASE = {
    "name": Field("ident", True),
    "shapes": Field("shapes", True),
}
SHAPE_COMMON = {
    "class": Field("ident", True, "shape class name, unique in the plan"),
    "kind": Field("kind", True, "how the class is produced: " + ", ".join(KINDS)),
    "why": Field("text", False, "why this class is a separate compile"),
    "when": Field("bool_expr", False, "condition over server facts; false skips the class"),
    "requires": Field("features", False, "server features the class needs: " + ", ".join(FEATURES)),
    "sampling": Field("sampling", False),
    "max_new_tokens": Field("int_expr", False),
    "request": Field("request", False, "request features for every request of the class: "
                     + ", ".join(REQUEST_FEATURES)),
    "family": Field("ident", False, "the family the class belongs to (default: its kind); a "
                    "user can turn a family off at launch"),
    "covers_up_to": Field("int_expr", False, "the longest prompt the class means to cover; "
                          "prompt lengths past its longest warmed one up to this are named as "
                          "not warmed (a cap the operator set, a server limit)"),
    "reaches": Field("int_expr", False, "the longest prompt the class's sizes stand for, when "
                     "they warm one size per kernel key and longer prompts meet only those keys "
                     "(default: its longest prompt); covers_up_to names the lengths past it"),
}
SHAPE_KIND = {
    "extend": {"lengths": Field("expr_list", True, "prompt lengths, each one forward (<= chunk)")},
    "chunked": {"lengths": Field("expr_list", True, "prompt lengths above chunked_prefill_size"),
                "chain": Field("bool", False, "each prompt starts with the previous prompts' "
                               "whole chunks, a radix hit: the server computes only its later "
                               "chunks, at the boundaries it meets alone (default false)")},
    "prefix": {"base": Field("int_expr", True, "prefix length (rounded up to whole pages)"),
               "extends": Field("expr_list", True, "new tokens after the cached prefix")},
    "long_context": {"prompt": Field("int_expr", True, "a prompt past the graph's context bucket"),
                     "extends": Field("expr_list", True, "extends on that prompt as a prefix")},
    "concurrent": {"groups": Field("expr_groups", True, "lists of prompt lengths sent at once")},
    "batch": {"batch_sizes": Field("range_or_list", True, "batch sizes: a list or {from, to}"),
              "tokens_per_request": Field("int_expr", False, "prompt length per item; may read bs"),
              "token_classes": Field("token_classes", False, "aligned (total % 16 == 0), odd")},
    "mixed": {"running": Field("expr_list", True, "numbers of decoding requests"),
              "prompt": Field("int_expr", True, "the prompt that joins them (> chunk)"),
              "decode_tokens": Field("int_expr", False)},
    "decode": {"batch_sizes": Field("range_or_list", True), "decode_tokens": Field("int_expr", False)},
    "sampling": {"variants": Field("variant_names", True), "prompt": Field("int_expr", True),
                 "decode_tokens": Field("int_expr", False),
                 "concurrency": Field("expr_list", False),
                 "mixed_prompt": Field("int_expr", False, "a second prompt length: at each "
                                       "concurrency a second step sends it in place of one "
                                       "prompt (alone at concurrency 1)")},
}
assert set(SHAPE_KIND) == set(KINDS)



REQUEST = {**{k: Field("int_expr0", False) for k in REQUEST_INT_FEATURES},
           **{k: Field("bool", False) for k in REQUEST_BOOL_FEATURES}}
