"""Shared building blocks of gpuheal's CRDs: API group, durations, selectors, conditions.

Everything here is pure data. The CRD schema is generated from these models (see `gen.py`),
so a constraint written once here is enforced twice: by the API server (OpenAPI + CEL) and by
pydantic when the operator parses an object.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import re
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Generic, Literal, TypeVar

from kube_custom_resource.schema import BaseModel
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic import (
    BaseModel as PydanticModel,
)

from gpuheal.api.names import GROUP

# Bounds: CEL cost estimation needs every list and string that a rule touches to be bounded.
MAX_NAME = 253
MAX_LABEL_KEY = 317  # 253 (prefix) + 1 + 63 (name)
MAX_LABEL_VALUE = 63
MAX_MESSAGE = 1024
MAX_DURATION = 32

# Go duration syntax restricted to what makes sense here (and what CEL's duration()
# understands): hours, minutes, seconds, milliseconds, each at most once, in that order, with
# at most 6 digits each. Days are deliberately absent: `24h` is unambiguous, `1d` is not valid
# Go. The digit bound keeps every duration far below the ~2.5 million hours where CEL's
# duration() fails with a protobuf conversion error instead of a message. `[.]` rather than
# `\.`: the pattern is also embedded in CEL string literals, where `\.` is not a valid escape.
# The empty string matches the pattern; `duration_ok` and `parse_duration` refuse it.
_PART = r"[0-9]{1,6}([.][0-9]{1,9})?"
DURATION_PATTERN = rf"^({_PART}h)?({_PART}m)?({_PART}s)?({_PART}ms)?$"
DURATION_MESSAGE = (
    "must be a duration such as 90s, 10m, 1h30m or 250ms "
    "(hours, minutes, seconds, milliseconds, in that order, up to 6 digits each; "
    "no days: 7d is 168h)"
)
_DURATION_RE = re.compile(DURATION_PATTERN)
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)


class DurationError(ValueError):
    """A string that is not a duration gpuheal understands."""


def parse_duration(text: str) -> dt.timedelta:
    """Parse a Go-style duration (`90s`, `10m`, `1h30m`, `1.5h`, `250ms`).

    Same grammar as the CRD pattern, so anything the API server accepted parses here.
    """
    if (
        not isinstance(text, str)
        or not text
        or len(text) > MAX_DURATION
        or not _DURATION_RE.match(text)
    ):
        raise DurationError(f"{text!r} {DURATION_MESSAGE}")
    seconds = sum(
        float(number) * _UNIT_SECONDS[unit] for number, unit in _DURATION_PART_RE.findall(text)
    )
    return dt.timedelta(seconds=seconds)


def format_duration(delta: dt.timedelta) -> str:
    """Inverse of `parse_duration` for whole seconds (`5400s` -> `1h30m`), used in messages."""
    total = int(delta.total_seconds())
    if total <= 0:
        return "0s"
    hours, rest = divmod(total, 3600)
    minutes, seconds = divmod(rest, 60)
    return "".join(f"{v}{unit}" for v, unit in ((hours, "h"), (minutes, "m"), (seconds, "s")) if v)


def parse_time(value: Any) -> dt.datetime | None:
    """An RFC 3339 timestamp as the API server writes it, or None (total: any input)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def rfc3339(ts: dt.datetime) -> str:
    return ts.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_ms(ts: dt.datetime) -> str:
    """RFC 3339 with milliseconds (timelines: steps often take less than a second)."""
    return ts.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _check_duration(text: str) -> str:
    parse_duration(text)
    return text


def _check_positive_duration(text: str) -> str:
    if parse_duration(text) <= dt.timedelta(0):
        raise DurationError(f"{text!r} {_POSITIVE_MESSAGE}")
    return text


def duration_ok(expr: str) -> str:
    """CEL: `expr` is a duration `parse_duration` accepts. Guard every `duration()` call with
    it, so a malformed value gets the one readable message of its field instead of a second,
    confusing "evaluation error"."""
    return f"({expr} != '' && {expr}.matches('{DURATION_PATTERN}'))"


_POSITIVE_MESSAGE = "must be a positive duration such as 30s, 10m or 24h"
_DURATION_RULE = {"rule": duration_ok("self"), "message": DURATION_MESSAGE}
_POSITIVE_RULE = {
    "rule": f"!{duration_ok('self')} || duration(self) > duration('0s')",
    "message": _POSITIVE_MESSAGE,
}

