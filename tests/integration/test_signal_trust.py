"""Who may make gpuheal act (docs/security.md), on the real sandbox with the chart installed
(its ValidatingAdmissionPolicy in force) and the operator trusting what the chart passes it
(`--trusted-reporters gpuheal-agent`):

- an ordinary ServiceAccount that may create Events (as many controllers and CI accounts may)
  cannot post as the agent: the API server refuses it, naming the reserved reporter;
- what it can post, a GpuXid Event in node-problem-detector's name about a managed node,
  starts nothing (no incident, no cordon) and gets a Warning on the Node naming the reporter;
- the agent's own Event, from its ServiceAccount with a token bound to its pod on that node,
  starts the incident; the same token cannot post about another node.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from gpuheal.cli.simulate import kernel_line, xid_event
from gpuheal_dev.sandbox import Sandbox
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    cordon_only_rule,
    hold,
    policy,
    wait_for,
)
from tests.integration.test_agent_sandbox import (  # noqa: F401 - fixtures
    FAULT_LOG,
    delete_agent_events,
    node_agent_kubeconfig,
    release,
    run_agent,
)

pytestmark = pytest.mark.integration


def _core(kubeconfig: Path) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))


@pytest.fixture
def ci_bot(
    sandbox: Sandbox,
    release: tuple[str, str],  # noqa: F811
) -> Iterator[tuple[str, Path]]:
    """An ordinary ServiceAccount allowed to create Events in `default` (nothing else):
    (its user name, a kubeconfig with its token)."""
    _, namespace = release
    name = f"ci-bot-{uuid.uuid4().hex[:6]}"
    sandbox.kubectl("create", "serviceaccount", name, "-n", namespace)
    sandbox.kubectl(
        "create", "role", name, "-n", "default", "--verb=create,get,patch",
        "--resource=events,events.events.k8s.io",
    )  # fmt: skip
    sandbox.kubectl(
        "create", "rolebinding", name, "-n", "default", f"--role={name}",
        f"--serviceaccount={namespace}:{name}",
    )  # fmt: skip
    try:
        yield (
            f"system:serviceaccount:{namespace}:{name}",
            sandbox.control_plane.kubeconfig_for_service_account(namespace, name),
        )
    finally:
        sandbox.kubectl("delete", "rolebinding,role", name, "-n", "default", check=False)


def _forged(core: client.CoreV1Api, node: dict[str, Any], reporter: str) -> dict[str, Any]:
    """A GpuXid Event about ``node`` exactly as node-problem-detector posts one, naming
    ``reporter``, created through ``core``."""
    body = xid_event(node, kernel_line(79))
    body["source"]["component"] = body["reportingComponent"] = reporter
    created = core.api_client.sanitize_for_serialization(
        core.create_namespaced_event("default", body)
    )
    return dict(created)


def _forged_v1(api: client.ApiClient, node: dict[str, Any], reporter: str) -> dict[str, Any]:
    """The same through events.k8s.io/v1 (reportingController, regarding, note)."""
    meta = node["metadata"]
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    body = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:8]}", "namespace": "default"},
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta["uid"]},
        "reason": "GpuXid",
        "note": kernel_line(79),
        "type": "Warning",
        "action": "Detected",
        "eventTime": now,
        "reportingController": reporter,
        "reportingInstance": meta["name"],
    }
    created = client.EventsV1Api(api).create_namespaced_event("default", body)
    return dict(api.sanitize_for_serialization(created))


def _refusal(
    core: client.CoreV1Api,
    node: dict[str, Any],
    reporter: str,
    admin: client.CoreV1Api,
    *,
    events_v1: bool = False,
) -> str | None:
    """The API server's refusal of a forged Event, or None (then ``admin`` deletes it again:
    the admission policy is not in force yet)."""
    try:
        made = (
            _forged_v1(core.api_client, node, reporter)
            if events_v1
            else _forged(core, node, reporter)
        )
    except ApiException as exc:
        if exc.status != 403:
            raise
        return str(json.loads(exc.body)["message"])
    admin.delete_namespaced_event(made["metadata"]["name"], "default")
    return None


def _warnings(sandbox: Sandbox, node: str) -> list[dict[str, Any]]:
    out = sandbox.kubectl(
        "get", "events", "-n", "default", "-o", "json",
        f"--field-selector=involvedObject.kind=Node,involvedObject.name={node},"
        "reason=UntrustedSignal",
    )  # fmt: skip
    return list(json.loads(out.stdout)["items"])


def test_a_forged_event_starts_nothing_while_the_agents_own_event_does(  # noqa: PLR0917
    sandbox: Sandbox,
    release: tuple[str, str],  # noqa: F811
    ci_bot: tuple[str, Path],
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
    tmp_path: Path,
) -> None:
    forged_on, agent_on = case(2)
    case_id = case.case_id  # type: ignore[attr-defined]
    objects.apply(
        "remediationpolicies", policy(f"trust-{case_id}", f"{case_id}-work", [cordon_only_rule(79)])
    )
    op = run_operator("--trusted-reporters", "gpuheal-agent")  # what the chart passes
    bot_user, bot_kubeconfig = ci_bot
    bot = _core(bot_kubeconfig)
    admin = sandbox.core_v1()
    nodes = {
        n: admin.api_client.sanitize_for_serialization(admin.read_node(n))
        for n in (forged_on, agent_on)
    }
    try:
        # The agent's name is reserved: refused at admission (once the policy is in force).
        refused = wait_for(
            lambda: _refusal(bot, nodes[forged_on], "gpuheal-agent", admin),
            "the chart's admission policy in force",
            timeout=30,
        )
        assert "the reporter gpuheal-agent is reserved" in refused, refused
        assert bot_user in refused, refused
        assert f"an Event about node {forged_on}" in refused, refused
        refused = _refusal(bot, nodes[forged_on], "gpuheal-agent", admin, events_v1=True)
        assert refused is not None  # events.k8s.io/v1's reportingController is the same name
        assert "the reporter gpuheal-agent is reserved" in refused, refused

        # Node-problem-detector's name is not reserved: admitted, and ignored with a Warning.
        forged = _forged(bot, nodes[forged_on], "kernel-monitor")
        (warning,) = wait_for(lambda: _warnings(sandbox, forged_on), "an UntrustedSignal Warning")
        assert warning["type"] == "Warning"
        assert "from reporter 'kernel-monitor', not a trusted one" in warning["message"]
        assert forged["metadata"]["name"] in warning["message"]
        hold(
            lambda: (
                not objects.incidents(forged_on) and not objects.node(forged_on).spec.unschedulable
            ),
            "no incident and no cordon for the forged Event",
            seconds=5,
        )
        assert op.metrics().get('gpuheal_signals_total{result="untrusted",source="events"}', 0) >= 1

        # The agent on its node: its token, bound to its pod there, posts the XID.
        agent_kubeconfig = node_agent_kubeconfig(sandbox, release, agent_on)
        log = tmp_path / "kern.log"
        log.write_text("\n".join(FAULT_LOG.splitlines()[:2] + FAULT_LOG.splitlines()[10:15]))
        run_agent(agent_kubeconfig, agent_on, log)
        incident = wait_for(lambda: objects.incident(agent_on), "the agent's incident")
        assert incident["spec"]["signals"][0]["xid"] == 79
        wait_for(lambda: objects.node(agent_on).spec.unschedulable, "the agent's node cordoned")

        # ... and about its own node only.
        refused = _refusal(_core(agent_kubeconfig), nodes[forged_on], "gpuheal-agent", admin)
        assert refused is not None
        assert f"token bound to a pod on node {agent_on}" in refused, refused
        assert objects.incidents(forged_on) == []
    finally:
        delete_agent_events(sandbox, agent_on)
        sandbox.kubectl(
            "delete", "events", "-n", "default",
            f"--field-selector=involvedObject.kind=Node,involvedObject.name={forged_on}",
            check=False,
        )  # fmt: skip


def _xid_in(
    core: client.CoreV1Api, node: dict[str, Any], namespace: str, uid: str | None = None
) -> dict[str, Any]:
    """node-problem-detector's XID 79 Event about ``node`` (reporter `kernel-monitor`, trusted
    by the harness's operator), created in ``namespace``; ``uid``: the Node uid it names."""
    body = xid_event(node, kernel_line(79), namespace=namespace)
    if namespace != "default":  # how the API server admits an Event about a Node elsewhere
        body["involvedObject"]["namespace"] = namespace
    if uid is not None:
        body["involvedObject"]["uid"] = uid
    made = core.create_namespaced_event(namespace, body)
    return dict(core.api_client.sanitize_for_serialization(made))


