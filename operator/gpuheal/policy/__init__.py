"""The only decisions: policy + node view + history + cluster counts + now -> Decision.

`decide` (engine) is the entry point; `admit` (safety) the gate before a node is taken out
of service; `select` says which policy, rule, spare and pods; `inputs` reads API objects,
and `reading` builds the engine's inputs for a node from what was read of the cluster, for
the operator (its caches) and `gpuheal explain` (a live read) alike.
"""

from gpuheal.policy.engine import condition_observations, decide, rung_for, trigger_for
from gpuheal.policy.safety import Admission, admit, allowed_unhealthy, cluster_counts
from gpuheal.policy.select import (
    choose_policy,
    pods_to_evict,
    rule_matches,
    select_policy,
    spare_candidates,
    unhealthy_reasons,
    watched_conditions,
)

__all__ = [
    "Admission",
    "admit",
    "allowed_unhealthy",
    "choose_policy",
    "cluster_counts",
    "condition_observations",
    "decide",
    "pods_to_evict",
    "rule_matches",
    "rung_for",
    "select_policy",
    "spare_candidates",
    "trigger_for",
    "unhealthy_reasons",
    "watched_conditions",
]