Duration = Annotated[
    str,
    Field(
        max_length=MAX_DURATION, json_schema_extra={"x-kubernetes-validations": [_DURATION_RULE]}
    ),
    AfterValidator(_check_duration),
]
"""A Go duration, zero allowed (`0s`)."""

PositiveDuration = Annotated[
    str,
    Field(
        max_length=MAX_DURATION,
        json_schema_extra={"x-kubernetes-validations": [_DURATION_RULE, _POSITIVE_RULE]},
    ),
    AfterValidator(_check_positive_duration),
]
"""A Go duration longer than zero (windows, timeouts, hysteresis)."""

PERCENT_PATTERN = r"^(100|[1-9]?[0-9])%$"
_PERCENT_RE = re.compile(PERCENT_PATTERN)


def _check_int_or_percent(value: int | str) -> int | str:
    if isinstance(value, bool):
        raise ValueError("must be a count (0, 3) or a percentage ('10%')")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a count cannot be negative")
        return value
    if not _PERCENT_RE.match(value):
        raise ValueError(f"{value!r} must be a count (3) or a percentage between 0% and 100%")
    return value


IntOrPercent = Annotated[
    int | str,
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                {
                    # `type(self) == int` first: CEL's || forgives the error `matches` would
                    # raise on an int.
                    "rule": f"type(self) == int ? self >= 0 : self.matches('{PERCENT_PATTERN}')",
                    "message": "must be a count (3) or a percentage between 0% and 100% ('10%')",
                }
            ],
        }
    ),
    AfterValidator(_check_int_or_percent),
]
"""A count of nodes or a percentage of the selected nodes, like Cluster API's maxUnhealthy."""


def scaled_value(value: int | str, total: int, *, round_up: bool) -> int:
    """Resolve an IntOrPercent against `total` (Kubernetes' GetScaledValueFromIntOrPercent)."""
    if isinstance(value, int):
        return value
    percent = int(value.removesuffix("%"))
    scaled, remainder = divmod(percent * total, 100)
    return scaled + (1 if round_up and remainder else 0)


class Model(BaseModel):
    """Base for gpuheal's CRD models: camelCase on the wire, unknown fields rejected.

    The API server prunes unknown fields before we see an object, so `forbid` only bites on
    hand-written YAML (examples, tests), which is exactly where a typo should fail loudly.
    """

    model_config = ConfigDict(extra="forbid")

    def to_k8s(self) -> dict[str, Any]:
        """Dump for the API: camelCase, no `None` (absent and null differ in a CRD)."""
        # kcr overrides model_dump without annotations; call pydantic's directly.
        return PydanticModel.model_dump(self, by_alias=True, exclude_none=True, mode="json")


def list_of(max_length: int, description: str, **extra: Any) -> Any:
    """A list field, empty by default, bounded (CEL cost estimation needs every list bounded)."""
    return Field(default_factory=list, max_length=max_length, description=description, **extra)


def map_of(max_length: int, description: str) -> Any:
    """A map field, empty by default, bounded."""
    return Field(default_factory=dict, max_length=max_length, description=description)


def describe_errors(exc: ValidationError, limit: int = 5) -> str:
    """`spec.x.y: why; ...` for a person: the field paths as written in YAML (the models
    validate by alias), pydantic's "Value error, " prefix dropped."""
    errors = exc.errors()
    text = "; ".join(
        f"{'.'.join(str(x) for x in e['loc']) or '(object)'}: "
        f"{e['msg'].removeprefix('Value error, ')}"
        for e in errors[:limit]
    )
    return text + (f"; and {len(errors) - limit} more" if len(errors) > limit else "")


def column(name: str, type_: str, path: str, *, priority: int = 0) -> dict[str, str | int]:
    """A `kubectl get` printer column (priority 1: only with -o wide)."""
    col: dict[str, str | int] = {"name": name, "type": type_, "jsonPath": path}
    if priority:
        col["priority"] = priority
    return col


def condition_column(name: str, condition: str, field: str = "status") -> dict[str, str | int]:
    """A printer column showing one field of one status condition."""
    return column(name, "string", f'.status.conditions[?(@.type=="{condition}")].{field}')


