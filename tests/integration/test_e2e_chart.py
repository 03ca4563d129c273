"""``make e2e``: gpuheal as it ships, its own images running as pods under its chart.

One sandbox for the module (``--real-node`` with both images imported, Slurm 26.05 with
slurmrestd and JWT): the README's install block, read from the README and run as it is with
its placeholders set (``$REGISTRY``, ``$SLURMRESTD_URL``, ``./bridge-token``, ``./slurm-jwt``,
``./site-values.yaml``), so the two cannot drift; then the XID story through the pods, and
``helm uninstall``. The tests run in order and share the release.

Every pod's logs, descriptions and the Events are written under the module's evidence folder
when a test fails; the failure message names it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpuheal.cli.simulate import kernel_line, xid_event
from gpuheal_dev.sandbox import Sandbox, SandboxConfig
from gpuheal_dev.sandbox.realnode import REAL_NODE_NAME
from tests.integration.test_admission import _job as node_job
from tests.integration.test_admission import _refusal as refusal
from tests.integration.test_bridge_slurm import JOB

# the real-node modules ask for one worker (--dist loadgroup): the host's kernel log is every
# sandbox's, and an XID line one module wrote reached another's agent pod (every real node is
# gpu-real-0). A small trial with xdist 3.8 still split a group, so nothing relies on it: only
# the e2e module writes an XID line (test_realnode's is a plain line)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("host-kmsg")]

ROOT = Path(__file__).resolve().parents[2]
IMAGES = Path(os.environ.get("GPUHEAL_CACHE", Path.home() / ".cache" / "gpuheal")) / "images"
README_MARK = "<!-- make e2e runs this block"
NS = "gpuheal-system"
RELEASE = "gpuheal"
# the README's placeholders: the sandbox's node imported the images under these names
REGISTRY = "docker.io/library"
BRIDGE_TOKEN = "e2e-bridge-token-" + "0123456789abcdef"
# Site values of this machine: the real node is the sandbox's only node whose pods run (kwok
# only pretends), and a GPU node, so the operator may run there (values.yaml: "Replace for
# all-GPU clusters"); the
# agent replays the kernel log since boot, where other tests of this machine wrote XID lines:
# only a signal of the last 30 s starts an incident.
SITE_VALUES = {
    "operator": {
        "affinity": None,
        "nodeSelector": {"kubernetes.io/hostname": REAL_NODE_NAME},
        "extraArgs": ["--event-max-age=30"],
    },
    "slurmBridge": {"nodeSelector": {"kubernetes.io/hostname": REAL_NODE_NAME}},
}
POLICY = "e2e-real-node"
# the real node's (fake) GPU as the driver names it in the kernel log
PCI = "0000:1b:00"
# as the driver prints it (DESIGN-NOTES, Signals)
XID79_LINE = (
    f"NVRM: Xid (PCI:{PCI}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)


def readme_install_block() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(README_MARK)
    m = re.compile(r"```console\n(.*?)```", re.S).search(text, start)
    assert m is not None, "README: no ```console block after the make e2e mark"
    return m.group(1)


def wait_for(pred: Callable[[], Any], what: str, timeout: float = 120, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            got = pred()
        except Exception as exc:  # not there yet
            last = exc
        else:
            if got:
                return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


class Evidence:
    """Pods' logs, descriptions and Events under ``out``, written when a check fails."""

    def __init__(self, sb: Sandbox, out: Path) -> None:
        self.sb, self.out = sb, out

    def dump(self, label: str) -> Path:
        d = self.out / label
        d.mkdir(parents=True, exist_ok=True)
        kubectl = self.sb.kubectl
        nss = [NS, f"{RELEASE}-agent", f"{RELEASE}-node-jobs"]
        for ns in nss:
            pods = kubectl("get", "pods", "-n", ns, "-o", "name", check=False).stdout.split()
            for pod in pods:
                name = pod.split("/")[-1]
                for prev in ("", "--previous"):
                    args = ["logs", pod, "-n", ns, "--all-containers", "--timestamps"]
                    logs = kubectl(*args, *([prev] if prev else []), check=False)
                    suffix = ".previous" if prev else ""
                    (d / f"{ns}.{name}{suffix}.log").write_text(logs.stdout + logs.stderr)
            for what in ("describe", "events"):
                args = [what, "pods"] if what == "describe" else ["events"]
                got = kubectl(*args, "-n", ns, check=False)
                (d / f"{ns}.{what}.txt").write_text(got.stdout + got.stderr)
        for args in (
            ["get", "events", "-A", "-o", "wide"],
            ["get", "nodes", "-o", "wide"],
            ["get", "noderemediations,remediationpolicies,reservepools", "-o", "yaml"],
        ):
            got = kubectl(*args, check=False)
            (d / f"{'_'.join(args[1:2])}.txt").write_text(got.stdout + got.stderr)
        if self.sb.slurm is not None:
            got = self.sb.slurm.run("squeue", "-t", "all", "-o", "%i %T %N %r", check=False)
            (d / "squeue.txt").write_text(got.stdout + got.stderr)
        return d

    @contextlib.contextmanager
    def kept(self, label: str) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            where = self.dump(label)
            raise AssertionError(f"{exc}\n(pods' logs, describe, events: {where})") from exc


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    tars = (IMAGES / "gpuheal.tar", IMAGES / "gpuheal-slurm-bridge.tar")
    missing = [str(t) for t in tars if not t.exists()]
    assert not missing, f"{missing}: `make images` builds them"
    # not under pytest's 0700 temp folder: slurmrestd (26.05) runs as nobody and reads
    # slurm.conf from the sandbox's root
    root = Path(tempfile.mkdtemp(prefix="gpuheal-e2e-"))
    root.chmod(0o755)
    try:
        sandbox = Sandbox.up(
            SandboxConfig(
                root=root,
                gpu_nodes=1,
                spare_nodes=1,
                slurm=True,
                slurm_restd=True,
                slurm_version="26.05",
                real_node=True,
                real_node_images=tars,
            )
        )
    except BaseException:  # up stopped what it started; its folder goes too
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        yield sandbox
    finally:
        sandbox.down()
        keep = tmp_path_factory.mktemp("e2e-sandbox-logs")
        for logs in (root / "realnode" / "logs", root / "slurm" / "log", root / "k8s" / "logs"):
            if logs.is_dir():
                shutil.copytree(logs, keep / logs.parent.name, dirs_exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def evidence(sb: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Evidence:
    return Evidence(sb, tmp_path_factory.mktemp("e2e-evidence"))


def run_readme_block(sb: Sandbox, workdir: Path) -> subprocess.CompletedProcess[str]:
    assert sb.slurm.restd_url is not None
    assert sb.slurm.restd_token_file is not None
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "deploy").symlink_to(ROOT / "deploy")
    (workdir / "bridge-token").write_text(BRIDGE_TOKEN)
    (workdir / "slurm-jwt").write_text(sb.slurm.restd_token_file.read_text().strip())
    (workdir / "site-values.yaml").write_text(yaml.safe_dump(SITE_VALUES))
    env = {
        **os.environ,
        **sb.env(),
        "REGISTRY": REGISTRY,
        "SLURMRESTD_URL": sb.pod_url(sb.slurm.restd_url),
    }
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_install_block()],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def release(sb: Sandbox, evidence: Evidence, tmp_path_factory: pytest.TempPathFactory) -> str:
    t0 = time.monotonic()
    with evidence.kept("install"):
        done = run_readme_block(sb, tmp_path_factory.mktemp("e2e-install"))
        assert done.returncode == 0, f"the README's install block: {done.stdout}\n{done.stderr}"
    print(f"README install block (helm install --wait + helm test): {time.monotonic() - t0:.1f}s")
    return done.stdout