def test_an_event_from_another_namespace_starts_nothing_the_same_in_default_does(
    sandbox: Sandbox,
    namespace: str,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """Whoever may create Events in some namespace (a CI account in its own) cannot reach a
    Node through it: the operator reads Events in --event-namespace (default `default`) only."""
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    objects.apply("remediationpolicies", policy(f"ns-{cid}", f"{cid}-work", [cordon_only_rule(79)]))
    admin = sandbox.core_v1()
    body = admin.api_client.sanitize_for_serialization(admin.read_node(node))
    run_operator()
    try:
        elsewhere = _xid_in(admin, body, namespace)
        assert elsewhere["involvedObject"]["name"] == node  # admitted: an Event about the Node
        hold(
            lambda: not objects.incidents(node) and not objects.node(node).spec.unschedulable,
            "no incident and no cordon for the Event in another namespace",
            seconds=6,
        )
        _xid_in(admin, body, "default")  # the very same Event where gpuheal reads
        wait_for(lambda: objects.incident(node), "the incident of the Event in default")
        wait_for(lambda: objects.node(node).spec.unschedulable, "the node cordoned")
    finally:
        sandbox.kubectl(
            "delete", "events", "-n", "default",
            f"--field-selector=involvedObject.kind=Node,involvedObject.name={node}",
            check=False,
        )  # fmt: skip


def test_an_event_naming_another_node_uid_starts_nothing(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """An Event about an earlier Node of the same name (deleted, created again) or with a
    made-up uid: counted, one UntrustedSignal Warning that says so, nothing else; the same
    Event naming the Node's uid acts."""
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    objects.apply(
        "remediationpolicies", policy(f"uid-{cid}", f"{cid}-work", [cordon_only_rule(79)])
    )
    admin = sandbox.core_v1()
    body = admin.api_client.sanitize_for_serialization(admin.read_node(node))
    op = run_operator()
    try:
        stale = _xid_in(admin, body, "default", uid=str(uuid.uuid4()))
        (warning,) = wait_for(lambda: _warnings(sandbox, node), "an UntrustedSignal Warning")
        assert (
            f"Event default/{stale['metadata']['name']} is about node {node} with uid"
            in (warning["message"])
        )
        assert f"not this Node's uid {body['metadata']['uid']}" in warning["message"]
        hold(
            lambda: not objects.incidents(node) and not objects.node(node).spec.unschedulable,
            "no incident and no cordon for the Event naming another uid",
            seconds=5,
        )
        assert op.metrics().get('gpuheal_signals_total{result="wrong_uid",source="events"}') == 1
        _xid_in(admin, body, "default", uid=body["metadata"]["uid"])
        wait_for(lambda: objects.incident(node), "the incident of the Event naming the Node's uid")
    finally:
        sandbox.kubectl(
            "delete", "events", "-n", "default",
            f"--field-selector=involvedObject.kind=Node,involvedObject.name={node}",
            check=False,
        )  # fmt: skip
