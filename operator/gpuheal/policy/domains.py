"""Domain incidents: faults on several nodes of one rack, NVLink clique or switch.

A policy's `spec.domains` names topology labels. The incidents (open or closed) of the
policy on nodes sharing one value of such a label are grouped by their first signal's time:
a group starts at the earliest fault not yet in a group and takes every fault within
`window` of it (a later fault starts the next group). A group with `minNodes` nodes or more
is a domain incident; its members are its nodes, one each, in the order of their faults
(the node name breaks a tie), so the same incidents always give the same members in the
same order, whoever asks (the operator, `gpuheal explain`, `gpuheal status`), and a
member's place never changes as later members join.

What it changes, and only for the members of a domain incident (the engine asks here):
- the first `maxNodeActions` members run their ladders in full; later members still cordon,
  drain and requeue (their jobs need it), but their `replace` (claiming a ReservePool
  spare) is held: a spare does not fix a shared cause, and a rack that lost power would
  otherwise empty the pool. A person lifts the hold for one node by approving its replace;
- the member whose fault opens the domain incident (place minNodes) announces it, once,
  for all; members after it do not announce their own opening, nor their held replacement;
- `maxUnhealthy` of a domain: a breaker per domain, beside the policy's own.

Nothing here is stored: the domain incident is derived from the members' NodeRemediations
and the nodes' labels, so no status can claim a domain incident its members do not show.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Iterable, Sequence

from gpuheal.api.domains import FaultDomain
from gpuheal.api.meta import parse_duration, scaled_value
from gpuheal.policy.types import IncidentSummary


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """One node of a domain incident: its (first) incident in the group, when it faulted."""

    node: str
    incident: str
    at: dt.datetime
    active: bool


@dataclasses.dataclass(frozen=True, slots=True)
class DomainIncident:
    """The faults of one domain (`key`=`value`) within a window of its first: a domain
    incident when at least `min_nodes` nodes faulted (`formed`)."""

    policy: str
    key: str
    value: str
    window: str
    min_nodes: int
    max_node_actions: int
    members: tuple[Member, ...]
    incidents: frozenset[str]  # every incident in the group (a node may have had two)

    @property
    def name(self) -> str:
        return f"{self.key}={self.value}"

    @property
    def opened_at(self) -> dt.datetime:
        return self.members[0].at

    @property
    def formed(self) -> bool:
        return len(self.members) >= self.min_nodes

    @property
    def active(self) -> bool:
        """Formed, and a member's incident is still open."""
        return self.formed and any(m.active for m in self.members)

    def place(self, node: str) -> int | None:
        """The node's place among the members (0: the first to fault)."""
        return next((i for i, m in enumerate(self.members) if m.node == node), None)

    @property
    def acting(self) -> tuple[str, ...]:
        return tuple(m.node for m in self.members[: self.max_node_actions])

    @property
    def held(self) -> tuple[str, ...]:
        """Members whose replacement is held (when their ladder has one)."""
        return tuple(m.node for m in self.members[self.max_node_actions :])

    def summary(self) -> str:
        """One line for people: the domain, its members, who acts and who is held."""
        nodes = ", ".join(m.node for m in self.members)
        line = (
            f"{self.name}: {len(self.members)} nodes faulted within {self.window} of "
            f"{self.opened_at.isoformat()} ({nodes}); a shared cause is likely"
        )
        if self.held:
            line += (
                f": replacement runs for the first {self.max_node_actions} "
                f"({', '.join(self.acting) or 'none'}), held for {', '.join(self.held)} "
                "(spares do not fix a shared cause)"
            )
        return line


def domain_incidents(
    policy: str, domain: FaultDomain, value: str, incidents: Iterable[IncidentSummary]
) -> list[DomainIncident]:
    """The groups of ``policy``'s incidents on nodes of the domain ``domain.key=value``
    (``incidents``: those nodes' incidents, any policy), earliest first; formed or not."""
    mine = sorted(
        (i for i in incidents if i.policy == policy),
        key=lambda i: (_fault_time(i), i.node, i.name),
    )
    window = parse_duration(domain.window)
    groups: list[list[IncidentSummary]] = []
    for i in mine:
        if groups and _fault_time(i) <= _fault_time(groups[-1][0]) + window:
            groups[-1].append(i)
        else:
            groups.append([i])
    out = []
    for group in groups:
        members: dict[str, Member] = {}
        for i in group:  # in fault order: a node's first incident in the group is its place
            if i.node not in members:
                members[i.node] = Member(i.node, i.name, _fault_time(i), i.active)
            elif i.active:
                members[i.node] = dataclasses.replace(members[i.node], active=True)
        out.append(
            DomainIncident(
                policy=policy,
                key=domain.key,
                value=value,
                window=domain.window,
                min_nodes=domain.min_nodes,
                max_node_actions=domain.max_node_actions,
                members=tuple(members.values()),
                incidents=frozenset(i.name for i in group),
            )
        )
    return out


