"""Pure decisions: policy + node view + history + cluster counts + now -> Decision."""

from gpuheal.policy.engine import (
    Trigger,
    allowed_unhealthy,
    breaker_open,
    decide,
    find_trigger,
    select_policy,
)
from gpuheal.policy.types import (
    Act,
    Blocked,
    ClusterCounts,
    Decision,
    History,
    Idle,
    IncidentView,
    NodeCondition,
    NodeView,
    Observation,
    Operation,
    Wait,
)

__all__ = [
    "Act",
    "Blocked",
    "ClusterCounts",
    "Decision",
    "History",
    "Idle",
    "IncidentView",
    "NodeCondition",
    "NodeView",
    "Observation",
    "Operation",
    "Trigger",
    "Wait",
    "allowed_unhealthy",
    "breaker_open",
    "decide",
    "find_trigger",
    "select_policy",
]