def cel(*rules: tuple[str, str] | dict[str, JsonValue]) -> dict[str, JsonValue]:
    """`x-kubernetes-validations` for a model's json_schema_extra: (rule, message) pairs, or
    `check(...)` for a message computed from the object or a field path."""
    items: list[JsonValue] = [
        r if isinstance(r, dict) else {"rule": r[0], "message": r[1]} for r in rules
    ]
    return {"x-kubernetes-validations": items}


def check(
    rule: str,
    message: str | None = None,
    *,
    message_expression: str | None = None,
    field_path: str | None = None,
) -> dict[str, JsonValue]:
    """One CEL rule with a fixed `message` or a `messageExpression` (a CEL string expression
    that names what is wrong in the user's words), optionally reported at `field_path`."""
    out: dict[str, JsonValue] = {"rule": rule}
    if message is not None:
        out["message"] = message
    if message_expression is not None:
        out["messageExpression"] = message_expression
    if field_path is not None:
        out["fieldPath"] = field_path
    return out


# CEL keywords: a property with one of these names is `self.__<name>__` in a rule.
_CEL_RESERVED = frozenset({
    "as", "break", "const", "continue", "else", "false", "for", "function", "if", "import",
    "in", "let", "loop", "package", "namespace", "null", "return", "true", "var", "void",
    "while",
})  # fmt: skip


def cel_field(name: str) -> str:
    """How a rule names the property `name` (`for` -> `__for__`)."""
    return f"__{name}__" if name in _CEL_RESERVED else name


def cel_str(text: str) -> str:
    """A CEL string literal (JSON's escapes are CEL's)."""
    return json.dumps(text)


_DIGITS = "['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']"


def cel_int(expr: str) -> str:
    """CEL: the decimal text of `expr`, an int in 0..99999, as a string of known length.

    `string(int)` would do, but CEL cost estimation takes its result as long as a request
    can be, and a message that concatenates it never passes the API server's budget."""
    digits = " + ".join(f"(n >= {10**p} ? {_DIGITS}[n / {10**p} % 10] : '')" for p in (4, 3, 2, 1))
    return f"[{expr}].map(n, {digits} + {_DIGITS}[n % 10])[0]"


# ---- label keys and values: Kubernetes' own syntax, readable messages ----------------------
LABEL_KEY_HELP = (
    "a label key is a name of at most 63 letters, digits, '-', '_' or '.' that starts and "
    "ends with a letter or digit, optionally after a DNS subdomain prefix and '/' "
    "(e.g. gpuheal.io/pool)"
)
LABEL_VALUE_HELP = (
    "a label value is empty or at most 63 letters, digits, '-', '_' or '.' that starts and "
    "ends with a letter or digit"
)
_LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(DNS_SUBDOMAIN_PATTERN)


def is_label_key(text: str) -> bool:
    """Kubernetes' IsQualifiedName (label keys, taint keys): [prefix/]name."""
    parts = text.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix or len(prefix) > MAX_NAME or not _DNS_SUBDOMAIN_RE.match(prefix):
            return False
    name = parts[-1]
    return 0 < len(name) <= MAX_LABEL_VALUE and bool(_LABEL_NAME_RE.match(name))


def is_label_value(text: str) -> bool:
    """Kubernetes' IsValidLabelValue."""
    return len(text) <= MAX_LABEL_VALUE and bool(_LABEL_VALUE_RE.match(text))


def label_key_cel(expr: str) -> str:
    """CEL: `expr` is a valid label key (the API server's own check, `format.qualifiedName`)."""
    return f"!format.qualifiedName().validate({expr}).hasValue()"


def label_value_cel(expr: str) -> str:
    return f"!format.labelValue().validate({expr}).hasValue()"


_KEY_TAIL = "' is not a valid label key: " + LABEL_KEY_HELP
_VALUE_TAIL = "' is not a valid label value: " + LABEL_VALUE_HELP
_NAME_TAIL = (
    "' is not a valid name: at most 63 lowercase letters, digits or '-', starting and ending "
    "with a letter or digit"
)
_OBJECT_NAME_TAIL = (
    "' is not a valid object name: at most 253 lowercase letters, digits, '-' or '.', "
    "starting and ending with a letter or digit"
)
_DNS_LABEL_RE = re.compile(DNS_LABEL_PATTERN)


