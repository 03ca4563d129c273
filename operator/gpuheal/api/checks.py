"""Checks across a RemediationPolicy's rules: what a careful reviewer catches in a policy
written in a hurry, before anything runs.

Rules are tried in order and the first rule a signal matches decides (`policy.select.
rule_matches`), so a signal listed by two rules only ever reaches the first: the second
rule, or that part of it, can never fire. Each check here is written twice, as one CEL
expression that lists the problems in the user's words (the API server reports the first)
and as a Python function that yields the same messages in the same order (local files and
`model_validate` fail the same way). The CEL walks bounded lists only and, where a plain
pairwise walk would cost too much for the API server's estimate, sorts encoded integers
(`value * 32 + rule index`) so that duplicates sit side by side. The API server's CEL has
no `cel.bind`: `[expr].map(name, ...)[0]` names a value computed once.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from pydantic import JsonValue

from gpuheal.api.meta import cel_int, cel_str, check
from gpuheal.xid.catalogue import CATALOGUE
from gpuheal.xid.types import XidClass

if TYPE_CHECKING:
    from gpuheal.api.remediationpolicy import RemediationPolicySpec, Rule

RECOVERY_XID = 154
MAX_RULES = 32  # RemediationPolicySpec.rules max_length: the index fits below it
_CLASSES = tuple(XidClass)


def class_of(xid: int) -> XidClass:
    entry = CATALOGUE.get(xid)
    return entry.action_class if entry is not None else XidClass.UNKNOWN


# ---- CEL building blocks (r: a rule) -----------------------------------------------------
def _list(rule: str, field: str) -> str:
    return f"(has({rule}.signals.{field}) ? {rule}.signals.{field} : [])"


def _xids(r: str) -> str:
    return _list(r, "xids")


def _classes(r: str) -> str:
    return _list(r, "xidClasses")


def _actions(r: str) -> str:
    return _list(r, "recoveryActions")


def _matches_154(r: str) -> str:
    return f"({RECOVERY_XID} in {_xids(r)} || 'RecoveryAction' in {_classes(r)})"


_CLASS_INDEX = (
    "{"
    + ", ".join(
        f"{code}: {_CLASSES.index(e.action_class)}" for code, e in sorted(CATALOGUE.items())
    )
    + "}"
)
_CLASS_NAMES = "[" + ", ".join(f"'{c.value}'" for c in _CLASSES) + "]"
_CLASS_NUMBERS = "{" + ", ".join(f"'{c.value}': {n}" for n, c in enumerate(_CLASSES)) + "}"
_UNKNOWN = _CLASSES.index(XidClass.UNKNOWN)


def _class_index(x: str) -> str:
    return f"({x} in {_CLASS_INDEX} ? {_CLASS_INDEX}[{x}] : {_UNKNOWN})"


def _pairs_sorted(encoded: str, describe: Callable[[str, str, str], str]) -> str:
    """Problems where one value is listed by two rules: `encoded` is the list of
    `value * 32 + rule index` (each value once per rule); sorted, a value listed by two rules
    sits next to itself; `describe(value, first rule, later rule)` is a CEL string."""
    first, later = "self.rules[v % 32].name", "self.rules[s[k + 1] % 32].name"
    return (
        f"[{encoded}.sort()].map(s, s.transformList(k, v, "
        f"k + 1 < size(s) && v / 32 == s[k + 1] / 32, {describe('v / 32', first, later)}))[0]"
    )


def _s(text: str) -> str:
    return cel_str(text)


def _shadowed(what: str, first: str, later: str) -> str:
    """CEL: '<what> is listed by rules <first> and <later>: ...'."""
    return (
        f"{what} + {_s(' is listed by rules ')} + {first} + {_s(' and ')} + {later} + "
        f"{_s(': rules are tried in order, so ')} + {later} + {_s(' would never see it')}"
    )


def _shadowed_py(what: str, first: str, later: str) -> str:
    return (
        f"{what} is listed by rules {first} and {later}: rules are tried in order, "
        f"so {later} would never see it"
    )


# ---- the checks --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SpecCheck:
    """One check over the whole rule list: CEL listing the problems, Python yielding them."""

    name: str
    problems_cel: str
    problems: Callable[[Sequence[Rule]], Iterator[str]]

    def cel(self) -> dict[str, JsonValue]:
        return check(
            f"size({self.problems_cel}) == 0",
            message_expression=f"{self.problems_cel}[0]",
            field_path=".rules",
        )


def _xid_in_two_rules(rules: Sequence[Rule]) -> Iterator[str]:
    pairs = sorted(
        (x, i)
        for i, r in enumerate(rules)
        for x in dict.fromkeys(r.signals.xids)
        if x != RECOVERY_XID
    )
    for (x, i), (y, j) in itertools.pairwise(pairs):
        if x == y:
            yield _shadowed_py(f"XID {x}", rules[i].name, rules[j].name)


XID_IN_TWO_RULES = SpecCheck(
    "xid-in-two-rules",
    _pairs_sorted(
        f"self.rules.transformList(i, r, {_xids('r')}.filter(x, x != {RECOVERY_XID})"
        ".distinct().map(x, x * 32 + i)).flatten()",
        lambda v, a, b: _shadowed(f"{_s('XID ')} + {cel_int(v)}", a, b),
    ),
    _xid_in_two_rules,
)


def _class_in_two_rules(rules: Sequence[Rule]) -> Iterator[str]:
    pairs = sorted(
        (_CLASSES.index(c), i)
        for i, r in enumerate(rules)
        for c in dict.fromkeys(r.signals.xid_classes)
        if c is not XidClass.RECOVERY_ACTION
    )
    for (c, i), (d, j) in itertools.pairwise(pairs):
        if c == d:
            yield _shadowed_py(f"XID class {_CLASSES[c].value}", rules[i].name, rules[j].name)


CLASS_IN_TWO_RULES = SpecCheck(
    "class-in-two-rules",
    _pairs_sorted(
        f"self.rules.transformList(i, r, {_classes('r')}.filter(c, c != 'RecoveryAction')"
        f".distinct().map(c, {_CLASS_NUMBERS}[c] * 32 + i)).flatten()",
        lambda v, a, b: _shadowed(f"{_s('XID class ')} + {_CLASS_NAMES}[{v}]", a, b),
    ),
    _class_in_two_rules,
)


def _xid_after_its_class(rules: Sequence[Rule]) -> Iterator[str]:
    first: dict[XidClass, int] = {}
    for i, r in enumerate(rules):
        for c in r.signals.xid_classes:
            first.setdefault(c, i)
    for i, r in enumerate(rules):
        for x in r.signals.xids:
            c = class_of(x)
            j = first.get(c, MAX_RULES)
            if x != RECOVERY_XID and j < i:
                yield _after_class_py(x, c, rules[j].name, r.name)


def _after_class_py(x: int, c: XidClass, first: str, later: str) -> str:
    return (
        f"XID {x} of rule {later} is in class {c.value}, which rule {first} above it takes: "
        f"{later} would never see it; move {later} above {first} to treat XID {x} differently"
    )


def _after_class_cel() -> str:
    # firsts[c]: the index of the first rule that lists class c (32: none).
    firsts = (
        f"lists.range({len(_CLASSES)}).map(c, [self.rules.transformList(j, q, "
        f"{_CLASS_NAMES}[c] in {_classes('q')}, j)].map(l, size(l) > 0 ? l[0] : 32)[0])"
    )
    cls = _class_index("x")
    first = f"self.rules[firsts[{cls}]].name"
    text = (
        f"{_s('XID ')} + {cel_int('x')} + {_s(' of rule ')} + r.name + {_s(' is in class ')} + "
        f"{_CLASS_NAMES}[{cls}] + {_s(', which rule ')} + {first} + "
        f"{_s(' above it takes: ')} + r.name + {_s(' would never see it; move ')} + r.name + "
        f"{_s(' above ')} + {first} + {_s(' to treat XID ')} + {cel_int('x')} + "
        f"{_s(' differently')}"
    )
    return (
        f"[{firsts}].map(firsts, self.rules.transformList(i, r, {_xids('r')}"
        f".map(x, x != {RECOVERY_XID} && firsts[{cls}] < i, {text})).flatten())[0]"
    )


XID_AFTER_ITS_CLASS = SpecCheck("xid-after-its-class", _after_class_cel(), _xid_after_its_class)


def _matches_154_py(r: Rule) -> bool:
    return RECOVERY_XID in r.signals.xids or XidClass.RECOVERY_ACTION in r.signals.xid_classes


def _recovery_overlap(rules: Sequence[Rule]) -> Iterator[str]:
    for i, r in enumerate(rules):
        if not _matches_154_py(r):
            continue
        for q in rules[:i]:
            if not _matches_154_py(q):
                continue
            if not q.signals.recovery_actions:
                yield _takes_all_154_py(q.name, r.name)
                continue
            shared = [a for a in r.signals.recovery_actions if a in q.signals.recovery_actions]
            if shared:
                yield _shadowed_py(
                    f"XID 154 with recovery action {shared[0].value}", q.name, r.name
                )


def _takes_all_154_py(first: str, later: str) -> str:
    return (
        f"rule {first} takes every XID 154 (it lists no recoveryActions), so rule {later} "
        f"below it would never see one: give {first} the recoveryActions it is for"
    )


def _recovery_overlap_cel() -> str:
    all_154 = (
        f"{_s('rule ')} + q.name + "
        f"{_s(' takes every XID 154 (it lists no recoveryActions), so rule ')} + r.name + "
        f"{_s(' below it would never see one: give ')} + q.name + "
        f"{_s(' the recoveryActions it is for')}"
    )
    shared = f"{_actions('r')}.filter(a, a in {_actions('q')})[0]"
    one = _shadowed(f"{_s('XID 154 with recovery action ')} + {shared}", "q.name", "r.name")
    return (
        f"self.rules.transformList(i, r, {_matches_154('r')} ? self.rules.transformList(j, q, "
        f"j < i && {_matches_154('q')} && (size({_actions('q')}) == 0 || "
        f"{_actions('r')}.exists(a, a in {_actions('q')})), "
        f"size({_actions('q')}) == 0 ? {all_154} : {one}) : []).flatten()"
    )


RECOVERY_OVERLAP = SpecCheck("recovery-action-overlap", _recovery_overlap_cel(), _recovery_overlap)


# Conditions and Events are compared by text, and a pairwise walk over texts costs too much
# for the API server's estimate: each rule's keys become `<text>@<rule index, 2 digits><flag>`,
# sorted, so that equal texts of different rules sit side by side.
_IDX = "[" + ", ".join(f"'{i:02d}'" for i in range(MAX_RULES)) + "]"


def _head(v: str) -> str:
    return f"{v}.substring(0, size({v}) - 4)"


def _index(v: str) -> str:
    return f"int({v}.substring(size({v}) - 3, size({v}) - 1))"


def _flag(v: str) -> str:
    return f"{v}.substring(size({v}) - 1)"


def _sorted_texts(
    field: str,
    *,
    keep: str,
    text: str,
    flag: str,
    pair: str,
    describe: Callable[[str, str, str], str],
) -> str:
    """Problems among the `field` items (`e`) of all rules: `text` per kept item, `flag` one
    character; adjacent sorted keys `v`, `w` for which `pair` holds are described."""
    key = f"{text} + '@' + {_IDX}[i] + {flag}"
    keys = (
        f"self.rules.transformList(i, r, has(r.signals.{field}), "
        f"r.signals.{field}.map(e, {keep}, {key}).distinct()).flatten().sort()"
    )
    first, later = f"self.rules[{_index('v')}].name", f"self.rules[{_index('w')}].name"
    return (
        f"[{keys}].map(s, s.transformList(k, v, k + 1 < size(s) && "
        f"[s[k + 1]].all(w, {_head('v')} == {_head('w')} && {pair}), "
        f"[s[k + 1]].map(w, {describe(_head('v'), first, later)})[0]))[0]"
    )


def _text_pairs(keys: list[tuple[str, int, str]]) -> Iterator[tuple[str, int, str, int, str]]:
    """The Python side of `_sorted_texts`: (text, index, flag) keys, distinct per rule,
    sorted as CEL sorts the encoded strings, adjacent pairs with equal texts."""
    encoded = sorted({f"{t}@{i:02d}{f}" for t, i, f in keys})
    for v, w in itertools.pairwise(encoded):
        if v[:-4] == w[:-4]:
            yield v[:-4], int(v[-3:-1]), v[-1], int(w[-3:-1]), w[-1]


def _condition_in_two_rules(rules: Sequence[Rule]) -> Iterator[str]:
    keys = [
        (f"{c.type} with status {c.status.value}", i, "-")
        for i, r in enumerate(rules)
        for c in r.signals.conditions
    ]
    for text, i, _, j, _ in _text_pairs(keys):
        if i != j:
            yield _shadowed_py(f"condition {text}", rules[i].name, rules[j].name)


CONDITION_IN_TWO_RULES = SpecCheck(
    "condition-in-two-rules",
    _sorted_texts(
        "conditions",
        keep="has(e.status)",
        text="e.type + ' with status ' + e.status",
        flag="'-'",
        pair=f"{_index('v')} != {_index('w')}",
        describe=lambda text, a, b: _shadowed(f"{_s('condition ')} + {text}", a, b),
    ),
    _condition_in_two_rules,
)


def _event_text(reason: str, message_contains: str | None) -> str:
    if message_contains is None:
        return reason
    return f"{reason} with messageContains '{message_contains}'"


def _event_in_two_rules(rules: Sequence[Rule]) -> Iterator[str]:
    keys = [
        (_event_text(e.reason, e.message_contains), i, "-")
        for i, r in enumerate(rules)
        for e in r.signals.events
    ]
    for text, i, _, j, _ in _text_pairs(keys):
        if i != j:
            yield _shadowed_py(f"Event reason {text}", rules[i].name, rules[j].name)


EVENT_IN_TWO_RULES = SpecCheck(
    "event-in-two-rules",
    _sorted_texts(
        "events",
        keep="true",
        text="e.reason + (has(e.messageContains) ? ' with messageContains \\'' + e.messageContains "
        "+ '\\'' : '')",
        flag="'-'",
        pair=f"{_index('v')} != {_index('w')}",
        describe=lambda text, a, b: _shadowed(f"{_s('Event reason ')} + {text}", a, b),
    ),
    _event_in_two_rules,
)


def _takes_every_event_py(reason: str, first: str, later: str) -> str:
    return (
        f"rule {first} takes every Event with reason {reason} (it names no messageContains), "
        f"so rule {later} below it would never see one"
    )


def _event_after_catch_all(rules: Sequence[Rule]) -> Iterator[str]:
    keys = []
    for i, r in enumerate(rules):
        plain = {e.reason for e in r.signals.events if e.message_contains is None}
        keys += [(e.reason, i, "0" if e.reason in plain else "1") for e in r.signals.events]
    for reason, i, flag, j, _ in _text_pairs(keys):
        if i < j and flag == "0":
            yield _takes_every_event_py(reason, rules[i].name, rules[j].name)


EVENT_AFTER_CATCH_ALL = SpecCheck(
    "event-after-catch-all",
    _sorted_texts(
        "events",
        keep="true",
        text="e.reason",
        flag="(r.signals.events.exists(d, d.reason == e.reason && !has(d.messageContains)) "
        "? '0' : '1')",
        pair=f"{_index('v')} < {_index('w')} && {_flag('v')} == '0'",
        describe=lambda reason, a, b: (
            f"{_s('rule ')} + {a} + {_s(' takes every Event with reason ')} + {reason} + "
            f"{_s(' (it names no messageContains), so rule ')} + {b} + "
            f"{_s(' below it would never see one')}"
        ),
    ),
    _event_after_catch_all,
)

SPEC_CHECKS = (
    XID_IN_TWO_RULES,
    CLASS_IN_TWO_RULES,
    XID_AFTER_ITS_CLASS,
    RECOVERY_OVERLAP,
    CONDITION_IN_TWO_RULES,
    EVENT_IN_TWO_RULES,
    EVENT_AFTER_CATCH_ALL,
)


def check_spec(spec: RemediationPolicySpec) -> None:
    """The Python mirror of `SPEC_CHECKS`: raise the first problem, as the API server would."""
    for item in SPEC_CHECKS:
        problem = next(item.problems(spec.rules), None)
        if problem is not None:
            raise ValueError(problem)
