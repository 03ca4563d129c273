"""Shared building blocks of gpuheal's CRDs: API group, durations, selectors, conditions.

Everything here is pure data. The CRD schema is generated from these models (see `gen.py`),
so a constraint written once here is enforced twice: by the API server (OpenAPI + CEL) and by
pydantic when the operator parses an object.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from kube_custom_resource.schema import BaseModel
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    JsonValue,
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

# Go duration syntax restricted to the units that make sense here (and that CEL's duration()
# understands). Days are deliberately absent: `24h` is unambiguous, `1d` is not valid Go.
# `[.]` rather than `\.`: the pattern is also embedded in CEL string literals, where `\.` is
# not a valid escape.
DURATION_PATTERN = r"^([0-9]+([.][0-9]+)?(ms|s|m|h))+$"
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
    if not isinstance(text, str) or len(text) > MAX_DURATION or not _DURATION_RE.match(text):
        raise DurationError(f"{text!r} is not a duration such as 90s, 10m or 1h30m")
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
        raise DurationError(f"{text!r} must be longer than zero")
    return text


# The CEL guard (`!self.matches(...) ||`) keeps a malformed value from producing a second,
# confusing "evaluation error" next to the pattern's own message.
_POSITIVE_RULE = {
    "rule": f"!self.matches('{DURATION_PATTERN}') || duration(self) > duration('0s')",
    "message": "must be a positive duration such as 30s, 10m or 24h",
}

Duration = Annotated[
    str,
    Field(pattern=DURATION_PATTERN, max_length=MAX_DURATION),
    AfterValidator(_check_duration),
]
"""A Go duration, zero allowed (`0s`)."""

PositiveDuration = Annotated[
    str,
    Field(
        pattern=DURATION_PATTERN,
        max_length=MAX_DURATION,
        json_schema_extra={"x-kubernetes-validations": [_POSITIVE_RULE]},
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


def column(name: str, type_: str, path: str, *, priority: int = 0) -> dict[str, str | int]:
    """A `kubectl get` printer column (priority 1: only with -o wide)."""
    col: dict[str, str | int] = {"name": name, "type": type_, "jsonPath": path}
    if priority:
        col["priority"] = priority
    return col


def condition_column(name: str, condition: str, field: str = "status") -> dict[str, str | int]:
    """A printer column showing one field of one status condition."""
    return column(name, "string", f'.status.conditions[?(@.type=="{condition}")].{field}')


SELECTOR_VALUES_MESSAGE = "In and NotIn need values; Exists and DoesNotExist take none"


class SelectorOperator(enum.StrEnum):
    """Label selector operators, as in metav1.LabelSelectorRequirement."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(Model):
    """One expression of a label selector."""

    key: str = Field(
        max_length=MAX_LABEL_KEY,
        pattern=LABEL_KEY_PATTERN,
        description="The label key the expression applies to.",
    )
    operator: SelectorOperator = Field(
        description="In, NotIn, Exists or DoesNotExist: how the key relates to the values."
    )
    values: list[Annotated[str, Field(max_length=MAX_LABEL_VALUE)]] = list_of(
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
                }
            ]
        }
    )

    match_labels: dict[
        Annotated[str, Field(max_length=MAX_LABEL_KEY)],
        Annotated[str, Field(max_length=MAX_LABEL_VALUE)],
    ] = map_of(32, "Labels a node must carry with exactly these values (all of them).")
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

    name: str = Field(
        max_length=MAX_NAME,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the referenced object.",
    )


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


def cel(*rules: tuple[str, str]) -> dict[str, JsonValue]:
    """`x-kubernetes-validations` for a model's json_schema_extra: (rule, message) pairs."""
    items: list[JsonValue] = [{"rule": rule, "message": message} for rule, message in rules]
    return {"x-kubernetes-validations": items}


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


class Resource(Model):
    """What every gpuheal custom resource has besides its kind, spec and status."""

    api_version: Literal["gpuheal.io/v1alpha1"] = Field(
        default="gpuheal.io/v1alpha1", description="gpuheal.io/v1alpha1"
    )
    metadata: ObjectMeta = Field(description="Standard object metadata.")


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
