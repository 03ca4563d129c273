"""Run the real operator (`python -m gpuheal run`) against the sandbox, as a process
that a test can SIGKILL and start again; plus small waiting and object helpers."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes import client
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from gpuheal.cli.simulate import simulate_xid
from gpuheal.remediation.lease import LEASE_NAME
from gpuheal.xid.identity import (
    GPU_MAP_ANNOTATION,
    GPU_REPORT_ANNOTATION,
    format_gpu_map,
    format_gpu_report,
)
from gpuheal_dev.sandbox._proc import free_tcp_ports

if TYPE_CHECKING:
    from gpuheal_dev.sandbox import Sandbox
    from gpuheal_dev.sandbox.slurm import SlurmCluster

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION = "gpuheal.io", "v1alpha1"
LEASE_NAMESPACE = "default"  # the operator's own namespace as `OperatorProcess` runs it


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range: a port the kernel handed out
    (bind to 0) can be taken as the source port of any outgoing connection before the server
    binds it, and the suite makes thousands of them on four workers."""
    return free_tcp_ports(1)[0]


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {value!r}")


def hold(check: Callable[[], Any], what: str, seconds: float, every: float = 0.25) -> None:
    """Assert that ``check()`` stays truthy for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check(), f"{what} stopped holding"
        time.sleep(every)


@dataclass
class OperatorProcess:
    kubeconfig: Path
    log_dir: Path
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    health_port: int = 0
    starts: int = 0

    def start(self, *, wait_started: bool = True) -> OperatorProcess:
        self.metrics_port, self.health_port = free_port(), free_port()
        self.starts += 1
        log = (self.log_dir / f"operator-{self.starts}.log").open("wb")
        args = [
            sys.executable, "-m", "gpuheal", "run",
            "--kubeconfig", str(self.kubeconfig),
            "--metrics-port", str(self.metrics_port),
            "--health-port", str(self.health_port),
            "--namespace", LEASE_NAMESPACE,
            "--log-format", "json",
            "--retry-interval", "0.5",
            # The chart's Lease (15 s): a shorter one is lost whenever a loaded machine holds
            # the event loop past its renew deadline, and the tests about the Lease pass 3.
            # A test that kills a process deletes its dead Lease (`delete_dead_lease`).
            "--lease-duration", "15",
            "--sources", "conditions,events",
            # The tests' faults are what node-problem-detector's kernel monitor posts
            # (`gpuheal simulate xid`); the trust tests pass the default back.
            "--trusted-reporters", "gpuheal-agent,kernel-monitor",
            *self.extra,
        ]  # fmt: skip
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO / 'operator'}:{REPO / 'slurm-bridge'}",
            **self.env,
        }
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        if wait_started:
            # Polled often: a local request and a file; each of the suite's hundreds of starts
            # waits half a poll on average, twice.
            wait_for(self._healthy, "operator liveness endpoint", timeout=60, every=0.05)
            wait_for(
                lambda: "gpuheal started" in self.log(), "operator start-up", timeout=60, every=0.05
            )
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log()[-3000:]}")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}/healthz", timeout=1
            ) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def log(self) -> str:
        return (self.log_dir / f"operator-{self.starts}.log").read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as resp:
            text = resp.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("gpuheal_"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def delete_dead_lease(self) -> None:
        """After this process died holding the Lease, delete it, as a person would
        (`kubectl delete lease`) rather than wait it out: the next process leads at once. Only
        if this process, dead, still holds it (the holder named in its log, the delete made
        on the resourceVersion read), so that a live leader's Lease is never taken away."""
        assert self.proc is not None
        assert self.proc.poll() is not None, "still running: its Lease is not a dead one"
        held = re.findall(
            rf"holding Lease {LEASE_NAMESPACE}/{LEASE_NAME} as ([^\s\"]+)", self.log()
        )
        assert held, f"the process never held the Lease:\n{self.log()[-3000:]}"
        api = client.CoordinationV1Api(k8s_config.new_client_from_config(str(self.kubeconfig)))
        try:
            lease = api.read_namespaced_lease(LEASE_NAME, LEASE_NAMESPACE)
            if lease.spec.holder_identity != held[-1]:
                return  # released or taken over already: nothing to free
            api.delete_namespaced_lease(
                LEASE_NAME,
                LEASE_NAMESPACE,
                body=client.V1DeleteOptions(
                    preconditions=client.V1Preconditions(
                        resource_version=lease.metadata.resource_version
                    )
                ),
            )
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone, or written since: not ours to delete
                raise
        finally:
            api.api_client.close()

    def kill(self) -> None:
        """SIGKILL: no clean-up handlers run (a crash or an OOM kill)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


class Objects:
    """gpuheal objects and Nodes through the sync client (test side)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.created: list[tuple[str, str]] = []

    def apply(self, plural: str, manifest: str | dict[str, Any]) -> dict[str, Any]:
        body = yaml.safe_load(manifest) if isinstance(manifest, str) else manifest
        name = body["metadata"]["name"]
        try:
            out = self.custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            out = self.custom.patch_cluster_custom_object(GROUP, VERSION, plural, name, body)
        self.created.append((plural, name))
        return dict(out)

    def patch(self, plural: str, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_cluster_custom_object(GROUP, VERSION, plural, name, patch)

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.custom.get_cluster_custom_object(GROUP, VERSION, plural, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def incidents(self, node: str) -> list[dict[str, Any]]:
        items = self.custom.list_cluster_custom_object(
            GROUP, VERSION, "noderemediations", label_selector=f"gpuheal.io/node={node}"
        )["items"]
        return list(items)

    def incident(self, node: str) -> dict[str, Any] | None:
        items = self.incidents(node)
        assert len(items) <= 1, f"{len(items)} incidents for {node}"
        return items[0] if items else None

    def node(self, name: str) -> client.V1Node:
        return self.core.read_node(name)

    def cleanup(self, nodes: list[str]) -> None:
        for node in nodes:
            for item in self.incidents(node):
                self.delete("noderemediations", item["metadata"]["name"])
        for plural, name in reversed(self.created):
            self.delete(plural, name)

    def delete(self, plural: str, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    if not obj:
        return None
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), None)


def completed(obj: dict[str, Any] | None) -> str | None:
    c = condition(obj, "Completed")
    return c["reason"] if c and c["status"] == "True" else None


def node_events(core: client.CoreV1Api, name: str, kind: str = "Node") -> list[Any]:
    sel = f"involvedObject.kind={kind},involvedObject.name={name}"
    return list(core.list_event_for_all_namespaces(field_selector=sel).items)


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)[:4000]


