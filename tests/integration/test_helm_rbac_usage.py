"""The chart's RBAC for the operator is what the operator uses, no more (issue 23).

A sandbox of its own whose API server writes an audit log (every request, Metadata level).
The chart is installed; the operator runs as a real process with a token of the chart's
ServiceAccount only, through representative work: an XID-79 incident (cordon, drain through
the Eviction API, a spare from a reserve pool), an XID-94 incident returned to service, an
XID-62 reset through the chart's gpu-reset node Job, and a change to a policy and a pool.
Then the requests made under the ServiceAccount's name are read back from the audit log and
compared with the rules `helm template` renders for it:

- a request the API server refused (403) fails the test (RBAC lacks something);
- a granted (verb, resource) in a namespace that no request used fails the test, unless
  tests/integration/rbac_rarely_used.yaml names it with a reason (an entry that is not
  granted at all fails too: the list stays true).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal_dev.sandbox import Sandbox, SandboxConfig
from gpuheal_dev.sandbox.kube import cluster_bin_dir
from tests.integration.operator_harness import (
    OperatorProcess,
    agent_reports_gpus,
    completed,
    condition,
    dump,
    pod_on,
    wait_for,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuheal"
ALLOWLIST = Path(__file__).with_name("rbac_rarely_used.yaml")
RELEASE = "gh"
NAMESPACE = "gpuheal-system"
#: one fake GPU node per scenario, and a spare
WORK = ("gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3")
SPARE = "gpu-spare-0"


@dataclass(frozen=True, order=True)
class Access:
    """One (verb, resource) in one namespace; namespace "*" for all (a ClusterRole's rule
    through a ClusterRoleBinding, or a request on a cluster-scoped resource)."""

    verb: str
    resource: str  # resource[/subresource][.group], as kubectl spells it
    namespace: str

    def __str__(self) -> str:
        where = "cluster-wide" if self.namespace == "*" else f"in {self.namespace}"
        return f"{self.verb} {self.resource} {where}"


def _spell(group: str, resource: str) -> str:
    base, _, sub = resource.partition("/")
    return f"{base}{'/' + sub if sub else ''}{'.' + group if group else ''}"


def _helm(home: Path, *args: str, kubeconfig: Path | None = None) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),  # kubectl's discovery cache goes there, not into the checkout
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    kube = [f"--kubeconfig={kubeconfig}"] if kubeconfig else []
    result = subprocess.run(
        [str(cluster_bin_dir() / "helm"), *args, *kube],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result.stdout


def granted(docs: list[dict[str, Any]], account: str, namespace: str) -> set[Access]:
    """What the rendered Roles and ClusterRoles grant the ServiceAccount `namespace/account`
    (resourceNames are not told apart: a rule on one object counts as used by a request on
    that resource)."""
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
    }
    out: set[Access] = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == account
            and s.get("namespace") == namespace
            for s in binding.get("subjects") or []
        ):
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role = roles[(ref["kind"], where if ref["kind"] == "Role" else None, ref["name"])]
        for rule in role.get("rules") or []:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.add(Access(verb, _spell(group, resource), where or "*"))
    return out


def used(audit_log: Path, user: str) -> tuple[set[Access], list[str]]:
    """The resource requests `user` made (audit log), and those refused with 403."""
    seen: set[Access] = set()
    refused: list[str] = []
    for line in audit_log.read_text().splitlines():
        entry = json.loads(line)
        if entry["user"]["username"] != user or "objectRef" not in entry:
            continue
        ref = entry["objectRef"]
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        access = Access(entry["verb"], _spell(ref.get("apiGroup", ""), resource),
                        ref.get("namespace") or "*")  # fmt: skip
        if entry.get("responseStatus", {}).get("code") == 403:
            refused.append(f"{access}: {entry['requestURI']}")
        else:
            seen.add(access)
    return seen, refused


def unused(grants: set[Access], seen: set[Access]) -> set[Access]:
    """Grants no request used: a namespaced grant is used by a request in its namespace, a
    cluster-wide one by a request anywhere."""
    return {
        g
        for g in grants
        if not any(
            u.verb == g.verb and u.resource == g.resource and g.namespace in ("*", u.namespace)
            for u in seen
        )
    }


def allowlisted(namespace: str) -> set[Access]:
    entries = yaml.safe_load(ALLOWLIST.read_text())
    out = set()
    for e in entries:
        assert e.get("reason", "").strip(), f"{ALLOWLIST.name}: {e} has no reason"
        where = e.get("namespace", "*")
        out.add(Access(e["verb"], e["resource"], namespace if where == "release" else where))
    return out


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    root = tmp_path_factory.mktemp("audited")
    sb = Sandbox.up(
        SandboxConfig(root=root, gpu_nodes=len(WORK), spare_nodes=1, slurm=False, audit=True)
    )
    try:
        yield sb
    finally:
        sb.down()


def _apply(sb: Sandbox, obj: dict[str, Any]) -> None:
    sb.kubectl("apply", "-f", "-", input=json.dumps(obj))


def _incident(sb: Sandbox, node: str) -> dict[str, Any] | None:
    out = sb.kubectl("get", "noderemediations", "-l", f"gpuheal.io/node={node}", "-o", "json")
    items = json.loads(out.stdout)["items"]
    return items[-1] if items else None


def _scenarios(sb: Sandbox, job_namespace: str) -> list[dict[str, Any]]:
    """The policies and the pool the scenarios act under (applied with the admin's rights)."""
    for node in WORK[:3]:
        sb.kubectl("label", "node", node, "--overwrite", "gpuheal.io/case=rbac")
    sb.kubectl("label", "node", WORK[3], "--overwrite", "gpuheal.io/case=rbac-hold")
    sb.kubectl("label", "node", SPARE, "--overwrite", "gpuheal.io/case=rbac-spare")
    # What the agent writes on the node to be reset: its GPUs, seen an hour ago (its start).
    agent_reports_gpus(sb.core_v1(), WORK[2], ago=3600)
    pool = {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "ReservePool",
        "metadata": {"name": "rbac-spares"},
        "spec": {
            "nodeSelector": {"matchLabels": {"gpuheal.io/case": "rbac-spare"}},
            "minAvailable": 1,
            "promotion": {"setLabels": {"gpuheal.io/promoted": "true"}},
        },
    }
    reset_hook = {
        "type": "Job",
        "job": {
            "namespace": job_namespace,
            "templateFrom": {"name": "gpuheal-node-jobs", "key": "gpu-reset"},
        },
    }
    replace = {"action": "replace", "replace": {"reservePoolRef": {"name": "rbac-spares"}}}
    reset = {"action": "reset", "reset": {"whenIdle": False, "settle": "2s", "hook": reset_hook}}

    def rule(name: str, xid: int, *steps: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "signals": {"xids": [xid]},
            "ladder": [{"name": name, "steps": [*steps]}],
        }

    cordon = {"action": "cordon"}
    drain = {"action": "drain", "drain": {"timeout": "30s"}}
    rules = [rule("fell-off-bus", 79, cordon, drain, replace), rule("cordon", 94, cordon),
             rule("reset", 62, cordon, reset)]  # fmt: skip

    def policy(name: str, rules: list[dict[str, Any]], healthy_for: str) -> dict[str, Any]:
        return {
            "apiVersion": "gpuheal.io/v1alpha1",
            "kind": "RemediationPolicy",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"matchLabels": {"gpuheal.io/case": name}},
                "rules": rules,
                "safety": {"maxUnhealthy": 3, "stormCooldown": "0s"},
                "returnToService": {"enabled": True, "healthyFor": healthy_for},
            },
        }

    # rbac-hold keeps its incident open (healthy for an hour first) for a second XID to join.
    return [pool, policy("rbac", rules, "2s"), policy("rbac-hold", rules[1:2], "1h")]