def _is_dns_label(text: str) -> bool:
    return len(text) <= MAX_LABEL_VALUE and bool(_DNS_LABEL_RE.match(text))


def _is_dns_subdomain(text: str) -> bool:
    return len(text) <= MAX_NAME and bool(_DNS_SUBDOMAIN_RE.match(text))


def _checked_in_crd(max_length: int, valid: str, tail: str) -> Any:
    """The Field of a string the API server checks with the CEL expression ``valid`` (on
    ``self``), refusing it as ``'<the value>`` then ``tail``."""
    message = f'"\'" + self + {cel_str(tail)}'
    return Field(
        max_length=max_length, json_schema_extra=cel(check(valid, message_expression=message))
    )


def _checked_in_python(valid: Callable[[str], bool], tail: str) -> AfterValidator:
    """The same check in Python, with the same words as the CRD's."""

    def checked(text: str) -> str:
        if not valid(text):
            raise ValueError(f"'{text}{tail}")
        return text

    return AfterValidator(checked)


LabelKey = Annotated[
    str,
    _checked_in_crd(MAX_LABEL_KEY, label_key_cel("self"), _KEY_TAIL),
    _checked_in_python(is_label_key, _KEY_TAIL),
]
"""A label (or taint) key, checked as the API server checks Node labels."""

LabelValue = Annotated[
    str,
    _checked_in_crd(MAX_LABEL_VALUE, label_value_cel("self"), _VALUE_TAIL),
    _checked_in_python(is_label_value, _VALUE_TAIL),
]
"""A label value, checked as the API server checks Node labels."""

DnsLabel = Annotated[
    str,
    _checked_in_crd(
        MAX_LABEL_VALUE, "!format.dns1123Label().validate(self).hasValue()", _NAME_TAIL
    ),
    _checked_in_python(_is_dns_label, _NAME_TAIL),
]
"""A name such as a rule's, a rung's or a namespace (RFC 1123 label)."""

DnsSubdomain = Annotated[
    str,
    _checked_in_crd(
        MAX_NAME, "!format.dns1123Subdomain().validate(self).hasValue()", _OBJECT_NAME_TAIL
    ),
    _checked_in_python(_is_dns_subdomain, _OBJECT_NAME_TAIL),
]
"""The name of a Kubernetes object (RFC 1123 subdomain)."""


ImmutableNodeName = Annotated[
    str,
    Field(
        max_length=MAX_NAME,
        pattern=DNS_SUBDOMAIN_PATTERN,
        json_schema_extra=cel(("self == oldSelf", "nodeName is immutable")),
    ),
]
"""The Node an object is about (its spec.nodeName): set at creation, never changed."""


def label_map_keys_check(field: str) -> dict[str, JsonValue]:
    """CEL on the model holding the label map `field`: every key is a label key. A CRD schema
    cannot constrain map keys, so the model that holds the map checks them; in Python the
    map's `LabelKey` key type does."""
    bad = f"self.{field}.filter(k, format.qualifiedName().validate(k).hasValue())[0]"
    return check(
        f"!has(self.{field}) || self.{field}.all(k, {label_key_cel('k')})",
        message_expression=" + ".join(('"\'"', bad, cel_str(_KEY_TAIL))),
        field_path=f".{field}",
    )


# ---- duration ranges -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DurationRange:
    """An upper bound on a duration field, on the model that holds it: one CEL rule for the
    API server (`cel()`), the same check for local files (`check(model)`)."""

    field: str  # the wire (camelCase) name
    at_most: str
    why: str

    @property
    def message(self) -> str:
        return f"{self.field} must be at most {self.at_most}: {self.why}"

    def cel(self) -> dict[str, JsonValue]:
        value = f"self.{cel_field(self.field)}"
        return check(
            f"!has({value}) || !{duration_ok(value)} || "
            f"duration({value}) <= duration('{self.at_most}')",
            self.message,
            field_path=f".{self.field}",
        )

    def check(self, value: str | None) -> None:
        if value is None:
            return
        try:
            too_long = parse_duration(value) > parse_duration(self.at_most)
        except DurationError:
            return  # the field's own check says so
        if too_long:
            raise ValueError(self.message)


SELECTOR_VALUES_MESSAGE = "In and NotIn need values; Exists and DoesNotExist take none"