def pods(sb: Sandbox, ns: str, selector: str) -> list[Any]:
    return list(sb.core_v1().list_namespaced_pod(ns, label_selector=selector).items)


def ready(pod: Any) -> bool:
    conds = pod.status.conditions or []
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in conds
    )


def test_the_readme_install_runs_every_pod_ready_one_leader(
    sb: Sandbox, release: str, evidence: Evidence
) -> None:
    with evidence.kept("pods-ready"):
        assert "Phase:          Succeeded" in release, release  # helm test's pods
        operators = wait_for(
            lambda: (
                [p for p in pods(sb, NS, "app.kubernetes.io/component=operator") if ready(p)]
                if len(pods(sb, NS, "app.kubernetes.io/component=operator")) == 2
                else None
            ),
            "both operator pods Ready",
        )
        assert len(operators) == 2
        assert all(p.spec.node_name == REAL_NODE_NAME for p in operators)
        # one leader: the Lease's holder is one of them (the other waits for it)
        lease = yaml.safe_load(sb.kubectl("get", "lease", "gpuheal-operator", "-n", NS,
                                          "-o", "yaml").stdout)  # fmt: skip
        holder = lease["spec"]["holderIdentity"]
        assert any(p.metadata.name in holder for p in operators), (holder, operators)
        # (the DaemonSet's pods on the kwok nodes only seem to run: kwok plays their kubelet)
        agents = pods(sb, f"{RELEASE}-agent", "app.kubernetes.io/component=agent")
        [agent] = [p for p in agents if p.spec.node_name == REAL_NODE_NAME]
        assert ready(agent)
        assert agent.status.container_statuses[0].restart_count == 0
        [bridge] = [p for p in pods(sb, NS, "app.kubernetes.io/component=slurm-bridge") if ready(p)]
        assert bridge.status.container_statuses[0].restart_count == 0
        # the chart's default backend on 26.05: requeues over slurmrestd; no reboot there
        request = urllib.request.Request(
            f"http://{bridge.status.pod_ip}:8787/v1/capabilities",
            headers={"Authorization": f"Bearer {BRIDGE_TOKEN}"},
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            caps = json.loads(resp.read())
        assert caps["backend"] == "rest", caps
        assert caps["slurm_version"].startswith("26.05"), caps
        assert "requeue" in caps["capabilities"], caps
        assert "reboot" in caps["missing"], caps


# --- least privilege with the real pods' identities (issue 23, docs/security.md) ----------------
# The same restrictions as test_admission.py, test_signal_trust.py, test_bridge_scopes.py and
# test_helm_namespaces_network.py, here against the chart as the README installs it, each
# request made with the token the kubelet mounted in the real pod (read through kubectl exec).

AGENT_NS, JOBS_NS = f"{RELEASE}-agent", f"{RELEASE}-node-jobs"
ELSEWHERE = "e2e-elsewhere"
PSS = "pod-security.kubernetes.io/"
READ_TOKEN = "e2e-read-token-" + "0123456789abcdef"


def pod_token(sb: Sandbox, ns: str, pod: Any) -> str:
    """The ServiceAccount token the kubelet mounted in ``pod`` (bound to it, its node in it)."""
    container = pod.spec.containers[0].name
    path = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    read = "import sys; sys.stdout.write(open(sys.argv[1]).read())"  # the images have no cat
    got = sb.kubectl("exec", "-n", ns, pod.metadata.name, "-c", container, "--",
                     "python", "-c", read, path)  # fmt: skip
    return got.stdout.strip()


def as_token(sb: Sandbox, token: str) -> client.ApiClient:
    conf = client.Configuration()
    conf.host = sb.control_plane.server
    conf.ssl_ca_cert = str(sb.control_plane.pki.ca.cert)
    conf.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(conf)


def real_agent_pod(sb: Sandbox) -> Any:
    agents = pods(sb, AGENT_NS, "app.kubernetes.io/component=agent")
    [agent] = [p for p in agents if p.spec.node_name == REAL_NODE_NAME and ready(p)]
    return agent


def operator_metrics(sb: Sandbox) -> dict[str, float]:
    """gpuheal_signals_total of the leader (the standby serves no metrics: it reads nothing)."""
    leader = holder_pod(sb)
    [p] = [p for p in pods(sb, NS, "app.kubernetes.io/component=operator")
           if p.metadata.name == leader]  # fmt: skip
    with urllib.request.urlopen(f"http://{p.status.pod_ip}:9090/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.finditer(r"^gpuheal_signals_total\{([^}]*)\} (\S+)$", text, re.M)
    # keyed "result/source" (the exposition's label order is the client library's)
    return {
        "/".join(v for _, v in sorted(re.findall(r'(\w+)="([^"]*)"', m.group(1)))): float(
            m.group(2)
        )
        for m in found
    }


def signals(metrics: dict[str, float], result: str) -> float:
    return metrics.get(f"{result}/events", 0.0)


def test_the_release_namespace_enforces_restricted_the_privileged_ones_are_labelled(
    sb: Sandbox, release: str, evidence: Evidence
) -> None:
    """The README's block labels the release namespace `restricted` before the install: the
    operator and bridge pods were admitted under it, and the running ones pass it (a server
    dry run of the label names every pod that would not); the agent's and the node Jobs'
    namespaces are the chart's, labelled `privileged`."""
    with evidence.kept("pod-security"):
        core = sb.core_v1()
        labels = core.read_namespace(NS).metadata.labels or {}
        assert labels.get(f"{PSS}enforce") == "restricted", labels
        for component in ("operator", "slurm-bridge"):
            assert pods(sb, NS, f"app.kubernetes.io/component={component}"), component
        again = sb.kubectl("label", "namespace", NS, "--overwrite", "--dry-run=server",
                           f"{PSS}enforce=restricted")  # fmt: skip
        assert "violate" not in again.stderr, again.stderr
        for ns in (AGENT_NS, JOBS_NS):
            labels = core.read_namespace(ns).metadata.labels or {}
            for mode in ("enforce", "warn", "audit"):
                assert labels.get(f"{PSS}{mode}") == "privileged", (ns, labels)


def test_the_real_agent_pods_token_writes_its_own_node_only(
    sb: Sandbox, release: str, evidence: Evidence
) -> None:
    """The agent pod's own token (its node: the real one): its node's status, admitted; a kwok
    node's status, or an Event about that node, refused by the chart's admission policies."""
    other = "gpu-node-0"
    with evidence.kept("agent-token"):
        agent = client.CoreV1Api(as_token(sb, pod_token(sb, AGENT_NS, real_agent_pod(sb))))
        node = sb.core_v1().read_node(REAL_NODE_NAME)
        # harmless: what the agent wrote already (its condition, else its GPU map), again
        own = [c for c in node.status.conditions or [] if c.type == "GpuXid"]
        same: dict[str, Any] = (
            {"status": {"conditions": [{"type": c.type, "status": c.status, "reason": c.reason,
                                        "message": c.message} for c in own]}}
            if own
            else {"metadata": {"annotations": {
                "gpuheal.io/gpus": (node.metadata.annotations or {})["gpuheal.io/gpus"]}}}
        )  # fmt: skip
        assert refusal(lambda: agent.patch_node_status(REAL_NODE_NAME, same)) is None
        forged = {"status": {"conditions": [{
            "type": "GpuXid", "status": "True", "reason": "Forged", "message": "forged",
        }]}}  # fmt: skip
        said = refusal(lambda: agent.patch_node_status(other, forged))
        assert said is not None, f"the real agent's token patched {other}'s status"
        assert "the node agent may patch the status of its own node only" in said, said
        assert f"token bound to a pod on node {REAL_NODE_NAME}), node {other}" in said, said
        conds = sb.core_v1().read_node_status(other).status.conditions or []
        assert not [c for c in conds if c.type == "GpuXid"], conds
        body = sb.core_v1().api_client.sanitize_for_serialization(sb.core_v1().read_node(other))
        event = xid_event(body, kernel_line(79))
        event["source"]["component"] = event["reportingComponent"] = "gpuheal-agent"
        said = refusal(lambda: agent.create_namespaced_event("default", event))
        assert said is not None, f"the real agent's token posted an Event about {other}"
        assert f"token bound to a pod on node {REAL_NODE_NAME}" in said, said


def test_the_real_operator_pods_token_creates_only_the_charts_node_jobs(
    sb: Sandbox, release: str, evidence: Evidence
) -> None:
    """Server-side dry runs in the node-jobs namespace with the operator pod's own token: the
    chart's node Job (its ConfigMap's template, made a Job by the operator's own function) is
    admitted; the same Job mounting a Secret, or running another image, is refused."""
    with evidence.kept("node-jobs"):
        [op, *_] = [p for p in pods(sb, NS, "app.kubernetes.io/component=operator") if ready(p)]
        batch = client.BatchV1Api(as_token(sb, pod_token(sb, NS, op)))
        cm = sb.core_v1().read_namespaced_config_map("gpuheal-node-jobs", JOBS_NS)
        check = yaml.safe_load(cm.data["gpu-check"])

        def create(change: Callable[[dict[str, Any]], None] | None = None) -> str | None:
            job = node_job(copy.deepcopy(check), "e2e-check", node=REAL_NODE_NAME)
            if change is not None:
                change(job["spec"]["template"]["spec"])
            return refusal(lambda: batch.create_namespaced_job(JOBS_NS, job, dry_run="All"))

        assert create() is None
        secret = {"name": "loot", "secret": {"secretName": "gpuheal-bridge-token"}}
        said = create(lambda pod: pod.setdefault("volumes", []).append(secret))
        assert said is not None, "a node Job mounting a Secret was admitted"
        assert "mounts volume(s) not allowed for node Jobs: loot" in said, said
        said = create(lambda pod: pod["containers"][0].update(image="busybox:1.36"))
        assert said is not None, "a node Job running another image was admitted"
        assert "runs an image not allowed for node Jobs: busybox:1.36" in said, said


def test_an_event_about_the_real_node_from_another_namespace_starts_nothing(
    sb: Sandbox, release: str, evidence: Evidence
) -> None:
    """The agent pod's own token, allowed here to post Events in another namespace too, posts
    there the XID 79 the real node's live policy acts on: nothing starts. Then a control Event
    in `default` (the same XID from an untrusted reporter, so that it opens nothing either)
    shows the operator read Events after it: it counts it and warns on the Node."""
    core = sb.core_v1()
    with evidence.kept("event-namespace"):
        sb.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(E2E_OBJECTS))
        agent_pod = real_agent_pod(sb)
        account = agent_pod.spec.service_account_name
        sb.kubectl("create", "namespace", ELSEWHERE)
        try:
            sb.kubectl("create", "role", "events", "-n", ELSEWHERE, "--verb=create",
                       "--resource=events")  # fmt: skip
            sb.kubectl("create", "rolebinding", "events", "-n", ELSEWHERE, "--role=events",
                       f"--serviceaccount={AGENT_NS}:{account}")  # fmt: skip
            agent = client.CoreV1Api(as_token(sb, pod_token(sb, AGENT_NS, agent_pod)))
            node = core.api_client.sanitize_for_serialization(core.read_node(REAL_NODE_NAME))
            before = operator_metrics(sb)
            elsewhere = xid_event(node, kernel_line(79), namespace=ELSEWHERE)
            elsewhere["involvedObject"]["namespace"] = ELSEWHERE
            elsewhere["source"]["component"] = elsewhere["reportingComponent"] = "gpuheal-agent"
            # admitted: the agent's own node, its reserved name, a namespace its RBAC allows
            wait_for(lambda: agent.create_namespaced_event(ELSEWHERE, elsewhere),
                     "the RoleBinding in force", timeout=30)  # fmt: skip
            control = core.create_namespaced_event("default", xid_event(node, kernel_line(79)))
            wait_for(
                lambda: signals(operator_metrics(sb), "untrusted") > signals(before, "untrusted"),
                "the operator counting the control Event",
                timeout=60,
            )

            def warned() -> bool:
                sel = f"involvedObject.name={REAL_NODE_NAME},reason=UntrustedSignal"
                found = core.list_namespaced_event("default", field_selector=sel).items
                return any(control.metadata.name in (e.message or "") for e in found)

            wait_for(warned, "the UntrustedSignal Warning on the real node", timeout=30)
            after = operator_metrics(sb)
            for result in ("incident", "attached", "wrong_namespace", "wrong_uid"):
                assert signals(after, result) == signals(before, result), (result, after)
            assert nrems(sb, REAL_NODE_NAME) == []
            assert not core.read_node(REAL_NODE_NAME).spec.unschedulable
            core.delete_namespaced_event(control.metadata.name, "default")
        finally:
            sb.kubectl("delete", "namespace", ELSEWHERE, "--wait=false", check=False)


