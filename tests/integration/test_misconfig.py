"""Misconfiguration shows, it does not crash-loop (issue 24 step 4), on the real sandbox with
real operator and bridge processes: a bridge that refuses the operator's token (401), a bridge
URL where nothing listens, and a ServiceAccount whose RBAC lacks one verb (events list).

Each case: the process stays up and live (/healthz 200), /readyz answers 503 with the reason,
the reason is logged once (not at every retry), a Warning Event goes on the operator's Pod
(named by $POD_NAME/$POD_NAMESPACE/$POD_UID as the chart sets them; the test's namespace,
where an Event must name it), and where the fix can be
made without a restart (the token file), /readyz turns 200 and says so once.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.kube import cluster_bin_dir
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.bridge_harness import BridgeProcess
from tests.integration.operator_harness import REPO, OperatorProcess, free_port, wait_for

pytestmark = pytest.mark.integration

CHART = REPO / "deploy" / "helm" / "gpuheal"


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
        return int(resp.status)


def not_ready_lines(op: OperatorProcess) -> list[str]:
    return [line for line in op.log().splitlines() if "not ready: " in line]


def pod_events(sandbox: Sandbox, pod: str, namespace: str) -> list[dict[str, Any]]:
    out = sandbox.kubectl(
        "get", "events", "-n", namespace, "-o", "json",
        f"--field-selector=involvedObject.kind=Pod,involvedObject.name={pod}",
    )  # fmt: skip
    return list(json.loads(out.stdout)["items"])


def start(
    run_operator: Callable[..., OperatorProcess], *flags: str, pod: str, namespace: str
) -> tuple[OperatorProcess, int]:
    """The operator with a readiness port, as if in the Pod ``pod`` of ``namespace``."""
    port = free_port()
    op = run_operator(
        "--ready-port", str(port), *flags,
        env={"POD_NAME": pod, "POD_NAMESPACE": namespace, "POD_UID": str(uuid.uuid4())},
    )  # fmt: skip
    return op, port


def assert_stays_up_and_says_once(op: OperatorProcess, port: int, seconds: float) -> None:
    """Alive and live for ``seconds`` (several rounds of retries), one line said, no trace."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert op.proc is not None
        assert op.proc.poll() is None, op.log()[-3000:]
        assert healthz(op.health_port) == 200
        assert readyz(port)[0] == 503
        time.sleep(0.5)
    assert len(not_ready_lines(op)) == 1, not_ready_lines(op)
    assert "Traceback" not in op.log(), op.log()[-3000:]


def test_bridge_refusing_the_token_is_not_ready_saying_so_then_ready_once_fixed(
    sandbox: Sandbox,
    namespace: str,
    run_operator: Callable[..., OperatorProcess],
    run_bridge: Callable[..., BridgeProcess],
    slurm_cluster: SlurmCluster,
) -> None:
    bridge = run_bridge(slurm_cluster, token="the-right-token-0123456789abcdef")
    wrong = bridge.operator_token.with_name("wrong-token")
    wrong.write_text("a-token-the-bridge-never-issued")
    pod = f"gpuheal-{uuid.uuid4().hex[:6]}"
    op, port = start(
        run_operator,
        "--bridge-url", bridge.url, "--bridge-token-file", str(wrong),
        pod=pod, namespace=namespace,
    )  # fmt: skip
    _, body = wait_for(lambda: (r := readyz(port))[0] == 503 and r, "/readyz 503")
    assert f"the Slurm bridge at {bridge.url} refused the operator's token (401)" in body, body
    events = wait_for(lambda: pod_events(sandbox, pod, namespace), "the Event on the Pod")
    assert [(e["reason"], e["type"]) for e in events] == [("BridgeTokenRefused", "Warning")]
    assert "refused the operator's token (401)" in events[0]["message"]
    assert_stays_up_and_says_once(op, port, seconds=7)  # the bridge is asked every 5 s

    # The Secret fixed (its file rewritten, as the kubelet swaps it): ready, said once.
    wrong.write_text(bridge.operator_token.read_text())
    wait_for(lambda: readyz(port) == (200, "ready\n"), "/readyz 200 after the fix", timeout=20)
    assert sum("resolved: " in line for line in op.log().splitlines()) == 1
    assert len(pod_events(sandbox, pod, namespace)) == 1