def _fault_time(i: IncidentSummary) -> dt.datetime:
    at = i.first_signal_at or i.started_at
    assert at is not None, f"incident {i.name} has neither a signal time nor a start"
    return at


@dataclasses.dataclass(frozen=True, slots=True)
class DomainStanding:
    """A node's place in one of its policy's domains, as a decision needs it."""

    domain: FaultDomain
    value: str
    incident: DomainIncident | None  # the group its incident is in (formed or not)
    nodes: int  # nodes of the domain the policy governs (the domain breaker's base)
    out: int  # of them out of service now under the policy (holding a slot)

    @property
    def name(self) -> str:
        return f"{self.domain.key}={self.value}"


def replacement_held(standings: Sequence[DomainStanding], node: str) -> DomainStanding | None:
    """The domain incident that holds the node's replacement: it is a member past
    maxNodeActions of a formed one (approval is the engine's to weigh)."""
    for s in standings:
        group = s.incident
        if group is None or not group.formed:
            continue
        place = group.place(node)
        if place is not None and place >= group.max_node_actions:
            return s
    return None


# A member's place is final only once the faults before it are incidents too: XIDs on four
# nodes within one second (Events carry whole seconds; a tie goes by node name) become
# incidents in whatever order the operator reaches them. Deciding on a place earlier, a later
# member claimed its spare ahead of its replace step and was held after, and two members each
# announced the domain (both seen in test runs under load). The node's own steps never wait.
PLACE_SETTLE = dt.timedelta(seconds=2)


def place_settling(
    standings: Sequence[DomainStanding], started_at: dt.datetime, now: dt.datetime
) -> bool:
    """The node is in one of its policy's domains and its incident opened less than
    PLACE_SETTLE ago: what depends on its place (an early spare claim, how its opening is
    told) waits; its replace step comes later and is decided on the whole group."""
    return any(s.value for s in standings) and now < started_at + PLACE_SETTLE


def held_message(standing: DomainStanding, node: str) -> str:
    group = standing.incident
    assert group is not None
    place = group.place(node)
    return (
        f"domain incident {group.name}: {node} is member {(place or 0) + 1} of "
        f"{len(group.members)} ({', '.join(m.node for m in group.members)}) within "
        f"{group.window}, past maxNodeActions {group.max_node_actions}: its replacement is "
        "held, a spare does not fix a shared cause; approve it to go on anyway"
    )


def allowed_in_domain(domain: FaultDomain, nodes: int) -> int | None:
    """The domain breaker's limit (None: none set): a count, or a percent of the domain's
    nodes rounded down, at least 1 for a non-zero percent (as `safety.allowed_unhealthy`)."""
    value = domain.max_unhealthy
    if value is None:
        return None
    allowed = scaled_value(value, nodes, round_up=False)
    if allowed == 0 and nodes > 0 and isinstance(value, str) and value != "0%":
        allowed = 1
    return max(0, min(allowed, nodes))


def domain_breaker(standings: Sequence[DomainStanding]) -> tuple[DomainStanding, str] | None:
    """A domain whose breaker holds back one more node out of service, and why."""
    for s in standings:
        allowed = allowed_in_domain(s.domain, s.nodes)
        if allowed is not None and s.out >= allowed:
            return s, (
                f"domain {s.name}: {s.out} of its {s.nodes} nodes already out of service; "
                f"its maxUnhealthy allows {allowed} at once"
            )
    return None


class Announce(enum.Enum):
    """How an incident's opening is told, when it is a member of a domain incident."""

    OWN = "own"  # not (yet) a member past the opening: its own Opened notice
    DOMAIN = "domain"  # its fault opened the domain incident: one notice for the domain
    FOLDED = "folded"  # a later member: told already by the domain's notice


def announcement(
    standings: Sequence[DomainStanding], node: str
) -> tuple[Announce, DomainIncident | None]:
    """What the incident of ``node`` announces when it opens."""
    for s in standings:
        group = s.incident
        if group is None or not group.formed:
            continue
        place = group.place(node)
        if place == group.min_nodes - 1:
            return Announce.DOMAIN, group
        if place is not None and place >= group.min_nodes:
            return Announce.FOLDED, group
    return Announce.OWN, None
