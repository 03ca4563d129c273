"""`gpuheal agent` on the real sandbox, no mocks.

- The chart installs the agent DaemonSet on the real apiserver; kwok runs its pods on the GPU
  nodes only; `kubectl auth can-i` as its ServiceAccount allows exactly what the agent calls.
- The agent replays kernel logs (`--once --kmsg FILE --node <kwok node>`) with nothing but that
  ServiceAccount's token: the right Events (XID, GPU PCI address and UUID), repeats counted on
  one Event, the GpuXid condition and the GPU map annotation, nothing for look-alikes, and a
  restart (with or without its state file) posts nothing again.
- With the operator running: one incident per real fault, none for look-alikes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal.xid import GPU_MAP_ANNOTATION, parse_event, parse_gpu_map, parse_sxid_event
from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.kube import cluster_bin_dir
from tests.integration.operator_harness import (
    REPO,
    Objects,
    OperatorProcess,
    free_port,
    hold,
    wait_for,
)

# One worker for the module: its chart install (module-scoped, ~6 s) is then made once, not
# once on each worker that runs one of its items.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("agent-chart")]

CHART = REPO / "deploy" / "helm" / "gpuheal"
GPUHEAL_CRDS = (
    "noderemediations.gpuheal.io",
    "remediationpolicies.gpuheal.io",
    "reservepools.gpuheal.io",
    "faulthistories.gpuheal.io",  # applied already when another module's fixture came first
)
UUID_A = "GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7"
UUID_B = "GPU-0b6b7808-c002-f593-ac86-cd8e57757b94"

# A GPU node's kernel log, the shapes from tests/data/xid_corpus.yaml: dmesg prefixes, the
# driver's identity lines, one XID 79 with the multi-line fallen-off message next to it (one
# fault), three XID 13 on another GPU (one Event, count 3), an NVSwitch SXid, look-alikes.
KERNEL_LOGS = REPO / "tests" / "data" / "kernel-logs"
# A GPU node's kernel log in the shapes of tests/data/xid_corpus.yaml: dmesg prefixes, the
# driver's identity lines (UUID_A, UUID_B), one XID 79 with the multi-line fallen-off message
# next to it (one fault), three XID 13 on another GPU (one Event, count 3), an NVSwitch SXid,
# and look-alikes; and a log of look-alikes only.
FAULT_LOG = (KERNEL_LOGS / "gpu-node-faults.log").read_text()
LOOK_ALIKES = (KERNEL_LOGS / "look-alikes.log").read_text()


# --- helpers ------------------------------------------------------------------------------------


def _helm(sandbox: Sandbox, home: Path, *args: str, check: bool = True) -> str:
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    result = subprocess.run(
        [str(cluster_bin_dir() / "helm"), *args, f"--kubeconfig={sandbox.kubeconfig}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def release(
    sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """The chart installed with its defaults (agent on) -> (release, namespace)."""
    name = f"ag-{uuid.uuid4().hex[:6]}"
    namespace = f"t-{name}"
    sandbox.kubectl("create", "namespace", namespace)
    for crd in GPUHEAL_CRDS:  # CRDs from other tests: hand them over, as Helm documents
        if sandbox.kubectl("get", "crd", crd, check=False).returncode != 0:
            continue
        sandbox.kubectl("label", "crd", crd, "--overwrite", "app.kubernetes.io/managed-by=Helm")
        sandbox.kubectl(
            "annotate", "crd", crd, "--overwrite",
            f"meta.helm.sh/release-name={name}", f"meta.helm.sh/release-namespace={namespace}",
        )  # fmt: skip
    home = tmp_path_factory.mktemp("helm-home")
    _helm(sandbox, home, "install", name, str(CHART), "-n", namespace)
    try:
        yield name, namespace
    finally:
        _helm(sandbox, home, "uninstall", name, "-n", namespace, check=False)
        sandbox.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def agent_namespace(release: tuple[str, str]) -> str:
    """Where the chart runs the agent by default: a namespace of its own, <release>-agent,
    with its ServiceAccount (the release namespace can then enforce `restricted`)."""
    name, _ = release
    return f"{name}-agent"


@pytest.fixture(scope="module")
def agent_kubeconfig(sandbox: Sandbox, release: tuple[str, str]) -> Path:
    """The agent's ServiceAccount, token bound to no pod: what RBAC alone allows."""
    name, _ = release
    return sandbox.control_plane.kubeconfig_for_service_account(
        agent_namespace(release), f"{name}-gpuheal-agent"
    )


