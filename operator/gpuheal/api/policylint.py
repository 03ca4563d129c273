"""Checks across a RemediationPolicy's rules: what a careful reviewer catches in a policy
written in a hurry, before anything runs.

Rules are tried in order and the first rule a signal matches decides (`policy.select.
rule_matches`), so a signal listed by two rules only ever reaches the first: the second
rule, or that part of it, can never fire. Each check here is written twice, as one CEL
expression that lists the problems in the user's words (the API server reports the first)
and as a Python function that yields the same messages in the same order (local files and
`model_validate` fail the same way).

The CEL walks bounded lists only and stays within the API server's cost budgets, estimated
when the CRD is created and counted when an object is checked (a policy at every bound is
accepted: tests/integration/test_crd_validation.py). That server's CEL has no `cel.bind`
(`[expr].map(name, ...)[0]` names a value computed once) and takes `string(int)` and
`filter(...).map(...)` as unbounded (`cel_int`, `map(x, keep, text)`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
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


# ---- CEL building blocks (r, q: rules; i, j: their indexes) ------------------------------
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


def _s(text: str) -> str:
    return cel_str(text)


def _let(name: str, value: str, expr: str) -> str:
    """CEL `expr` with `name` bound to `value` (computed once; the server has no cel.bind)."""
    return f"[{value}].map({name}, {expr})[0]"


_CLASS_INDEX = (
    "{"
    + ", ".join(
        f"{code}: {_CLASSES.index(e.action_class)}" for code, e in sorted(CATALOGUE.items())
    )
    + "}"
)
_CLASS_NAMES = "[" + ", ".join(f"'{c.value}'" for c in _CLASSES) + "]"
_UNKNOWN = _CLASSES.index(XidClass.UNKNOWN)


def _class_index(x: str) -> str:
    return f"({x} in {_CLASS_INDEX} ? {_CLASS_INDEX}[{x}] : {_UNKNOWN})"


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
    """One check over the whole rule list: `found` (CEL: is there a problem?), `first` (CEL:
    the first problem in words, built only when there is one), `problems` (Python: every
    problem, the first one first)."""

    name: str
    found: str
    first: str
    problems: Callable[[Sequence[Rule]], Iterator[str]]

    def cel(self) -> dict[str, JsonValue]:
        return check(f"!({self.found})", message_expression=self.first, field_path=".rules")


def _item_check(
    name: str,
    field: str,
    bad: Callable[[str, str], str],
    describe: Callable[[str, str], str],
    problems: Callable[[Sequence[Rule]], Iterator[str]],
    *,
    setup: tuple[str, str] | None = None,
) -> SpecCheck:
    """A check on the items of list `field` of each rule (index `i`): `bad(rule, item)` says
    whether an item is a problem, `describe(rule, item)` says it (CEL string). The first
    problem is the first bad item of the first rule that has one. `setup` binds a
    (name, value) for both. Only ints are bound (`i`, `k`): a string or object bound through
    a list literal loses its size in the cost estimate."""
    has_bad = f"has(r.signals.{field}) && r.signals.{field}.exists(x, {bad('r', 'x')})"
    found = f"self.rules.exists(i, r, {has_bad})"
    rule, items = "self.rules[i]", f"self.rules[i].signals.{field}"
    first = _let(
        "i",
        f"self.rules.transformList(i, r, {has_bad}, i)[0]",
        _let(
            "k",
            f"{items}.transformList(k, x, {bad(rule, 'x')}, k)[0]",
            describe(rule, f"{items}[k]"),
        ),
    )
    if setup is not None:
        found = _let(setup[0], setup[1], found)
        first = _let(setup[0], setup[1], first)
    return SpecCheck(name, found, first, problems)


def _earlier(field: str, x: str) -> str:
    """CEL: an earlier rule `q` (index `j`) lists `x` in `field` too."""
    return f"j < i && has(q.signals.{field}) && {x} in q.signals.{field}"


def _first_earlier(field: str, x: str) -> str:
    return f"self.rules.transformList(j, q, {_earlier(field, x)}, q.name)[0]"


def _xid_in_two_rules(rules: Sequence[Rule]) -> Iterator[str]:
    for i, r in enumerate(rules):
        for x in r.signals.xids:
            earlier = [q.name for q in rules[:i] if x in q.signals.xids]
            if x != RECOVERY_XID and earlier:
                yield _shadowed_py(f"XID {x}", earlier[0], r.name)


XID_IN_TWO_RULES = _item_check(
    "xid-in-two-rules",
    "xids",
    lambda r, x: f"{x} != {RECOVERY_XID} && self.rules.exists(j, q, {_earlier('xids', x)})",
    lambda r, x: _shadowed(f"{_s('XID ')} + {cel_int(x)}", _first_earlier("xids", x), f"{r}.name"),
    _xid_in_two_rules,
)


def _class_in_two_rules(rules: Sequence[Rule]) -> Iterator[str]:
    for i, r in enumerate(rules):
        for c in r.signals.xid_classes:
            earlier = [q.name for q in rules[:i] if c in q.signals.xid_classes]
            if c is not XidClass.RECOVERY_ACTION and earlier:
                yield _shadowed_py(f"XID class {c.value}", earlier[0], r.name)


CLASS_IN_TWO_RULES = _item_check(
    "class-in-two-rules",
    "xidClasses",
    lambda r, x: f"{x} != 'RecoveryAction' && self.rules.exists(j, q, {_earlier('xidClasses', x)})",
    lambda r, x: _shadowed(
        f"{_s('XID class ')} + {x}", _first_earlier("xidClasses", x), f"{r}.name"
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
                yield (
                    f"XID {x} of rule {r.name} is in class {c.value}, which rule "
                    f"{rules[j].name} above it takes: {r.name} would never see it; move "
                    f"{r.name} above {rules[j].name} to treat XID {x} differently"
                )


def _after_class() -> SpecCheck:
    # firsts[c]: the index of the first rule that lists class c (32: none).
    firsts = (
        f"lists.range({len(_CLASSES)}).map(c, [self.rules.transformList(j, q, "
        f"{_CLASS_NAMES}[c] in {_classes('q')}, j)].map(l, size(l) > 0 ? l[0] : 32)[0])"
    )

    def text(r: str, x: str) -> str:
        cls = _class_index(x)
        first = f"self.rules[firsts[{cls}]].name"
        return (
            f"{_s('XID ')} + {cel_int(x)} + {_s(' of rule ')} + {r}.name + "
            f"{_s(' is in class ')} + {_CLASS_NAMES}[{cls}] + {_s(', which rule ')} + {first} + "
            f"{_s(' above it takes: ')} + {r}.name + {_s(' would never see it; move ')} + "
            f"{r}.name + {_s(' above ')} + {first} + {_s(' to treat XID ')} + {cel_int(x)} + "
            f"{_s(' differently')}"
        )

    return _item_check(
        "xid-after-its-class",
        "xids",
        lambda r, x: f"{x} != {RECOVERY_XID} && firsts[{_class_index(x)}] < i",
        text,
        _xid_after_its_class,
        setup=("firsts", firsts),
    )


XID_AFTER_ITS_CLASS = _after_class()


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
                break
            shared = [a for a in r.signals.recovery_actions if a in q.signals.recovery_actions]
            if shared:
                yield _shadowed_py(
                    f"XID 154 with recovery action {shared[0].value}", q.name, r.name
                )
                break


def _takes_all_154_py(first: str, later: str) -> str:
    return (
        f"rule {first} takes every XID 154 (it lists no recoveryActions), so rule {later} "
        f"below it would never see one: give {first} the recoveryActions it is for"
    )


def _recovery_overlap_check() -> SpecCheck:
    def overlap(r: str, q: str) -> str:
        return (
            f"{_matches_154(q)} && (size({_actions(q)}) == 0 || "
            f"{_actions(r)}.exists(a, a in {_actions(q)}))"
        )

    has_bad = f"{_matches_154('r')} && self.rules.exists(j, q, j < i && {overlap('r', 'q')})"
    r, q = "self.rules[i]", "self.rules[j]"
    all_154 = (
        f"{_s('rule ')} + {q}.name + "
        f"{_s(' takes every XID 154 (it lists no recoveryActions), so rule ')} + {r}.name + "
        f"{_s(' below it would never see one: give ')} + {q}.name + "
        f"{_s(' the recoveryActions it is for')}"
    )
    shared = f"{_actions(r)}.filter(a, a in {_actions(q)})[0]"
    one = _shadowed(f"{_s('XID 154 with recovery action ')} + {shared}", f"{q}.name", f"{r}.name")
    first = _let(
        "i",
        f"self.rules.transformList(i, r, {has_bad}, i)[0]",
        _let(
            "j",
            f"self.rules.transformList(j, q, j < i && {overlap(r, 'q')}, j)[0]",
            f"size({_actions(q)}) == 0 ? {all_154} : {one}",
        ),
    )
    return SpecCheck(
        "recovery-action-overlap",
        f"self.rules.exists(i, r, {has_bad})",
        first,
        _recovery_overlap,
    )


RECOVERY_OVERLAP = _recovery_overlap_check()


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


def _text_check(
    name: str,
    field: str,
    *,
    text: str,
    flag: str,
    pair: str,
    describe: Callable[[str, str, str], str],
    problems: Callable[[Sequence[Rule]], Iterator[str]],
    keep: str = "true",
) -> SpecCheck:
    """Problems among the `field` items (`e`) of all rules: `text` per kept item, `flag` one
    character; adjacent sorted keys `v`, `w` for which `pair` holds are described."""
    key = f"{text} + '@' + {_IDX}[i] + {flag}"
    keys = (
        f"self.rules.transformList(i, r, has(r.signals.{field}), "
        f"r.signals.{field}.map(e, {keep}, {key}).distinct()).flatten().sort()"
    )
    adjacent = f"k + 1 < size(s) && [s[k + 1]].all(w, {_head('v')} == {_head('w')} && {pair})"
    found = _let("s", keys, f"s.exists(k, v, {adjacent})")
    # The text comes from `v` iterating `s` (an indexed element of a bound list has no size
    # in the estimate); only the first pair's message is built.
    text = describe(
        _head("v"), f"self.rules[{_index('v')}].name", f"self.rules[{_index('s[n + 1]')}].name"
    )
    first = _let(
        "s",
        keys,
        _let(
            "k",
            f"s.transformList(k, v, {adjacent}, k)[0]",
            f"s.transformList(n, v, n == k, {text})[0]",
        ),
    )
    return SpecCheck(name, found, first, problems)


def _text_pairs(keys: list[tuple[str, int, str]]) -> Iterator[tuple[str, int, str, int, str]]:
    """The Python side of `_text_check`: (text, index, flag) keys, distinct per rule,
    sorted as CEL sorts the encoded strings, adjacent pairs with equal texts."""
    encoded = sorted({f"{t}@{i:02d}{f}" for t, i, f in keys})
    for v, w in itertools.pairwise(encoded):
        if v[:-4] == w[:-4]:
            yield v[:-4], int(v[-3:-1]), v[-1], int(w[-3:-1]), w[-1]


def _in_two_rules(
    name: str,
    field: str,
    what: str,
    *,
    text: str,
    texts: Callable[[Rule], Iterable[str]],
    keep: str = "true",
) -> SpecCheck:
    """The same `what` (its `text` in CEL, `texts` of a rule in Python) among the `field`
    items of two rules: the later rule never sees it."""

    def problems(rules: Sequence[Rule]) -> Iterator[str]:
        keys = [(t, i, "-") for i, r in enumerate(rules) for t in texts(r)]
        for t, i, _, j, _ in _text_pairs(keys):
            if i != j:
                yield _shadowed_py(f"{what} {t}", rules[i].name, rules[j].name)

    return _text_check(
        name,
        field,
        keep=keep,
        text=text,
        flag="'-'",
        pair=f"{_index('v')} != {_index('w')}",
        describe=lambda t, a, b: _shadowed(f"{_s(what + ' ')} + {t}", a, b),
        problems=problems,
    )


CONDITION_IN_TWO_RULES = _in_two_rules(
    "condition-in-two-rules",
    "conditions",
    "condition",
    keep="has(e.status)",
    text="e.type + ' with status ' + e.status",
    texts=lambda r: [f"{c.type} with status {c.status.value}" for c in r.signals.conditions],
)


def _event_text(reason: str, message_contains: str | None) -> str:
    if message_contains is None:
        return reason
    return f"{reason} with messageContains '{message_contains}'"


EVENT_IN_TWO_RULES = _in_two_rules(
    "event-in-two-rules",
    "events",
    "Event reason",
    text="e.reason + (has(e.messageContains) ? ' with messageContains \\'' + e.messageContains "
    "+ '\\'' : '')",
    texts=lambda r: [_event_text(e.reason, e.message_contains) for e in r.signals.events],
)


def _event_after_catch_all(rules: Sequence[Rule]) -> Iterator[str]:
    keys = []
    for i, r in enumerate(rules):
        plain = {e.reason for e in r.signals.events if e.message_contains is None}
        keys += [(e.reason, i, "0" if e.reason in plain else "1") for e in r.signals.events]
    for reason, i, flag, j, _ in _text_pairs(keys):
        if i < j and flag == "0":
            yield (
                f"rule {rules[i].name} takes every Event with reason {reason} (it names no "
                f"messageContains), so rule {rules[j].name} below it would never see one"
            )


EVENT_AFTER_CATCH_ALL = _text_check(
    "event-after-catch-all",
    "events",
    text="e.reason",
    flag="(r.signals.events.exists(d, d.reason == e.reason && !has(d.messageContains)) "
    "? '0' : '1')",
    pair=f"{_index('v')} < {_index('w')} && {_flag('v')} == '0'",
    describe=lambda reason, a, b: (
        f"{_s('rule ')} + {a} + {_s(' takes every Event with reason ')} + {reason} + "
        f"{_s(' (it names no messageContains), so rule ')} + {b} + "
        f"{_s(' below it would never see one')}"
    ),
    problems=_event_after_catch_all,
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