SANDBOX_GPUS = {
    f"0000:{0x18 + i:02x}:00": f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(8)
}


def agent_reports_gpus(core: client.CoreV1Api, node: str, *, ago: float = 0.0) -> None:
    """Write what gpuheal agent with NVML writes on its node: the GPUs it knows (PCI address ->
    UUID) and those it sees, dated ``ago`` seconds back (its start); what proves a reset."""
    seen = format_gpu_report(dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ago), SANDBOX_GPUS)
    agent = {GPU_MAP_ANNOTATION: format_gpu_map(SANDBOX_GPUS), GPU_REPORT_ANNOTATION: seen}
    core.patch_node(node, {"metadata": {"annotations": agent}})


# --- the objects a test applies: policies, pools, rules, pods ----------------------------------
def policy(
    name: str,
    case_label: str,
    rules: list[dict[str, Any]],
    *,
    max_unhealthy: int | str = 5,
    healthy_for: str = "1h",
    **safety: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {"gpuheal.io/case": case_label}},
            "rules": rules,
            "safety": {"maxUnhealthy": max_unhealthy, "stormCooldown": "0s", **safety},
            "returnToService": {"enabled": True, "healthyFor": healthy_for},
        },
    }


def pool(name: str, case_label: str) -> dict[str, Any]:
    return {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "ReservePool",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {"gpuheal.io/case": case_label}},
            "minAvailable": 1,
            "promotion": {"setLabels": {"gpuheal.io/promoted": "true"}},
        },
    }


