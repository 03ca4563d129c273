"""What gpuheal remembers survives the chart's own life cycle: the chart's default policy is
updated in place by `helm upgrade` and `helm rollback` (never deleted and re-created), so its
status (the breaker, open, and since when) and the incidents under it outlive an upgrade made
mid-incident, an operator restart and rollbacks.

The chart is installed on the sandbox's kube-apiserver (which serves the CRDs already, so the
first revision creates the policy); the operator runs as a local process (kwok runs no
containers), with the policy the chart created. The README's first install, where the chart
creates the CRDs itself, runs on a kube-apiserver of its own that has never seen them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal.cli.simulate import simulate_xid
from gpuheal_dev.sandbox import Sandbox, SandboxConfig
from gpuheal_dev.sandbox.kube import cluster_bin_dir
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    completed,
    condition,
    dump,
    hold,
    node_events,
    wait_for,
)
from tests.integration.test_helm_chart import CHART, Helm, _adopt_cluster_objects

pytestmark = pytest.mark.integration


@pytest.fixture
def helm(sandbox: Sandbox, tmp_path: Path) -> Helm:
    binary = cluster_bin_dir() / "helm"
    if not binary.exists():
        pytest.fail(f"{binary} missing: run `make bins`")
    return Helm(binary, tmp_path / "helm-home", kubeconfig=sandbox.kubeconfig)


def _values(tmp_path: Path, policy: str, label: dict[str, str]) -> Path:
    spec = {
        "nodeSelector": {"matchLabels": label},
        "rules": [
            {
                "name": "fell-off-bus",
                "signals": {"xids": [79]},
                "ladder": [{"name": "cordon", "steps": [{"action": "cordon"}]}],
            }
        ],
        # One node out at a time: the second fault opens the breaker. The rate limit counts
        # the incidents' starts, which live on the incidents.
        "safety": {
            "maxUnhealthy": 1,
            "stormCooldown": "1h",
            "rateLimit": {"remediations": 3, "window": "1h"},
        },
        # The first incident stays open: its node must be healthy for an hour to return.
        "returnToService": {"enabled": True, "healthyFor": "1h"},
    }
    values = {
        "agent": {"enabled": False},
        "defaultPolicy": {"enabled": True, "name": policy, "dryRun": False, "spec": spec},
    }
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture
def release(sandbox: Sandbox, helm: Helm, namespace: str, gpuheal_crds: None) -> Iterator[str]:
    name = f"up-{uuid.uuid4().hex[:6]}"
    _adopt_cluster_objects(sandbox, name, namespace)
    yield name
    helm("uninstall", name, "-n", namespace, check=False)
    sandbox.kubectl(
        "delete", "remediationpolicy", "-l", f"app.kubernetes.io/instance={name}",
        "--ignore-not-found",
    )  # fmt: skip


def test_upgrade_mid_incident_restart_and_rollback_keep_breaker_and_incidents(  # noqa: PLR0917
    sandbox: Sandbox,
    helm: Helm,
    namespace: str,
    release: str,
    own_gpu_nodes: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
    tmp_path: Path,
) -> None:
    # A letter first: an all-digit id (about one in 17, e.g. "085305") is written unquoted
    # by PyYAML and read back as a number by helm; the CRD refuses a number as a label value.
    tid = f"u{uuid.uuid4().hex[:6]}"
    label = {"gpuheal.io/upgrade-test": tid}
    first, second = own_gpu_nodes(2, **label)
    pname = f"default-{tid}"
    values = _values(tmp_path, pname, label)
    helm("install", release, str(CHART), "-n", namespace, "-f", str(values))
    try:
        _upgrade_mid_incident(
            helm,
            release=release,
            chart=("-n", namespace, "-f", str(values)),
            pname=pname,
            nodes=(first, second),
            objects=objects,
            run_operator=run_operator,
        )
    finally:
        objects.cleanup([first, second])


def _upgrade_mid_incident(
    helm: Helm,
    *,
    release: str,
    chart: tuple[str, ...],
    pname: str,
    nodes: tuple[str, str],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = objects.core
    first, second = nodes
    namespace = chart[1]

    def get_policy() -> dict[str, Any]:
        found = objects.get("remediationpolicies", pname)
        assert found is not None, f"RemediationPolicy {pname} is gone"
        return found

    def remediations() -> int:
        return int(get_policy()["spec"]["safety"]["rateLimit"]["remediations"])

    def blocked_by_breaker(node: str) -> bool:
        c = condition(objects.incident(node), "Blocked")
        return bool(c and c["status"] == "True" and c["reason"] == "CircuitBreakerOpen")

    op = run_operator()
    try:
        simulate_xid(core, first, 79)
        wait_for(lambda: objects.node(first).spec.unschedulable, "first node cordoned")
        simulate_xid(core, second, 79)
        wait_for(lambda: blocked_by_breaker(second), "second incident held by the breaker")
        opened = wait_for(
            lambda: (c := condition(get_policy(), "CircuitBreakerOpen")) and c["status"] == "True"
            and c,
            "policy breaker open",
        )  # fmt: skip
        wait_for(lambda: get_policy()["status"].get("remediatingNodes") == 1, "1 remediating")
        uid = get_policy()["metadata"]["uid"]
        incidents = [objects.incident(n)["metadata"]["name"] for n in (first, second)]

        def kept(step: str) -> None:
            """The policy is the same object, its breaker open since the first time, both
            incidents open, and the second still held by the breaker."""
            policy = get_policy()
            assert policy["metadata"]["uid"] == uid, f"{step}: the policy was re-created"
            now = condition(policy, "CircuitBreakerOpen")
            assert now is not None, f"{step}: breaker forgotten: {dump(policy.get('status'))}"
            assert (now["status"], now["lastTransitionTime"]) == (
                "True",
                opened["lastTransitionTime"],
            ), f"{step}: {dump(now)}"
            for name in incidents:
                nrem = objects.get("noderemediations", name)
                assert nrem is not None, f"{step}: incident {name} is gone"
                assert completed(nrem) is None, f"{step}: {dump(nrem)}"
            assert blocked_by_breaker(second), f"{step}: {dump(objects.incident(second))}"
            assert objects.node(first).spec.unschedulable
            assert not objects.node(second).spec.unschedulable

        def upgrade(step: str, *args: str) -> None:
            out = helm(*args).stdout
            assert "STATUS: deployed" in out or "Rollback was a success" in out, out
            kept(step)
            hold(lambda: blocked_by_breaker(second), f"second incident held after {step}", 3)
            kept(f"{step}, 3 s later")

        # Mid-incident, a value of the policy changes: the spec follows, the status stays.
        upgrade(
            "helm upgrade", "upgrade", release, str(CHART), *chart,
            "--set", "defaultPolicy.spec.safety.rateLimit.remediations=4",
        )  # fmt: skip
        assert remediations() == 4
    finally:
        op.stop()
    # A new operator starts from what is stored: the breaker as the status says.
    op = run_operator()
    try:
        hold(lambda: blocked_by_breaker(second), "second incident held after a restart", 4)
        kept("operator restart")
        upgrade(
            "a second helm upgrade", "upgrade", release, str(CHART), *chart,
            "--set", "defaultPolicy.spec.safety.rateLimit.remediations=5",
        )  # fmt: skip
        assert remediations() == 5
        upgrade("helm rollback to revision 1", "rollback", release, "1", "-n", namespace)
        assert remediations() == 3
        upgrade("helm rollback to revision 3", "rollback", release, "3", "-n", namespace)
        assert remediations() == 5
    finally:
        op.stop()
    # The breaker opened once: nothing forgot it and opened it again.
    reasons = [e.reason for e in node_events(core, pname, "RemediationPolicy")]
    assert reasons.count("CircuitBreakerOpen") == 1, reasons
    history = json.loads(helm("history", release, "-n", namespace, "-o", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2, 3, 4, 5]


# --- the README's install: the chart creates the CRDs and the default objects -------------------


@pytest.fixture
def bare_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A kube-apiserver of its own, without gpuheal's CRDs (the session's has them), and a
    non-GPU node for the operator (`helm install --wait` waits for it)."""
    from gpuheal_dev.sandbox.nodes import create_gpu_nodes, wait_nodes_ready

    sb = Sandbox.up(
        SandboxConfig(
            root=tmp_path_factory.mktemp("bare-sandbox"), gpu_nodes=0, spare_nodes=0, slurm=False
        )
    )
    try:
        core = sb.core_v1()
        create_gpu_nodes(core, ["system"], gpus=0, labels={"nvidia.com/gpu.present": "false"})
        wait_nodes_ready(core, ["system"])
        yield sb
    finally:
        sb.down()