def test_the_bridge_pods_operator_token_cannot_lift_an_admin_drain_or_requeue_unnamed(
    sb: Sandbox, release: str, evidence: Evidence
) -> None:
    """Through the bridge pod with the install's token (a bare token: every scope but admin):
    an admin's drain stays (409 plain, 403 forced or named as a reserve pool's), and a requeue
    that names no `from_node` is refused while the job runs on. A second token, scoped `read`
    (added with `helm upgrade --reuse-values`, as docs/slurm-bridge.md describes), may not
    resume at all."""
    slurm, node = sb.slurm, "gpu-node-0"
    with evidence.kept("bridge-scopes"):
        tokens = [{"name": "GPUHEAL_BRIDGE_TOKENS", "value": f"dashboard:{READ_TOKEN}:read"}]
        got = subprocess.run(
            ["helm", "upgrade", RELEASE, str(ROOT / "deploy" / "helm" / "gpuheal"), "-n", NS,
             "--reuse-values", "--set-json", f"slurmBridge.extraEnv={json.dumps(tokens)}",
             "--wait", "--timeout", "3m"],
            env={**os.environ, **sb.env()}, capture_output=True, text=True, timeout=240,
            check=False,
        )  # fmt: skip
        assert got.returncode == 0, got.stdout + got.stderr
        [bridge] = [p for p in pods(sb, NS, "app.kubernetes.io/component=slurm-bridge") if ready(p)]
        url = f"http://{bridge.status.pod_ip}:8787"

        def post(
            path: str, body: dict[str, Any], token: str = BRIDGE_TOKEN
        ) -> tuple[int, dict[str, Any]]:
            request = urllib.request.Request(
                url + path, data=json.dumps(body).encode(), method="POST",
                headers={"Authorization": f"Bearer {token}",
                         "Content-Type": "application/json"},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    return resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        jid = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-w", node,
                        "--wrap", "sleep 300").stdout.strip().split(";")[0]  # fmt: skip
        try:
            wait_for(lambda: job_state(sb, jid)[0] == "RUNNING", f"job {jid} running")
            status, said = post(f"/v1/jobs/{jid}/requeue", {})
            assert status == 422, said
            assert "from_node" in said["message"], said
            assert job_state(sb, jid)[0] == "RUNNING"
            assert "Restarts=0" in slurm.run("scontrol", "show", "job", jid).stdout
        finally:
            slurm.run("scancel", jid, check=False)
        reason = "admin: fan swap"
        slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
        try:
            path = f"/v1/nodes/{node}/resume"
            status, said = post(path, {}, token=READ_TOKEN)
            assert status == 403, said
            assert "'dashboard' lacks the scope resume" in said["message"], said
            status, said = post(path, {})
            assert status == 409, said  # not gpuheal's drain
            status, said = post(path, {"force": True})
            assert status == 403, said
            assert "lacks the scope admin" in said["message"], said
            status, said = post(path, {"reserve_reason": reason})
            assert status == 403, said
            assert f"'{reason}' is not one of the bridge's reserve pool reasons" in said["message"]
            shown = slurm.run("scontrol", "show", "node", "-o", node).stdout
            assert "DRAIN" in shown, shown
            assert f"Reason={reason}" in shown, shown
        finally:
            slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)