def test_bridge_unreachable_is_not_ready_saying_so(
    sandbox: Sandbox,
    namespace: str,
    run_operator: Callable[..., OperatorProcess],
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text("any-token")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    pod = f"gpuheal-{uuid.uuid4().hex[:6]}"
    op, port = start(
        run_operator, "--bridge-url", url, "--bridge-token-file", str(token),
        pod=pod, namespace=namespace,
    )  # fmt: skip
    _, body = wait_for(lambda: (r := readyz(port))[0] == 503 and r, "/readyz 503")
    assert f"the Slurm bridge at {url} cannot be reached (ConnectError" in body, body
    events = wait_for(lambda: pod_events(sandbox, pod, namespace), "the Event on the Pod")
    assert [(e["reason"], e["type"]) for e in events] == [("BridgeUnreachable", "Warning")]
    assert_stays_up_and_says_once(op, port, seconds=7)


def _chart_rbac(namespace: str, release: str) -> list[dict[str, Any]]:
    """The chart's operator RBAC (ServiceAccount, roles, bindings) as helm renders it."""
    out = subprocess.run(
        [
            str(cluster_bin_dir() / "helm"), "template", release, str(CHART), "-n", namespace,
            "--set", "agent.enabled=false",
        ],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    here = {namespace, "default", None}  # not the node-jobs namespace: no Job runs here
    return [
        d
        for d in yaml.safe_load_all(out)
        if d and d.get("kind") in kinds and d["metadata"].get("namespace") in here
    ]


def test_rbac_lacking_events_list_is_not_ready_saying_so_once(
    sandbox: Sandbox,
    run_operator: Callable[..., OperatorProcess],
    namespace: str,
) -> None:
    """The chart's own RBAC, but the Role that lets the operator read Events about Nodes
    lacks `list`: the events source cannot start, which no retry fixes."""
    release = f"mc-{uuid.uuid4().hex[:6]}"
    docs = _chart_rbac(namespace, release)
    cut = 0
    for doc in docs:
        for rule in doc.get("rules") or []:
            if "events" in rule.get("resources", []) and "list" in rule.get("verbs", []):
                rule["verbs"] = [v for v in rule["verbs"] if v != "list"]
                cut += 1
    assert cut == 1, "the chart's RBAC changed: which Role reads Events?"
    sandbox.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    try:
        sa = f"{release}-gpuheal"  # the operator's (the chart's others: tests, gpu-reset)
        kubeconfig = sandbox.control_plane.kubeconfig_for_service_account(namespace, sa)
        config = yaml.safe_load(kubeconfig.read_text())
        for context in config["contexts"]:  # as in a pod: kopf posts into its namespace
            context["context"]["namespace"] = namespace
        kubeconfig.write_text(yaml.safe_dump(config))
        pod = f"gpuheal-{uuid.uuid4().hex[:6]}"
        op, port = start(
            run_operator, "--kubeconfig", str(kubeconfig), "--namespace", namespace,
            pod=pod, namespace=namespace,
        )  # fmt: skip
        _, body = wait_for(lambda: (r := readyz(port))[0] == 503 and r, "/readyz 503")
        assert "the API server forbids reading events: " in body, body
        assert 'cannot list resource "events"' in body, body
        events = wait_for(lambda: pod_events(sandbox, pod, namespace), "the Event on the Pod")
        assert [(e["reason"], e["type"]) for e in events] == [("Forbidden", "Warning")]
        # The watch relists at 1, 2, 4 s...: a warning each time before; one line now.
        assert_stays_up_and_says_once(op, port, seconds=8)
        assert "events source blind" not in op.log()
    finally:
        sandbox.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false",
                        input=yaml.safe_dump_all(docs), check=False)  # fmt: skip
