"""The bridge's own service user instead of SlurmUser, on the sandbox's Slurm with accounting
(slurmdbd + MariaDB): what each Slurm AdminLevel lets the bridge do, measured through the
bridge's API. Every Slurm command the bridge runs is run as that user (setpriv in a
--slurm-bin-dir: what Slurm sees when the bridge itself runs as the user, as the systemd
unit runs it); the bridge process stays ours only because this sandbox's Python lives under
/root.

Measured on Slurm 22.05 and 26.05 (its slurmdbd and sacctmgr from its root), the same on
both: AdminLevel=Operator may signal, requeue and update other users' jobs, but draining or
resuming a node is a super-user RPC (UPDATE_NODE: "Invalid user id"): the service user needs
AdminLevel=Administrator for that. docs/slurm-bridge.md says so.
"""

from __future__ import annotations

import asyncio
import pwd
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuheal_bridge.api.models import CheckpointSignal, DrainOutcome, JobOutcome, RequeueOptions
from gpuheal_bridge.client import BridgeClient, BridgeConflict
from gpuheal_dev.sandbox import slurmdbd
from gpuheal_dev.sandbox.slurm import SlurmCluster
from gpuheal_dev.sandbox.slurmroot import HOST_SLURM
from tests.fixtures.slurm import on_every_release
from tests.integration.bridge_harness import BridgeProcess
from tests.integration.operator_harness import free_port, wait_for

# one worker for the module (make integration: --dist loadgroup): its Unix users are made and
# removed once per worker, and a second worker removed them under the first one's items
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("slurm-service-users")]
USER = "gpuheal-bridge"  # the name the systemd unit and the docs use
TOKEN = "service-user-bridge-token-0123456789"
NODES = ("svc-node-0", "svc-node-1")


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, str]]:
    """Unix users for each AdminLevel (created if this machine lacks them, removed after)."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run Slurm's commands as another user")
    wanted = {"Administrator": USER, "Operator": f"{USER}-op", "None": f"{USER}-none"}
    created = []
    for name in wanted.values():
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                check=True,
            )
            created.append(name)
    yield wanted
    for name in created:
        subprocess.run(["userdel", name], check=False)


@pytest.fixture
def accounted(
    make_slurm_cluster: Callable[..., SlurmCluster],
    users: dict[str, str],
    tmp_path: Path,
    slurm_release: str,
) -> Iterator[SlurmCluster]:
    """A cluster with accounting, its users and their AdminLevel set before it starts
    (slurmctld reads them then; see gpuheal_dev.sandbox.slurmdbd on why not later)."""
    if missing := slurmdbd.missing(own_root=slurm_release != HOST_SLURM):
        pytest.skip(f"accounting needs {missing} (hack/install-system-deps.sh)")
    dbd = slurmdbd.SlurmDbd(tmp_path / "dbd", port=free_port())
    cluster = make_slurm_cluster(NODES, name="svc", start=False, dbd_port=dbd.port)
    try:
        dbd.start(cluster)
        dbd.sacctmgr("add", "account", "ops")
        for level, user in users.items():
            if level != "None":
                dbd.sacctmgr("add", "user", user, "account=ops", f"adminlevel={level}")
        cluster.start()
        for level, user in users.items():
            if level != "None":
                shown = cluster.run("scontrol", "show", "assoc_mgr", f"users={user}",
                                    "flags=users").stdout  # fmt: skip
                assert f"AdminLevel={level}" in shown
        yield cluster
    finally:
        dbd.stop()


def _as_user(bin_dir: Path, user: str, cluster: SlurmCluster) -> None:
    bin_dir.mkdir()
    # a release in a root of its own: into the root first (a mount namespace needs root), then
    # the user; the root's own setpriv and client
    enter = f"{cluster.slurm_root.enter} " if cluster.slurm_root is not None else ""
    for tool in ("scontrol", "squeue", "scancel", "sinfo"):
        path = bin_dir / tool
        path.write_text(
            f"#!/bin/sh\nexec {enter}setpriv --reuid={user} --regid={user} --init-groups "
            f'/usr/bin/{tool} "$@"\n'
        )
        path.chmod(0o755)


def _running_job(cluster: SlurmCluster, node: str, script: Path, tmp_path: Path) -> int:
    job = cluster.run(
        "sbatch", "--parsable", "-w", node, "-o", str(tmp_path / "job-%j.out"),
        str(script), str(tmp_path / f"ckpt-{time.monotonic_ns()}"), "0.2",
    ).stdout.strip()  # fmt: skip
    wait_for(
        lambda: cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING",
        f"job {job} running",
    )
    return int(job)


@on_every_release
def test_the_service_user_needs_operator_for_jobs_and_administrator_for_nodes(
    accounted: SlurmCluster,
    users: dict[str, str],
    run_bridge: Callable[..., BridgeProcess],
    checkpoint_job: Path,
    tmp_path: Path,
) -> None:
    cluster = accounted
    requeue = RequeueOptions(
        checkpoint=CheckpointSignal(signal="URG", grace_seconds=0.5),  # ignored by the job
        exclude_node=True,
    )

    async def as_level(level: str) -> None:
        user = users[level]
        _as_user(tmp_path / f"bin-{level}", user, cluster)
        bridge = run_bridge(
            cluster, "--slurm-bin-dir", str(tmp_path / f"bin-{level}"), token=TOKEN, name=level
        )
        async with BridgeClient(bridge.url, TOKEN, retries=0) as client:
            job = _running_job(cluster, NODES[1], checkpoint_job, tmp_path)
            if level == "None":  # a user Slurm's accounting does not know: nothing at all
                refused = await client.requeue_job(job, requeue, from_node=NODES[1])
                assert refused.outcome is JobOutcome.FAILED, refused
                assert "Access/permission denied" in (refused.detail or ""), refused
                with pytest.raises(BridgeConflict, match="Invalid user id"):
                    await client.drain(NODES[0], incident="nrem-svc-none")
                return
            # Operator and above: another user's job is signalled, requeued, moved off the node
            result = await client.requeue_job(job, requeue, from_node=NODES[1])
            assert result.outcome is JobOutcome.REQUEUED, result
            assert result.restart_count == 1
            if level == "Operator":  # ... but a node's state is the super user's
                with pytest.raises(BridgeConflict, match="Invalid user id"):
                    await client.drain(NODES[0], incident="nrem-svc-op")
                assert "drain" not in cluster.run("sinfo", "-h", "-n", NODES[0], "-o", "%T").stdout
                return
            drained = await client.drain(
                NODES[0], incident="nrem-svc-admin", xid=79, requeue=requeue
            )
            assert drained.outcome is DrainOutcome.DRAINED
            shown = cluster.run("scontrol", "show", "node", NODES[0], "-o").stdout
            assert f"Reason=gpuheal: nrem-svc-admin xid=79 [{user}@" in shown
            resumed = await client.resume(NODES[0], incident="nrem-svc-admin")
            assert resumed.outcome.value == "resumed"

    for level in ("None", "Operator", "Administrator"):
        asyncio.run(as_level(level))