def nrems(sb: Sandbox, node: str) -> list[dict[str, Any]]:
    items = yaml.safe_load(sb.kubectl("get", "noderemediations", "-o", "yaml").stdout)["items"]
    return [n for n in items if n["spec"]["nodeName"] == node]


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), None)


def is_completed(nrem: dict[str, Any]) -> bool:
    c = condition(nrem, "Completed")
    return c is not None and c["status"] == "True"


def job_state(sb: Sandbox, jid: str) -> tuple[str, str]:
    out = sb.slurm.run("squeue", "-h", "-t", "all", "-j", jid, "-o", "%T|%N", check=False)
    state, _, nodes = out.stdout.strip().partition("|")
    return state, nodes


E2E_OBJECTS = [
    {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "ReservePool",
        "metadata": {"name": "e2e-spares"},
        "spec": {
            "nodeSelector": {"matchLabels": {"gpuheal.io/pool": "reserve"}},
            "minAvailable": 1,
            "promotion": {
                "setLabels": {"gpuheal.io/pool": "training"},
                "slurm": {"resume": True, "reserveReason": "reserve pool"},
            },
        },
    },
    {
        # Above the chart's default policy (priority 0, dry run) for the real node: live, and
        # without the default XID 79 rung's reboot, whose node-reboot Job would reboot the
        # machine these tests run on, nor a pod drain, which would evict gpuheal's own pods
        # from the sandbox's only node that runs pods.
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "priority": 10,
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": REAL_NODE_NAME}},
            # replace waits for a person: the incident stays open for helm upgrade and the
            # leader's deletion (test_xid79...)
            "safety": {
                "maxUnhealthy": 1,
                "stormCooldown": "0s",
                "dryRun": False,
                "requireApproval": ["replace"],
            },
            "returnToService": {"enabled": False},
            "rules": [
                {
                    "name": "fell-off-bus",
                    "signals": {"xids": [79]},
                    "ladder": [
                        {
                            "name": "replace",
                            "steps": [
                                {"action": "cordon"},
                                {
                                    "action": "slurmDrain",
                                    "slurmDrain": {
                                        "requeue": "requeue",
                                        "checkpointSignal": "USR1",
                                        "gracePeriod": "2s",
                                    },
                                },
                                {
                                    "action": "replace",
                                    "replace": {"reservePoolRef": {"name": "e2e-spares"}},
                                },
                            ],
                        }
                    ],
                }
            ],
        },
    },
]