def test_first_install_creates_the_default_objects_and_upgrades_keep_them(
    bare_sandbox: Sandbox, tmp_path: Path
) -> None:
    sb = bare_sandbox
    assert sb.kubectl("get", "crd", "remediationpolicies.gpuheal.io", check=False).returncode
    helm = Helm(cluster_bin_dir() / "helm", tmp_path / "helm-home", kubeconfig=sb.kubeconfig)
    sb.kubectl("create", "namespace", "gpuheal-system")
    chart = (str(CHART), "-n", "gpuheal-system")
    values = {
        "agent": {"enabled": False},
        "defaultPolicy": {"enabled": True},  # the README's: the catalogue, in dry run
        "defaultReservePool": {
            "enabled": True,
            "spec": {"nodeSelector": {"matchLabels": {"gpuheal.io/pool": "reserve"}}},
        },
    }
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))

    def get(kind: str, name: str) -> dict[str, Any]:
        got = sb.kubectl("get", kind, name, "-o", "json", check=False)
        assert got.returncode == 0, f"{kind}/{name}: {got.stderr}"
        return dict(json.loads(got.stdout))

    # The README's: --wait, so that Helm waits for the CRDs before it creates the hooks.
    out = helm("install", "gpuheal", *chart, "-f", str(path), "--wait", "--timeout=3m").stdout
    policy = get("remediationpolicy", "default")
    assert "created after the CRDs, by a post-install hook" in out, out  # NOTES.txt
    uid, pool_uid = policy["metadata"]["uid"], get("reservepool", "spares")["metadata"]["uid"]
    assert policy["spec"]["safety"]["dryRun"] is True
    # What the operator would write: a breaker open since a moment that must not move.
    status = {
        "remediatingNodes": 1,
        "conditions": [
            {
                "type": "CircuitBreakerOpen",
                "status": "True",
                "reason": "MaxUnhealthyReached",
                "message": "1 of 1 nodes remediating",
                "lastTransitionTime": "2026-01-02T03:04:05Z",
            }
        ],
    }
    sb.kubectl(
        "patch", "remediationpolicy", "default", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip

    def kept(step: str) -> dict[str, Any]:
        now = get("remediationpolicy", "default")
        assert now["metadata"]["uid"] == uid, f"{step}: the policy was re-created"
        assert now.get("status") == status, f"{step}: {dump(now.get('status'))}"
        assert get("reservepool", "spares")["metadata"]["uid"] == pool_uid, step
        return now

    # The first upgrade takes the hook-made objects into the release: Helm patches nothing
    # then (NOTES.txt says so), the value applies with the next upgrade.
    go_live = ("--reuse-values", "--set", "defaultPolicy.dryRun=false")
    out = helm("upgrade", "gpuheal", *chart, *go_live).stdout
    assert "applies with the next `helm upgrade`" in out, out
    assert kept("the first upgrade")["spec"]["safety"]["dryRun"] is True
    out = helm("upgrade", "gpuheal", *chart, *go_live).stdout
    assert "applies with the next" not in out, out
    assert kept("the second upgrade")["spec"]["safety"]["dryRun"] is False
    # From then on each upgrade and rollback applies its values at once.
    helm("upgrade", "gpuheal", *chart, "--reuse-values", "--set", "defaultPolicy.dryRun=true")
    assert kept("a third upgrade")["spec"]["safety"]["dryRun"] is True
    helm("rollback", "gpuheal", "3", "-n", "gpuheal-system")
    assert kept("a rollback to revision 3")["spec"]["safety"]["dryRun"] is False
    helm("rollback", "gpuheal", "1", "-n", "gpuheal-system")  # without them in its manifest
    kept("a rollback to revision 1")
    out = helm("upgrade", "gpuheal", *chart, "--reuse-values").stdout  # takes them over again
    assert "applies with the next `helm upgrade`" in out, out
    assert kept("an upgrade after it")["spec"]["safety"]["dryRun"] is False
    out = helm("uninstall", "gpuheal", "-n", "gpuheal-system").stdout
    kept("helm uninstall")  # helm.sh/resource-policy: keep