def agent_pod(sandbox: Sandbox, release: tuple[str, str], node: str) -> str:
    """The DaemonSet's pod on ``node`` (kwok runs it), once Running."""
    namespace = agent_namespace(release)

    def find() -> str | None:
        out = sandbox.kubectl(
            "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=agent",
            f"--field-selector=spec.nodeName={node},status.phase=Running", "-o", "json",
        )  # fmt: skip
        items = json.loads(out.stdout)["items"]
        return str(items[0]["metadata"]["name"]) if items else None

    return str(wait_for(find, f"the agent pod on {node}"))


def node_agent_kubeconfig(sandbox: Sandbox, release: tuple[str, str], node: str) -> Path:
    """The agent's credentials on ``node`` as the kubelet mounts them: the ServiceAccount's
    token bound to the agent pod there (the chart's admission policy admits the agent's
    Events about that node only with such a token)."""
    name, _ = release
    return sandbox.control_plane.kubeconfig_for_service_account(
        agent_namespace(release),
        f"{name}-gpuheal-agent",
        bound_pod=agent_pod(sandbox, release, node),
    )


@pytest.fixture
def node_kubeconfig(sandbox: Sandbox, release: tuple[str, str], agent_node: str) -> Path:
    return node_agent_kubeconfig(sandbox, release, agent_node)


@pytest.fixture
def agent_node(sandbox: Sandbox, own_gpu_nodes: Callable[..., list[str]]) -> Iterator[str]:
    """A fresh kwok GPU node; the agent's Events about it are deleted afterwards (no stale XID
    for operators that later tests start)."""
    (node,) = own_gpu_nodes(1)
    yield node
    delete_agent_events(sandbox, node)


def delete_agent_events(sandbox: Sandbox, node: str) -> None:
    for e in events_of(sandbox, node):
        sandbox.kubectl(
            "delete", "event", e["metadata"]["name"], "-n", e["metadata"]["namespace"],
            "--ignore-not-found",
        )  # fmt: skip