class SelectorOperator(enum.StrEnum):
    """Label selector operators, as in metav1.LabelSelectorRequirement."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(Model):
    """One expression of a label selector."""

    key: LabelKey = Field(description="The label key the expression applies to.")
    operator: SelectorOperator = Field(
        description="In, NotIn, Exists or DoesNotExist: how the key relates to the values."
    )
    values: list[LabelValue] = list_of(
        64, "Label values: required for In and NotIn, empty for Exists and DoesNotExist."
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> LabelSelectorRequirement:
        if (self.operator in {SelectorOperator.IN, SelectorOperator.NOT_IN}) != bool(self.values):
            raise ValueError(SELECTOR_VALUES_MESSAGE)
        return self


class LabelSelector(Model):
    """Standard Kubernetes label selector; an empty selector selects every node."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.matchExpressions) || self.matchExpressions.all(e, "
                    "(e.operator in ['In', 'NotIn']) == (has(e.values) && size(e.values) > 0))",
                    "message": SELECTOR_VALUES_MESSAGE,
                },
                label_map_keys_check("matchLabels"),
            ]
        }
    )

    match_labels: dict[LabelKey, LabelValue] = map_of(
        32, "Labels a node must carry with exactly these values (all of them)."
    )
    match_expressions: list[LabelSelectorRequirement] = list_of(
        32, "Label expressions a node must satisfy (all of them)."
    )

    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: dict[str, str]) -> bool:
        """Kubernetes selector semantics: every matchLabel and every expression must hold."""
        if any(labels.get(key) != value for key, value in self.match_labels.items()):
            return False
        for expr in self.match_expressions:
            present = expr.key in labels
            if expr.operator is SelectorOperator.EXISTS and not present:
                return False
            if expr.operator is SelectorOperator.DOES_NOT_EXIST and present:
                return False
            if expr.operator is SelectorOperator.IN and labels.get(expr.key) not in expr.values:
                return False
            if expr.operator is SelectorOperator.NOT_IN and labels.get(expr.key) in expr.values:
                return False
        return True

    def specificity(self) -> int:
        """Number of constraints: used only to explain overlaps, never to resolve them."""
        return len(self.match_labels) + len(self.match_expressions)


class ObjectRef(Model):
    """Reference to a cluster-scoped object by name."""

    name: DnsSubdomain = Field(description="Name of the referenced object.")


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(Model):
    """metav1.Condition: one observation of one aspect of the object."""

    type: str = Field(
        max_length=316,
        pattern=CONDITION_TYPE_PATTERN,
        description="Type of condition in CamelCase (e.g. Ready, Cordoned, Blocked).",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="The metadata.generation the condition was set for.",
    )
    last_transition_time: dt.datetime = Field(
        description="When the condition last changed from one status to another."
    )
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON_PATTERN,
        description="Why, as one CamelCase word for programs (e.g. ApprovalPending).",
    )
    message: str = Field(default="", max_length=32768, description="Why, in words for people.")


def conditions_field(description: str) -> Any:
    """A `conditions` list keyed by type, as the API conventions ask."""
    return Field(
        default_factory=list,
        max_length=32,
        description=description,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: Sequence[Condition],
    *,
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    now: dt.datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """Return a new list with `type_` set; `lastTransitionTime` moves only when status changes.

    Like apimachinery's meta.SetStatusCondition, so a re-applied condition does not look like
    a fresh transition (the storm cooldown and hysteresis read these times).
    """
    previous = find_condition(conditions, type_)
    changed = previous is None or previous.status != status
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message[:32768],
        observed_generation=observed_generation,
        last_transition_time=now if changed or previous is None else previous.last_transition_time,
    )
    out = [c for c in conditions if c.type != type_]
    out.append(updated)
    return out


class ObjectMeta(BaseModel):
    """The parts of metadata gpuheal reads; everything else is kept as is."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(max_length=MAX_NAME, description="The object's name.")
    generation: int | None = Field(
        default=None, description="Bumped by the API server on every spec change."
    )
    resource_version: str | None = Field(
        default=None, description="The version for optimistic concurrency."
    )
    uid: str | None = Field(default=None, description="Unique id of this object.")
    labels: dict[str, str] = Field(default_factory=dict, description="The object's labels.")
    annotations: dict[str, str] = Field(
        default_factory=dict, description="The object's annotations."
    )
    creation_timestamp: dt.datetime | None = Field(
        default=None, description="When the object was created."
    )


class Status(Model):
    """What every gpuheal status starts with (written by gpuheal only)."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status describes."
    )