def test_xid79_through_the_pods_across_a_helm_upgrade_and_the_leaders_deletion(
    sb: Sandbox, release: str, evidence: Evidence, tmp_path: Path
) -> None:
    """The agent pod reads the line, posts its Event; the operator pod cordons; the bridge pod
    drains the node in Slurm and requeues the job, which resumes from its checkpoint on another
    node; while the spare waits for approval, `helm upgrade` with a changed value rolls the
    operator pods and the leader pod is deleted: the standby takes the Lease and, once
    approved, claims the spare; one incident, one cordon, one requeue, one spare, the breaker
    as it was. Each hop is checked in the API or in Slurm."""
    slurm = sb.slurm
    other, spare = "gpu-node-0", "gpu-spare-0"
    with evidence.kept("xid79"):
        sb.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(E2E_OBJECTS))
        # the spare waits drained as a pool leaves it; the job lands on the real node
        slurm.run("scontrol", "update", f"NodeName={spare}", "State=DRAIN", "Reason=reserve pool")
        slurm.run("scontrol", "update", f"NodeName={other}", "State=DRAIN", "Reason=hold")
        script, ckpt, out = tmp_path / "job.sh", tmp_path / "job.state", tmp_path / "job.out"
        script.write_text(JOB)
        script.chmod(0o755)
        jid = slurm.run("sbatch", "--parsable", "-o", str(out), str(script), str(ckpt), "0.2")
        jid = jid.stdout.strip().split(";")[0]
        wait_for(lambda: job_state(sb, jid) == ("RUNNING", REAL_NODE_NAME), f"job {jid} here")
        slurm.run("scontrol", "update", f"NodeName={other}", "State=RESUME")
        wait_for(lambda: ckpt.exists() and int(ckpt.read_text() or 0) >= 10, "a checkpoint")
        assert nrems(sb, REAL_NODE_NAME) == []

        t0 = time.monotonic()
        Path("/dev/kmsg").write_text(XID79_LINE + "\n")

        # the agent pod's Event
        def xid_event() -> Any:
            sel = f"involvedObject.kind=Node,involvedObject.name={REAL_NODE_NAME},reason=GpuXid"
            events = sb.core_v1().list_event_for_all_namespaces(field_selector=sel).items
            return [e for e in events if PCI in (e.message or "") and "79" in e.message]

        [event] = wait_for(xid_event, "the agent's GpuXid Event", timeout=60)
        assert (event.reporting_component or event.source.component) == "gpuheal-agent", event
        # the operator pod's incident, cordon and spare
        [nrem] = wait_for(lambda: nrems(sb, REAL_NODE_NAME), "the NodeRemediation", timeout=60)
        name = nrem["metadata"]["name"]
        wait_for(lambda: sb.core_v1().read_node(REAL_NODE_NAME).spec.unschedulable, "cordon", 60)
        # the bridge pod's drain and requeue: the job runs on another node (before replace)
        moved = wait_for(
            lambda: (s := job_state(sb, jid))[0] == "RUNNING" and s[1] != REAL_NODE_NAME and s[1],
            "the job running on another node",
            timeout=120,
        )
        took = time.monotonic() - t0
        wait_for(
            lambda: (
                (c := condition(nrems(sb, REAL_NODE_NAME)[0], "Blocked"))
                and c["reason"] == "ApprovalPending"
            ),
            "replace waiting for approval",
        )
        mid_incident_upgrade_and_failover(sb, evidence)
        sb.kubectl("annotate", "noderemediation", name, "gpuheal.io/approve=replace", "--overwrite")
        done = wait_for(
            lambda: next((n for n in nrems(sb, REAL_NODE_NAME) if is_completed(n)), None),
            "the incident completed",
            timeout=180,
        )
        # one incident, one cordon, one requeue, one spare: nothing done twice across the
        # upgrade and the failover
        assert len(nrems(sb, REAL_NODE_NAME)) == 1
        steps = [e["step"] for e in done["status"]["timeline"]]
        for step in ("replace/cordon", "replace/slurmDrain", "replace/replace"):
            assert steps.count(step) == 1, steps
        assert condition(done, "Completed")["reason"] == "Replaced", done["status"]
        assert done["status"]["replacementNode"] == spare, done["status"]
        assert [j["jobId"] for j in done["status"]["requeuedJobs"]] == [jid], done["status"]
        # the bridge pod's drain and requeue, as Slurm has them
        node = slurm.run("scontrol", "show", "node", "-o", REAL_NODE_NAME).stdout
        assert "DRAIN" in node, node
        assert f"Reason=gpuheal: {name}" in node, node
        assert "DRAIN" not in slurm.run("scontrol", "show", "node", "-o", spare).stdout
        assert "Restarts=1" in slurm.run("scontrol", "show", "job", jid).stdout
        starts = wait_for(
            lambda: len(r := re.findall(r"START host=(\S+) restart=(\d+) resume_step=(\d+)",
                                        out.read_text())) >= 2 and r,
            "the job's second start",
        )  # fmt: skip
        assert starts[0][0] == REAL_NODE_NAME
        assert starts[1][0] == moved
        assert int(starts[1][2]) >= 10, "resumed from its checkpoint"
        print(f"XID 79 line -> job {jid} running on {moved}: {took:.1f}s")
        slurm.run("scancel", jid)


