"""gpuheal's custom resources (group gpuheal.io, version v1alpha1) as pydantic v2 models.

The CRDs in `crds/` are generated from these models: `python -m gpuheal.api.gen`.
"""

from gpuheal.api.faulthistory import FaultHistory, FaultHistorySpec, FaultHistoryStatus
from gpuheal.api.meta import (
    Condition,
    ConditionStatus,
    LabelSelector,
    ObjectMeta,
    ObjectRef,
    find_condition,
    format_duration,
    parse_duration,
    scaled_value,
    set_condition,
)
from gpuheal.api.names import API_VERSION, APPROVE_ANNOTATION, GROUP, OPT_OUT_LABEL, VERSION
from gpuheal.api.noderemediation import NodeRemediation, NodeRemediationSpec, NodeRemediationStatus
from gpuheal.api.remediationpolicy import (
    Action,
    RemediationPolicy,
    RemediationPolicySpec,
    RemediationPolicyStatus,
    Rule,
    Rung,
    Step,
)
from gpuheal.api.reservepool import ReservePool, ReservePoolSpec, ReservePoolStatus

__all__ = [
    "API_VERSION",
    "APPROVE_ANNOTATION",
    "GROUP",
    "OPT_OUT_LABEL",
    "VERSION",
    "Action",
    "Condition",
    "ConditionStatus",
    "FaultHistory",
    "FaultHistorySpec",
    "FaultHistoryStatus",
    "LabelSelector",
    "NodeRemediation",
    "NodeRemediationSpec",
    "NodeRemediationStatus",
    "ObjectMeta",
    "ObjectRef",
    "RemediationPolicy",
    "RemediationPolicySpec",
    "RemediationPolicyStatus",
    "ReservePool",
    "ReservePoolSpec",
    "ReservePoolStatus",
    "Rule",
    "Rung",
    "Step",
    "find_condition",
    "format_duration",
    "parse_duration",
    "scaled_value",
    "set_condition",
]