SpecT = TypeVar("SpecT", bound=Model)
StatusT = TypeVar("StatusT", bound=Status)


class Resource(Model, Generic[SpecT, StatusT]):
    """What every gpuheal custom resource has: a subclass names its spec and status models
    (`Resource[FooSpec, FooStatus]`) and narrows `kind` to its own name. The CRD's schema
    comes from those two models and the subclass's docstring (`CrdInfo.of`)."""

    api_version: Literal["gpuheal.io/v1alpha1"] = Field(
        default="gpuheal.io/v1alpha1", description="gpuheal.io/v1alpha1"
    )
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    kind: str = Field(description="The resource's kind.")
    spec: SpecT = Field(description="What the user (or gpuheal, for an incident) asks for.")
    # An object new to the API server has no status yet: it reads as an empty one.
    status: StatusT = Field(
        default_factory=dict,
        validate_default=True,
        description="Observed state (gpuheal writes it).",
    )


@dataclasses.dataclass(frozen=True)
class CrdInfo:
    """What the CRD document needs besides the schema (names, columns, subresources)."""

    kind: str
    singular: str
    plural: str
    short_names: tuple[str, ...]
    spec_model: type[BaseModel]
    status_model: type[BaseModel]
    printer_columns: tuple[dict[str, str | int], ...] = ()
    description: str = ""
    categories: tuple[str, ...] = ("gpuheal",)

    @property
    def name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @classmethod
    def of(
        cls,
        resource: type[BaseModel],
        short_names: tuple[str, ...],
        *columns: dict[str, str | int],
    ) -> CrdInfo:
        """The CRD of a resource model: kind, names, spec and status from the model itself."""
        kind = resource.__name__
        singular = kind.lower()
        return cls(
            kind=kind,
            singular=singular,
            plural=singular[:-1] + "ies" if singular.endswith("y") else singular + "s",
            short_names=short_names,
            spec_model=resource.model_fields["spec"].annotation,  # type: ignore[arg-type]
            status_model=resource.model_fields["status"].annotation,  # type: ignore[arg-type]
            printer_columns=columns,
            description=resource.__doc__ or "",
        )


def redact_url(url: str) -> str:
    """``url`` as it may be logged or shown: scheme, host and port only, the rest ``...``.

    A webhook URL is often a credential in itself (Slack's carries its token in the path;
    others put one in the query or the user info), so nothing past the host is shown."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "<unparseable URL>"
    if not parts.scheme or not host:
        return "<unparseable URL>"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}/..."


# The host part stops at a comma too: URLs joined by commas (a flag's list) are separate URLs.
# A URL is cut when it has more than a scheme and host: a path, a query, a fragment, or user
# info (`https://user:token@host` carries its secret before the host, with or without a path).
_ANY_URL = re.compile(
    r"\b[a-zA-Z][a-zA-Z0-9+.-]{0,15}://"
    r"(?:[^\s/?#'\"<>,@]+@[^\s/?#'\"<>,]+(?:[/?#][^\s'\"<>,]*)?|[^\s/?#'\"<>,]+[/?#][^\s'\"<>,]*)"
)


def redact_urls(text: str) -> str:
    """``text`` with every URL that has more than a scheme and host (a path, a query, a
    fragment) cut to `redact_url`'s form: a log line's last defence, whatever wrote it (a
    traceback, a library, kopf). Secret parts elsewhere in the text are not found here: that
    is `scrub_url`'s job, where the URL is known."""

    def cut(found: re.Match[str]) -> str:
        url = found.group(0)
        bare = url.rstrip(".,;:!)]}")  # the sentence's punctuation, not the URL's
        return redact_url(bare) + url[len(bare) :]

    return _ANY_URL.sub(cut, text)


def scrub_url(text: str, url: str) -> str:
    """``text`` (an error message, say) with ``url`` and the secret parts of it (path,
    query, user info) replaced by `redact_url`'s form."""
    out = text.replace(url, redact_url(url)) if url else text
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return out
    for secret in (parts.path, parts.query, parts.username, parts.password):
        if secret and len(secret) > 1:
            out = out.replace(secret, "...")
    return out