def test_the_operator_uses_every_verb_its_chart_grants_and_is_refused_none(
    audited: Sandbox, tmp_path: Path
) -> None:
    from gpuheal.cli.simulate import simulate_xid

    sb = audited
    home = tmp_path / "helm"
    account = f"{RELEASE}-gpuheal"
    sb.kubectl("create", "namespace", NAMESPACE)
    _helm(home, "install", RELEASE, str(CHART), "-n", NAMESPACE, kubeconfig=sb.kubeconfig)
    docs = [
        d
        for d in yaml.safe_load_all(_helm(home, "template", RELEASE, str(CHART), "-n", NAMESPACE))
        if d
    ]
    grants = granted(docs, account, NAMESPACE)
    assert grants, "the chart grants its ServiceAccount nothing?"
    # Node Jobs go wherever the chart lets the operator create Jobs.
    (job_namespace,) = {
        g.namespace for g in grants if g == Access("create", "jobs.batch", g.namespace)
    }
    for obj in _scenarios(sb, job_namespace):
        _apply(sb, obj)
    # A workload pod on the XID-79 node, for the drain to evict.
    sb.kubectl(
        "apply",
        "-n",
        NAMESPACE,
        "-f",
        "-",
        input=json.dumps(pod_on(WORK[0], "train", {"app": "train"})),
    )

    kubeconfig = sb.control_plane.kubeconfig_for_service_account(NAMESPACE, account)
    op = OperatorProcess(kubeconfig, tmp_path, ["--namespace", NAMESPACE])
    # The operator's Lease lives in its own namespace, as in its pod (the harness's default is
    # the admin's `default`).
    op.start()
    user = f"system:serviceaccount:{NAMESPACE}:{account}"
    stuck: AssertionError | None = None
    try:
        core = sb.core_v1()
        for node, xid in zip(WORK, (79, 94, 62, 94), strict=True):
            simulate_xid(core, node, xid)

        def replaced() -> bool:
            inc = _incident(sb, WORK[0])
            return all(
                (condition(inc, t) or {}).get("status") == "True"
                for t in ("Cordoned", "Drained", "ReplacementClaimed")
            )

        wait_for(replaced, "XID 79: cordoned, drained, a spare claimed", timeout=120)
        # A second XID on a node whose incident is open joins it (read it, patch its signals).
        wait_for(
            lambda: (condition(_incident(sb, WORK[3]), "Cordoned") or {}).get("status") == "True",
            "XID 94 on the held node: cordoned",
            timeout=60,
        )
        simulate_xid(core, WORK[3], 94, pci="0000:5e:00")
        wait_for(
            lambda: len((_incident(sb, WORK[3]) or {})["spec"]["signals"]) == 2,
            "the second XID recorded in the open incident",
            timeout=60,
        )
        wait_for(lambda: completed(_incident(sb, WORK[1])), "XID 94: returned", timeout=120)
        assert completed(_incident(sb, WORK[1])) == "Returned", dump(_incident(sb, WORK[1]))
        job_calls = {Access(v, "jobs.batch", job_namespace) for v in ("create", "get")}
        wait_for(
            lambda: job_calls <= used(sb.control_plane.audit_log_path, user)[0],
            "XID 62: the gpu-reset Job created and followed",
            timeout=120,
        )
        # A change to the policy and to the pool: the operator reads them and writes their
        # status (a new observedGeneration).
        sb.kubectl("patch", "remediationpolicy", "rbac", "--type=merge",
                   "-p", '{"spec":{"safety":{"maxUnhealthy":2}}}')  # fmt: skip
        sb.kubectl("patch", "reservepool", "rbac-spares", "--type=merge",
                   "-p", '{"spec":{"minAvailable":0}}')  # fmt: skip

        def observed(kind: str, name: str) -> bool:
            body = json.loads(sb.kubectl("get", kind, name, "-o", "json").stdout)
            return (
                body.get("status", {}).get("observedGeneration") == body["metadata"]["generation"]
            )

        wait_for(lambda: observed("remediationpolicy", "rbac"), "policy status", timeout=60)
        wait_for(lambda: observed("reservepool", "rbac-spares"), "pool status", timeout=60)
    except AssertionError as exc:  # a scenario stuck: a refusal below says why, if one did
        stuck = exc
    finally:
        op.stop()  # SIGTERM: the Lease is released (an update) on the way out
    seen, refused = used(sb.control_plane.audit_log_path, user)
    assert not refused, "the chart's RBAC refused the operator:\n" + "\n".join(refused)
    if stuck is not None:
        raise stuck
    rare = allowlisted(NAMESPACE)
    stale = rare - grants
    assert not stale, (
        f"{ALLOWLIST.name} names what the chart does not grant: {sorted(map(str, stale))}"
    )
    never = sorted(unused(grants, seen) - rare)
    assert not never, (
        "the chart grants what the operator never used (trim the rule, or add it to "
        f"{ALLOWLIST.name} with a reason):\n  "
        + "\n  ".join(map(str, never))
        + "\nused:\n  "
        + "\n  ".join(map(str, sorted(seen)))
    )