def lease_holder(sb: Sandbox) -> str:
    lease = yaml.safe_load(
        sb.kubectl("get", "lease", "gpuheal-operator", "-n", NS, "-o", "yaml").stdout
    )
    return str(lease["spec"].get("holderIdentity") or "")


def holder_pod(sb: Sandbox) -> str | None:
    holder = lease_holder(sb)
    names = [p.metadata.name for p in pods(sb, NS, "app.kubernetes.io/component=operator")]
    return next((n for n in names if holder.rsplit("-", 1)[0] == n), None)


def breaker(sb: Sandbox) -> tuple[str, str] | None:
    policy = yaml.safe_load(sb.kubectl("get", "remediationpolicy", POLICY, "-o", "yaml").stdout)
    c = condition(policy, "CircuitBreakerOpen")
    return (c["status"], c["lastTransitionTime"]) if c else None


def mid_incident_upgrade_and_failover(sb: Sandbox, evidence: Evidence) -> None:
    """`helm upgrade` with a changed value (new operator pods), then the leader pod deleted:
    the incident and the policy's breaker state go on as they were."""
    before = breaker(sb)
    old = {p.metadata.name for p in pods(sb, NS, "app.kubernetes.io/component=operator")}
    got = subprocess.run(
        ["helm", "upgrade", RELEASE, str(ROOT / "deploy" / "helm" / "gpuheal"), "-n", NS,
         "--reuse-values", "--set", "operator.logFormat=plain", "--wait", "--timeout", "4m"],
        env={**os.environ, **sb.env()}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert got.returncode == 0, got.stdout + got.stderr

    def new_pods_one_holder() -> str | None:
        now = pods(sb, NS, "app.kubernetes.io/component=operator")
        names = {p.metadata.name for p in now}
        if len(now) != 2 or names & old or not all(ready(p) for p in now):
            return None
        return holder_pod(sb)

    leader = wait_for(new_pods_one_holder, "the upgraded pods, one holding the Lease", 180)
    sb.kubectl("delete", "pod", leader, "-n", NS, "--wait=false")
    wait_for(
        lambda: (h := holder_pod(sb)) is not None and h != leader,
        "the standby holding the Lease",
        timeout=120,
    )
    assert breaker(sb) == before


def test_helm_uninstall_leaves_no_workload_admission_rbac_or_namespace_but_the_crds(
    sb: Sandbox, release: str, evidence: Evidence
) -> None:
    with evidence.kept("uninstall"):
        sb.kubectl("delete", "remediationpolicy", POLICY, "--ignore-not-found")
        got = subprocess.run(
            ["helm", "uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "3m"],
            env={**os.environ, **sb.env()},
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert got.returncode == 0, got.stdout + got.stderr
        instance = f"app.kubernetes.io/instance={RELEASE}"

        def left() -> list[str]:
            found = []
            for kind in (
                "deployments,daemonsets,services,pods,jobs,serviceaccounts,roles,rolebindings",
                "clusterroles,clusterrolebindings,validatingadmissionpolicies,"
                "validatingadmissionpolicybindings,validatingwebhookconfigurations,"
                "mutatingwebhookconfigurations,namespaces",
            ):
                names = sb.kubectl("get", kind, "-A", "-l", instance, "-o", "name").stdout
                found += names.split()
            named = sb.kubectl(
                "get", "clusterroles,clusterrolebindings,validatingadmissionpolicies,"
                "validatingadmissionpolicybindings,namespaces", "-o", "name",
            ).stdout.split()  # fmt: skip
            found += [n for n in named if "gpuheal" in n.split("/")[-1] and NS not in n]
            return sorted(set(found))

        def nothing_left() -> bool:
            found = left()
            assert found == [], found  # wait_for's message shows the last
            return True

        wait_for(nothing_left, "nothing of the release left", timeout=180, every=2)
        crds = sb.kubectl("get", "crds", "-o", "name").stdout
        for kind in ("remediationpolicies", "reservepools", "noderemediations"):
            assert f"{kind}.gpuheal.io" in crds, crds  # kept, as the chart documents