def xid79_rule(pool_name: str, drain: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": "fell-off-bus",
        "signals": {"xids": [79]},
        "ladder": [
            {
                "name": "replace",
                "steps": [
                    {"action": "cordon"},
                    {"action": "slurmDrain", "slurmDrain": {"requeue": "requeue"}},
                    {"action": "drain", "drain": drain or {"timeout": "5m"}},
                    {"action": "replace", "replace": {"reservePoolRef": {"name": pool_name}}},
                ],
            }
        ],
    }


def cordon_only_rule(xid: int = 94, *, reset: bool = False) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"action": "cordon"}]
    if reset:
        steps.append({"action": "reset", "reset": {"hook": {"type": "Noop"}}})
    return {
        "name": f"xid-{xid}",
        "signals": {"xids": [xid]},
        "ladder": [{"name": "cordon", "steps": steps}],
    }


def pod_on(node: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "train", "image": "example.invalid/train:1"}],
        },
    }


def pod_gone(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        return exc.status == 404
    return False


def pdb_blocking(sandbox: Sandbox, namespace: str, node: str) -> client.PolicyV1Api:
    """A Running pod on ``node`` held by a PodDisruptionBudget that allows no disruption."""
    core = sandbox.core_v1()
    pol = client.PolicyV1Api(sandbox.api_client())
    core.create_namespaced_pod(namespace, pod_on(node, "victim", {"app": "held"}))
    wait_for(
        lambda: core.read_namespaced_pod("victim", namespace).status.phase == "Running",
        "victim Running",
    )
    pol.create_namespaced_pod_disruption_budget(
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "keep"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "held"}}},
        },
    )
    wait_for(
        lambda: (
            pol.read_namespaced_pod_disruption_budget("keep", namespace).status.current_healthy == 1
        ),
        "PDB status computed",
    )
    return pol


def release_pdb(pol: client.PolicyV1Api, namespace: str) -> None:
    pol.patch_namespaced_pod_disruption_budget("keep", namespace, {"spec": {"minAvailable": 0}})


@dataclass
class Xid79Scene:
    """A GPU node under a policy, an XID 79 Event about it, the operator acting.

    ``work`` are the policy's nodes (``broken`` is the first), ``spares`` the reserve pool's;
    with Slurm, one cluster of all of them (same names) with the spares drained as the pool
    leaves them ("reserve pool") and a bridge in front of it. The operator runs once the test
    has set the rest of its world up (``start``); ``xid`` posts the Event."""

    cid: str
    work: list[str]
    spares: list[str]
    policy: str
    pool: str | None
    objects: Objects
    core: client.CoreV1Api
    run_operator: Callable[..., OperatorProcess] = field(repr=False)
    cluster: SlurmCluster | None = None
    bridge_url: str = ""
    bridge_token: Path | None = None
    bridge_proc: subprocess.Popen[bytes] | None = None
    op: OperatorProcess | None = None

    @property
    def broken(self) -> str:
        return self.work[0]

    @property
    def bridge_port(self) -> int:
        return int(self.bridge_url.rsplit(":", 1)[1])

    def bridge_args(self) -> list[str]:
        if self.bridge_token is None:
            return []
        return ["--bridge-url", self.bridge_url, "--bridge-token-file", str(self.bridge_token)]

    def start(self, *extra: str, **kwargs: Any) -> OperatorProcess:
        """The operator (with this scene's bridge, if any); ``kwargs`` go to run_operator."""
        self.op = self.run_operator(*self.bridge_args(), *extra, **kwargs)
        return self.op

    def xid(self, node: str | None = None) -> None:
        simulate_xid(self.core, node or self.broken, 79)

    def incident(self) -> dict[str, Any] | None:
        return self.objects.incident(self.broken)

    def completed(self, what: str = "incident completed", timeout: float = 90) -> dict[str, Any]:
        done: dict[str, Any] = wait_for(
            lambda: completed(o := self.incident()) and o, what, timeout=timeout
        )
        return done