def run_agent(
    kubeconfig: Path, node: str, log: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """`python -m gpuheal.agent --once`, the DaemonSet's command, with only this kubeconfig."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "GPUHEAL_"))}
    env["PYTHONPATH"] = f"{REPO / 'operator'}"
    args = [
        sys.executable, "-m", "gpuheal.agent", "--once", f"--kmsg={log}", f"--node={node}",
        f"--kubeconfig={kubeconfig}", "--nvml=off", *extra,
    ]  # fmt: skip
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 0, f"agent exited {result.returncode}:\n{result.stderr[-3000:]}"
    # (the log's timestamps carry milliseconds, which may read 403)
    untimed = re.sub(r"^\S+ \d\d:\d\d:\d\d,\d{3} ", "", result.stderr, flags=re.M)
    assert "403" not in untimed, result.stderr
    assert "orbidden" not in result.stderr, result.stderr
    return result


def events_of(sandbox: Sandbox, node: str) -> list[dict[str, Any]]:
    out = sandbox.kubectl(
        "get", "events", "--all-namespaces", "-o", "json",
        f"--field-selector=involvedObject.kind=Node,involvedObject.name={node}",
    )  # fmt: skip
    items = json.loads(out.stdout)["items"]
    return [e for e in items if (e.get("source") or {}).get("component") == "gpuheal-agent"]


def node_obj(sandbox: Sandbox, node: str) -> dict[str, Any]:
    return dict(json.loads(sandbox.kubectl("get", "node", node, "-o", "json").stdout))


def gpu_xid_condition(sandbox: Sandbox, node: str) -> dict[str, Any] | None:
    conds = node_obj(sandbox, node)["status"].get("conditions") or []
    return next((c for c in conds if c["type"] == "GpuXid"), None)


def summary(events: list[dict[str, Any]]) -> list[tuple[str, int | None, str | None, int]]:
    """(reason, xid or sxid, GPU/switch PCI, count) per Event, read the way the operator does."""
    out = []
    for e in events:
        xid = parse_event(e["reason"], e["message"])
        if xid is not None:
            out.append((e["reason"], xid.xid, xid.pci_bus_id, e["count"]))
            continue
        sxid = parse_sxid_event(e["reason"], e["message"])
        assert sxid is not None, f"an agent Event neither XID nor SXid: {e['message']}"
        out.append((e["reason"], sxid.sxid, sxid.pci_bus_id, e["count"]))
    return sorted(out, key=lambda t: (t[0], t[1] or 0))


# --- the chart ----------------------------------------------------------------------------------


def test_chart_runs_the_daemonset_on_gpu_nodes_only(
    sandbox: Sandbox, release: tuple[str, str], own_gpu_nodes: Callable[..., list[str]]
) -> None:
    name, _ = release
    namespace = agent_namespace(release)  # the chart's default: apart from the operator
    (gpu,) = own_gpu_nodes(1)
    from gpuheal_dev.sandbox.nodes import create_gpu_nodes, delete_nodes, wait_nodes_ready

    core = sandbox.core_v1()
    cpu = f"t-cpu-{uuid.uuid4().hex[:6]}"
    create_gpu_nodes(core, [cpu], gpus=0, labels={"nvidia.com/gpu.present": "false"})
    try:
        wait_nodes_ready(core, [cpu])
        # A cordoned GPU node (what gpuheal does to a faulty node) keeps its agent.
        sandbox.kubectl("cordon", gpu)

        def pods_by_node() -> dict[str, str]:
            out = sandbox.kubectl(
                "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=agent",
                "-o", "json",
            )  # fmt: skip
            items = json.loads(out.stdout)["items"]
            return {
                p["spec"].get("nodeName", ""): (p.get("status") or {}).get("phase", "")
                for p in items
            }

        wait_for(lambda: pods_by_node().get(gpu) == "Running", f"agent pod running on {gpu}")
        hold(lambda: cpu not in pods_by_node(), "no agent on the non-GPU node", seconds=3)
        ds = json.loads(
            sandbox.kubectl(
                "get", "ds", f"{name}-gpuheal-agent", "-n", namespace, "-o", "json"
            ).stdout
        )
        pod = ds["spec"]["template"]["spec"]
        for node in pods_by_node():
            labels = node_obj(sandbox, node)["metadata"]["labels"]
            assert labels.get("nvidia.com/gpu.present") == "true", node
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "kernel-log"]
        assert mount == {"name": "kernel-log", "mountPath": "/dev/kmsg", "readOnly": True}
        assert pod["serviceAccountName"] == f"{name}-gpuheal-agent"
        # The chart made that namespace, allowing the agent's privileged pods.
        labels = json.loads(sandbox.kubectl("get", "ns", namespace, "-o", "json").stdout)[
            "metadata"
        ]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "privileged", labels
    finally:
        delete_nodes(core, [cpu])


# (verb, resource, namespace or None = cluster-wide)
AGENT_NEEDS = [
    ("get", "nodes", None),
    ("patch", "nodes/status", None),
    ("create", "events", "default"),  # Events about Nodes are accepted only in `default`
    ("get", "events", "default"),
    ("patch", "events", "default"),
]
AGENT_MUST_NOT = [
    ("list", "nodes", None),
    ("watch", "nodes", None),
    ("patch", "nodes", None),  # cordon, labels, taints: never
    ("update", "nodes", None),
    ("delete", "nodes", None),
    ("update", "nodes/status", None),
    ("create", "events", "$ns"),
    ("create", "events", "kube-system"),
    ("list", "events", "default"),
    ("delete", "events", "default"),
    ("list", "pods", None),
    ("create", "pods/eviction", "$ns"),
    ("get", "secrets", "$ns"),
    ("list", "configmaps", "$ns"),
    ("patch", "noderemediations.gpuheal.io", None),
    ("create", "serviceaccounts/token", "$ns"),
    # its own namespace ($agent) holds nothing it may touch either
    ("get", "secrets", "$agent"),
    ("list", "pods", "$agent"),
    ("create", "events", "$agent"),
    ("create", "serviceaccounts/token", "$agent"),
]


def _can_i(sandbox: Sandbox, kubeconfig: Path, verb: str, resource: str, ns: str | None) -> bool:
    base, _, sub = resource.partition("/")
    args = [verb, base, f"--subresource={sub}"] if sub in ("status", "eviction", "token") else [
        verb, resource
    ]  # fmt: skip
    args += ["-n", ns] if ns else ["--all-namespaces"]
    result = sandbox.control_plane.kubectl(
        "auth", "can-i", *args, check=False, kubeconfig=kubeconfig
    )
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), f"can-i {args}: {result.stdout}{result.stderr}"
    return answer == "yes"


def test_agent_service_account_can_exactly_what_the_agent_calls(
    sandbox: Sandbox, release: tuple[str, str], agent_kubeconfig: Path
) -> None:
    _, namespace = release

    def ns(value: str | None) -> str | None:
        if value is None:
            return None
        return value.replace("$ns", namespace).replace("$agent", agent_namespace(release))

    missing = [
        r for r in AGENT_NEEDS if not _can_i(sandbox, agent_kubeconfig, r[0], r[1], ns(r[2]))
    ]
    assert not missing, f"the agent's ServiceAccount lacks: {missing}"
    excess = [r for r in AGENT_MUST_NOT if _can_i(sandbox, agent_kubeconfig, r[0], r[1], ns(r[2]))]
    assert not excess, f"the agent's ServiceAccount may do too much: {excess}"


# --- replaying kernel logs ---------------------------------------------------------------------


def test_replay_posts_the_faults_once_with_only_the_charts_rbac(
    sandbox: Sandbox,
    release: tuple[str, str],
    node_kubeconfig: Path,
    agent_node: str,
    tmp_path: Path,
) -> None:
    node = agent_node
    log = tmp_path / "kern.log"
    log.write_text(FAULT_LOG)
    run_agent(node_kubeconfig, node, log)

    events = events_of(sandbox, node)
    assert summary(events) == [
        ("GpuXid", 13, "0000:86:00", 3),  # three records, one Event
        ("GpuXid", 79, "0000:3b:00", 1),  # XID 79 + the fallen-off message: one fault
        ("NvSwitchSxid", 24007, "0000:c3:00", 1),
    ]
    by_xid = {
        parse_event(e["reason"], e["message"]).xid: e for e in events if e["reason"] == "GpuXid"
    }  # type: ignore[union-attr]
    assert parse_event("GpuXid", by_xid[79]["message"]).gpu_uuid == UUID_A  # type: ignore[union-attr]
    assert parse_event("GpuXid", by_xid[13]["message"]).gpu_uuid == UUID_B  # type: ignore[union-attr]
    for e in events:
        assert e["type"] == "Warning"
        assert e["involvedObject"]["uid"] == node_obj(sandbox, node)["metadata"]["uid"]
    cond = gpu_xid_condition(sandbox, node)
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "Xid79")
    annotations = node_obj(sandbox, node)["metadata"]["annotations"]
    assert parse_gpu_map(annotations[GPU_MAP_ANNOTATION]).by_pci == {
        "0000:3b:00": UUID_A,
        "0000:86:00": UUID_B,
    }

    # A restart without a state file: same names, 409, counts reconciled: nothing changes.
    versions = {e["metadata"]["name"]: e["metadata"]["resourceVersion"] for e in events}
    node_version = node_obj(sandbox, node)["metadata"]["resourceVersion"]
    run_agent(node_kubeconfig, node, log)
    again = events_of(sandbox, node)
    assert {e["metadata"]["name"]: e["metadata"]["resourceVersion"] for e in again} == versions
    cond_again = gpu_xid_condition(sandbox, node)
    assert cond_again == cond
    del node_version  # kwok heartbeats bump the Node's version; the condition is what we own

    # More of the same records: the same Event is bumped, no new one.
    with log.open("a") as fh:
        fh.write(FAULT_LOG.splitlines()[6] + "\n" + FAULT_LOG.splitlines()[7] + "\n")
    run_agent(node_kubeconfig, node, log)
    assert summary(events_of(sandbox, node)) == [
        ("GpuXid", 13, "0000:86:00", 5),
        ("GpuXid", 79, "0000:3b:00", 1),
        ("NvSwitchSxid", 24007, "0000:c3:00", 1),
    ]


def test_restart_with_state_file_writes_nothing_and_a_flood_is_one_event(
    sandbox: Sandbox,
    release: tuple[str, str],
    node_kubeconfig: Path,
    agent_node: str,
    tmp_path: Path,
) -> None:
    node = agent_node
    log, state = tmp_path / "kern.log", tmp_path / "state" / "state.json"
    line = FAULT_LOG.splitlines()[6]
    log.write_text("\n".join([line] * 2000) + "\n")
    run_agent(node_kubeconfig, node, log, f"--state-file={state}")
    events = events_of(sandbox, node)
    assert summary(events) == [("GpuXid", 13, "0000:86:00", 2000)]
    saved = json.loads(state.read_text())
    assert saved["cursor"] == 2000
    version = events[0]["metadata"]["resourceVersion"]
    run_agent(node_kubeconfig, node, log, f"--state-file={state}")
    (again,) = events_of(sandbox, node)
    assert again["metadata"]["resourceVersion"] == version


def test_look_alikes_post_nothing(
    sandbox: Sandbox,
    release: tuple[str, str],
    node_kubeconfig: Path,
    agent_node: str,
    tmp_path: Path,
) -> None:
    node = agent_node
    log = tmp_path / "kern.log"
    log.write_text(LOOK_ALIKES)
    run_agent(node_kubeconfig, node, log)
    assert events_of(sandbox, node) == []
    cond = gpu_xid_condition(sandbox, node)
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", "NoXid")


def test_following_a_log_posts_new_records_promptly_and_stops_cleanly(
    sandbox: Sandbox,
    release: tuple[str, str],
    node_kubeconfig: Path,
    agent_node: str,
    tmp_path: Path,
) -> None:
    """The DaemonSet's mode: no --once; records appended to the log reach the API server within
    a flush interval or two; SIGTERM flushes, saves state and exits 0."""
    node = agent_node
    log, state = tmp_path / "kern.log", tmp_path / "state.json"
    log.write_text(LOOK_ALIKES)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "GPUHEAL_"))}
    env["PYTHONPATH"] = f"{REPO / 'operator'}"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "gpuheal.agent", f"--kmsg={log}", f"--node={node}",
            f"--kubeconfig={node_kubeconfig}", "--nvml=off", f"--state-file={state}",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        wait_for(lambda: gpu_xid_condition(sandbox, node), "the agent's first condition write")
        xid79 = FAULT_LOG.splitlines()[13]
        with log.open("a") as fh:
            fh.write(xid79 + "\n")
        started = time.monotonic()
        wait_for(lambda: events_of(sandbox, node), "the XID 79 Event", timeout=20, every=0.05)
        latency = time.monotonic() - started
        assert latency < 5, f"{latency:.2f}s from the log line to the Event"
        with log.open("a") as fh:
            fh.write(xid79 + "\n")
        wait_for(
            lambda: [e["count"] for e in events_of(sandbox, node)] == [2], "the count bumped to 2"
        )
        cond = gpu_xid_condition(sandbox, node)
        assert cond is not None
        assert (cond["status"], cond["reason"]) == ("True", "Xid79")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "orbidden" not in out, out
    assert json.loads(state.read_text())["cursor"] == len(LOOK_ALIKES.splitlines()) + 2


# --- with the operator --------------------------------------------------------------------------


@pytest.fixture
def crds(sandbox: Sandbox) -> None:
    sandbox.kubectl("apply", "-f", str(REPO / "crds"))
    for plural in ("noderemediations", "remediationpolicies", "reservepools"):
        sandbox.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.gpuheal.io", "--timeout=60s"
        )


def test_operator_opens_one_incident_per_real_fault_and_none_for_look_alikes(
    sandbox: Sandbox,
    release: tuple[str, str],
    crds: None,
    own_gpu_nodes: Callable[..., list[str]],
    tmp_path: Path,
) -> None:
    case = uuid.uuid4().hex[:6]
    faulty, quiet = own_gpu_nodes(2, **{"gpuheal.io/case": f"{case}-agent"})
    objects = Objects(sandbox.api_client())
    objects.apply(
        "remediationpolicies",
        {
            "apiVersion": "gpuheal.io/v1alpha1",
            "kind": "RemediationPolicy",
            "metadata": {"name": f"agent-{case}"},
            "spec": {
                "nodeSelector": {"matchLabels": {"gpuheal.io/case": f"{case}-agent"}},
                "safety": {"maxUnhealthy": 5, "stormCooldown": "0s"},
                "returnToService": {"enabled": False},
                "rules": [
                    {
                        "name": "fell-off-bus",
                        "signals": {"xids": [79]},
                        "ladder": [{"name": "fence", "steps": [{"action": "cordon"}]}],
                    }
                ],
            },
        },
    )
    logs = tmp_path / "op"
    logs.mkdir()
    op = OperatorProcess(Path(sandbox.kubeconfig), logs).start()
    try:
        log = tmp_path / "faulty.log"
        # Only the fall off the bus: XID 79 and the driver's message without an XID, same GPU.
        log.write_text("\n".join(FAULT_LOG.splitlines()[:2] + FAULT_LOG.splitlines()[10:15]) + "\n")
        quiet_log = tmp_path / "quiet.log"
        quiet_log.write_text(LOOK_ALIKES)
        kubeconfigs = {n: node_agent_kubeconfig(sandbox, release, n) for n in (faulty, quiet)}
        for node, path in ((faulty, log), (quiet, quiet_log)):
            run_agent(kubeconfigs[node], node, path)
        incident = wait_for(lambda: objects.incident(faulty), "an incident on the faulty node")
        hold(lambda: len(objects.incidents(faulty)) == 1, "exactly one incident", seconds=5)
        assert objects.incidents(quiet) == []
        signal = incident["spec"]["signals"][0]
        assert signal["xid"] == 79
        assert signal.get("gpuUuid") == UUID_A or signal.get("pciBusId") == "0000:3b:00", signal
        assert "0000:3b:00" in signal["message"]
        # A restart of the agent re-posts nothing: still one incident, one signal.
        run_agent(kubeconfigs[faulty], faulty, log)
        hold(lambda: len(objects.incidents(faulty)) == 1, "still one incident", seconds=5)
        latest = objects.incident(faulty)
        assert latest is not None
        assert len(latest["spec"]["signals"]) == 1, yaml.safe_dump(latest["spec"]["signals"])
    finally:
        op.stop()
        objects.cleanup([faulty, quiet])
        for node in (faulty, quiet):
            delete_agent_events(sandbox, node)


def test_agent_without_a_kernel_log_stays_up_not_ready_saying_why_once(
    sandbox: Sandbox, node_kubeconfig: Path, agent_node: str, tmp_path: Path
) -> None:
    """Issue 24 step 4: the kernel log not there (its mount missing) and no NVML. The agent
    does not exit (a DaemonSet would restart it into a crash loop): it stays up, /readyz 503
    with the reason, one log line and one Warning Event on its Node; once the log appears it
    reads it (an XID posted) and /readyz turns 200, said once."""
    node = agent_node
    log = tmp_path / "kern.log"  # not there yet
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "GPUHEAL_"))}
    env["PYTHONPATH"] = f"{REPO / 'operator'}"
    out = tmp_path / "agent.out"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "gpuheal.agent", f"--kmsg={log}", f"--node={node}",
            f"--kubeconfig={node_kubeconfig}", "--nvml=off", f"--ready-port={port}",
            "--reopen-interval=2",
        ],
        stdout=out.open("w"), stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip

    def readyz() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""

    try:
        warned = wait_for(
            lambda: [e for e in events_of(sandbox, node) if e["reason"] == "KernelLogUnreadable"],
            "the agent's KernelLogUnreadable Event",
        )
        assert warned[0]["type"] == "Warning"
        assert (
            f"cannot read the kernel log {log} (No such file or directory)"
            in (warned[0]["message"])
        )
        status, body = readyz()
        assert status == 503, (status, body, out.read_text())
        assert f"not ready: cannot read the kernel log {log}" in body
        hold(lambda: proc.poll() is None and readyz()[0] == 503, "up and not ready", 5)
        said = out.read_text()
        assert said.count("not ready: ") == 1, said  # not at each of the tries every 2 s
        assert "Traceback" not in said, said

        log.write_text(FAULT_LOG.splitlines()[13] + "\n")  # the XID 79 line
        wait_for(lambda: readyz() == (200, "ready\n"), "/readyz 200 once the log is there")
        wait_for(
            lambda: [e for e in events_of(sandbox, node) if e["reason"] == "GpuXid"],
            "the XID 79 Event from the log",
        )
        assert out.read_text().count("resolved: ") == 1
        assert len(warned_now := [
            e for e in events_of(sandbox, node) if e["reason"] == "KernelLogUnreadable"
        ]) == 1, warned_now  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, out.read_text()
