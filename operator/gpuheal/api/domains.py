"""Fault domains: nodes that share a cause (a rack's PDU, a leaf switch, an NVLink domain).

`spec.domains` of a RemediationPolicy names topology labels a site already sets (a rack,
`nvidia.com/gpu.clique`, a switch). When faults on several nodes carrying the same value of
one of these labels come within a window, they are one domain incident: spares do not fix
a shared cause, so past a limit the members' replacements are held (see
`gpuheal.policy.domains`). Kept apart from the policy's other models so that the engine's
per-node rules and this wider view can change without touching each other.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from gpuheal.api.meta import (
    DurationRange,
    IntOrPercent,
    LabelKey,
    Model,
    PositiveDuration,
    cel,
    check,
)

DEFAULT_MIN_NODES = 2
DEFAULT_MAX_NODE_ACTIONS = 2
_WINDOW = DurationRange(
    "window", "24h", "faults a day apart are not one failure of shared hardware"
)
_ACTIONS_MESSAGE = (
    "maxNodeActions must be at least minNodes - 1: the members that fault before the domain "
    "incident opens have acted already, a smaller limit cannot hold them back"
)
_DOMAIN_RULES = (
    _WINDOW.cel(),
    # Defaults are not in the CRD (gen.py): an absent field is its default here.
    check(
        f"(has(self.maxNodeActions) ? self.maxNodeActions : {DEFAULT_MAX_NODE_ACTIONS}) + 1 >= "
        f"(has(self.minNodes) ? self.minNodes : {DEFAULT_MIN_NODES})",
        _ACTIONS_MESSAGE,
        field_path=".maxNodeActions",
    ),
)


class FaultDomain(Model):
    """Nodes sharing one value of a topology label (a rack, an NVLink clique, a switch)."""

    model_config = ConfigDict(json_schema_extra=cel(*_DOMAIN_RULES))

    key: LabelKey = Field(
        description="The node label whose value names the domain, as the site sets it "
        "(e.g. topology.kubernetes.io/rack, nvidia.com/gpu.clique). Nodes without it belong "
        "to no domain of this key."
    )
    window: PositiveDuration = Field(
        default="10m",
        description="Faults on nodes of one domain within this window of its first fault are "
        "one domain incident (at most 24h).",
    )
    min_nodes: int = Field(
        default=DEFAULT_MIN_NODES,
        ge=2,
        le=1000,
        description="How many nodes of the domain must fault within the window for a domain "
        "incident to open (it is announced once, when it opens).",
    )
    max_node_actions: int = Field(
        default=DEFAULT_MAX_NODE_ACTIONS,
        ge=0,
        le=1000,
        description="Members (in the order of their faults) whose ladder runs in full; later "
        "members still cordon, drain and requeue, but their replacement (a ReservePool spare) "
        "is held with Blocked=True, reason DomainReplacementHeld, until a person approves it "
        "(gpuheal.io/approve=replace). At least minNodes - 1.",
    )
    max_unhealthy: IntOrPercent | None = Field(
        default=None,
        description="A breaker per domain: most nodes of one domain out of service at once "
        "(count, or percent of the domain's nodes this policy governs, rounded down but at "
        "least 1 for a non-zero percent); more wait with Blocked=True, reason "
        "DomainBreakerOpen. Unset: only the policy's safety.maxUnhealthy counts.",
    )

    @model_validator(mode="after")
    def _mirror_cel(self) -> FaultDomain:
        _WINDOW.check(self.window)
        if self.max_node_actions + 1 < self.min_nodes:
            raise ValueError(_ACTIONS_MESSAGE)
        return self


DOMAINS_DESCRIPTION = (
    "Topology labels whose nodes share a cause (rack, NVLink clique, switch): faults on "
    "several nodes of one domain within a window open one domain incident; past "
    "maxNodeActions members, replacement is held (spares do not fix a shared cause), people "
    "are told once, and a breaker may count per domain."
)
