"""The bridge as a Slurm admin would run it, on the sandbox's real Slurm: plain HTTP only on
loopback, TLS verified with a CA bundle from another address, tokens rotated with SIGHUP
while requests keep flowing, Slurm asked about one node or job at a time, and its slurmctld
gauge kept current with nobody calling /readyz. The bridge runs as its own process."""

from __future__ import annotations

import asyncio
import os
import ssl
import stat
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gpuheal.adapters.slurm import BridgeSlurm, SlurmError
from gpuheal_bridge.api.models import RequeueOptions
from gpuheal_bridge.client import BridgeClient
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.bridge_harness import BridgeProcess, exited, host_address, make_tls
from tests.integration.operator_harness import free_port, wait_for
from tests.integration.test_bridge_slurm import _restart_slurmctld

pytestmark = pytest.mark.integration
TOKEN = "secure-bridge-token-0123456789abcdef"
NEW_TOKEN = "rotated-bridge-token-fedcba9876543210"
NODES = ("sec-node-0", "sec-node-1")


@pytest.fixture
def cluster(make_slurm_cluster: Callable[..., SlurmCluster]) -> SlurmCluster:
    return make_slurm_cluster(NODES, name="secure")


@pytest.mark.parametrize("where", ["0.0.0.0", "host", "[::]"])
def test_plain_http_off_loopback_is_refused_at_start(
    cluster: SlurmCluster, run_bridge: Callable[..., BridgeProcess], where: str
) -> None:
    host = host_address() if where == "host" else where
    if host is None:
        pytest.skip("this machine has no address besides loopback")
    bridge = run_bridge(cluster, token=TOKEN, host=host, wait_ready=False)
    assert exited(bridge) == 1
    assert "is not a loopback address: serving it plain HTTP" in bridge.read_log()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{bridge.port}/healthz", timeout=2)


def test_tls_is_served_and_verified_with_the_ca_from_another_address(
    cluster: SlurmCluster, run_bridge: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    host = host_address()
    if host is None:
        pytest.skip("this machine has no address besides loopback")
    tls = make_tls(tmp_path / "pki", "127.0.0.1", host)
    bridge = run_bridge(cluster, token=TOKEN, host="0.0.0.0", tls=tls)
    remote = f"https://{host}:{bridge.port}"

    async def calls() -> None:
        async with BridgeClient(remote, TOKEN, verify=str(tls.ca), retries=0) as client:
            node = await client.get_node(NODES[0])
            assert node.slurm_node == NODES[0]
            assert (await client.ready()).ready
        # without the CA bundle, the certificate is not trusted: nothing is sent
        async with BridgeClient(remote, TOKEN, retries=0) as untrusting:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await untrusting.ready()

    asyncio.run(calls())
    # plain HTTP to the TLS port gets no answer from the API
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://{host}:{bridge.port}/healthz", timeout=5).read()
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    with urllib.request.urlopen(f"{remote}/healthz", timeout=5, context=ctx) as resp:
        assert resp.status == 200


def test_sighup_reloads_a_rotated_token_without_dropping_a_request(
    cluster: SlurmCluster,
    run_bridge: Callable[..., BridgeProcess],
    checkpoint_job: Path,
    tmp_path: Path,
) -> None:
    """Rotation as an admin does it: add the new token, SIGHUP, move the client, drop the old
    one, SIGHUP. Requests run all along (a long drain+requeue in flight at each SIGHUP);
    every one is answered 200, and the process is the same one throughout."""
    bridge = run_bridge(cluster, token=TOKEN)
    pid = bridge.proc.pid
    current = {"token": TOKEN}
    answers: list[int] = []
    stop = threading.Event()

    def keep_asking() -> None:
        with httpx.Client(base_url=bridge.url, timeout=30) as http:
            while not stop.is_set():
                token = current["token"]
                resp = http.get(
                    f"/v1/nodes/{NODES[1]}", headers={"Authorization": f"Bearer {token}"}
                )
                answers.append(resp.status_code)

    def rotate(text: str) -> None:
        staged = bridge.token_file.with_suffix(".new")
        staged.write_text(text)
        staged.chmod(stat.S_IRUSR | stat.S_IWUSR)
        staged.replace(bridge.token_file)  # atomic, as a careful admin does it

    def accepts(token: str) -> bool:
        req = urllib.request.Request(
            f"{bridge.url}/v1/nodes/{NODES[1]}", headers={"Authorization": f"Bearer {token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError as exc:
            if exc.code != 401:
                raise
            return False

    def long_drain(incident: str) -> threading.Thread:
        """A drain that requeues a job with a 2 s checkpoint grace: in flight at the SIGHUP."""
        job = cluster.run(
            "sbatch", "--parsable", "-w", NODES[0], "-o", str(tmp_path / f"{incident}.out"),
            str(checkpoint_job), str(tmp_path / f"{incident}.ckpt"), "0.2",
        ).stdout.strip()  # fmt: skip
        wait_for(
            lambda: cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING",
            f"job {job} running",
        )

        def drain() -> None:
            body = {"incident": incident, "requeue": {"checkpoint": {"grace_seconds": 2}}}
            with httpx.Client(base_url=bridge.url, timeout=60) as http:
                resp = http.post(
                    f"/v1/nodes/{NODES[0]}/drain", json=body,
                    headers={"Authorization": f"Bearer {current['token']}"},
                )  # fmt: skip
                answers.append(resp.status_code)
                cluster.run("scontrol", "update", f"NodeName={NODES[0]}", "State=RESUME")

        thread = threading.Thread(target=drain)
        thread.start()
        time.sleep(0.5)  # the bridge is in the grace period now
        return thread

    asker = threading.Thread(target=keep_asking)
    asker.start()
    try:
        time.sleep(0.5)
        rotate(f"operator:{TOKEN}\noperator-next:{NEW_TOKEN}\n")
        assert not accepts(NEW_TOKEN)  # not before the SIGHUP
        in_flight = long_drain("nrem-rot-1")
        bridge.sighup()
        wait_for(lambda: accepts(NEW_TOKEN), "the new token accepted after SIGHUP")
        in_flight.join(timeout=60)
        current["token"] = NEW_TOKEN
        time.sleep(0.5)
        rotate(f"operator-next:{NEW_TOKEN}\n")
        in_flight = long_drain("nrem-rot-2")
        bridge.sighup()
        wait_for(lambda: not accepts(TOKEN), "the old token refused after the second SIGHUP")
        in_flight.join(timeout=60)
        time.sleep(0.5)
    finally:
        stop.set()
        asker.join(timeout=60)
    assert len(answers) > 20
    assert set(answers) == {200}, sorted(set(answers))
    assert bridge.proc.poll() is None
    assert bridge.proc.pid == pid
    assert bridge.gauge('gpuheal_bridge_token_reloads_total{result="ok"}') == 2
    assert bridge.gauge("gpuheal_bridge_tokens") == 1
    # a broken file is not taken: the tokens of the moment stay
    bridge.token_file.write_text("operator-next:short\n")
    bridge.sighup()
    wait_for(
        lambda: bridge.gauge('gpuheal_bridge_token_reloads_total{result="error"}') == 1,
        "the failed reload counted",
    )
    assert accepts(NEW_TOKEN)

    async def client_follows_the_file() -> None:
        """The operator's client reads its token file per request (a rotated Secret)."""
        mine = tmp_path / "operator-token"
        mine.write_text(TOKEN)
        slurm = BridgeSlurm.from_settings(bridge.url, str(mine), None, retries=0)
        with pytest.raises(SlurmError, match="401"):
            await slurm.node(NODES[1])
        mine.write_text(NEW_TOKEN + "\n")
        os.utime(mine, ns=(time.time_ns(), time.time_ns()))
        assert (await slurm.node(NODES[1])).slurm_node == NODES[1]
        await slurm.close()

    asyncio.run(client_follows_the_file())


def _shim(bin_dir: Path, log: Path, real: Path) -> None:
    """Slurm's commands, logging their arguments, then running the real ones."""
    bin_dir.mkdir()
    for tool in ("scontrol", "squeue", "scancel", "sinfo"):
        path = bin_dir / tool
        path.write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\nexec {real / tool} "$@"\n')
        path.chmod(0o755)


def test_slurm_is_asked_about_one_node_or_job_never_the_whole_queue(
    cluster: SlurmCluster,
    run_bridge: Callable[..., BridgeProcess],
    checkpoint_job: Path,
    tmp_path: Path,
) -> None:
    calls = tmp_path / "slurm-calls.log"
    _shim(tmp_path / "bin", calls, cluster.bin_dir or Path("/usr/bin"))
    bridge = run_bridge(cluster, "--slurm-bin-dir", str(tmp_path / "bin"), token=TOKEN)
    # other jobs in the queue, on both nodes
    other = {
        node: cluster.run("sbatch", "--parsable", "-w", node, "--wrap", "sleep 300").stdout.strip()
        for node in NODES
    }
    job = cluster.run(
        "sbatch", "--parsable", "-w", NODES[0], "-o", str(tmp_path / "j.out"),
        str(checkpoint_job), str(tmp_path / "j.ckpt"), "0.2",
    ).stdout.strip()  # fmt: skip
    wait_for(
        lambda: cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING",
        "job running",
    )

    async def calls_through_the_api() -> None:
        async with BridgeClient(bridge.url, TOKEN, retries=0) as client:
            jobs = (await client.node_jobs(NODES[0])).jobs
            assert {j.job_id for j in jobs} == {int(job), int(other[NODES[0]])}
            assert (await client.get_job(int(job))).state == "RUNNING"
            drained = await client.drain(
                NODES[0], incident="nrem-filter", requeue=RequeueOptions(exclude_node=True)
            )
            assert {j.job_id for j in drained.jobs} == {int(job), int(other[NODES[0]])}

    asyncio.run(calls_through_the_api())
    lines = calls.read_text().splitlines()
    squeue = [ln for ln in lines if ln.startswith("squeue ")]
    shows = [ln for ln in lines if ln.startswith("scontrol show")]
    assert squeue
    assert shows
    for line in squeue:
        assert " -w " in f"{line} " or " -j " in f"{line} ", line
        assert "--json" not in line, line
    for line in shows:
        assert line.split()[-1] in (*NODES, job, other[NODES[0]]), line
    assert not [ln for ln in lines if ln.startswith("sinfo")]


def test_slurmctld_gauge_follows_slurmctld_with_nobody_calling_readyz(
    cluster: SlurmCluster, run_bridge: Callable[..., BridgeProcess]
) -> None:
    bridge = run_bridge(cluster, "--health-interval", "0.5", token=TOKEN)
    assert bridge.gauge("gpuheal_bridge_slurmctld_up") == 1
    start_again = _restart_slurmctld(cluster)  # stops it
    wait_for(
        lambda: bridge.gauge("gpuheal_bridge_slurmctld_up") == 0,
        "the gauge says slurmctld is down (only /metrics is read)",
        timeout=30,
    )
    checked = bridge.gauge("gpuheal_bridge_slurmctld_check_timestamp_seconds")
    assert checked is not None
    assert time.time() - checked < 15
    start_again()
    wait_for(lambda: bridge.gauge("gpuheal_bridge_slurmctld_up") == 1, "and up again", timeout=60)


def test_the_bridge_refuses_to_start_with_an_unreadable_tls_key(
    cluster: SlurmCluster, run_bridge: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    tls = make_tls(tmp_path / "pki", "127.0.0.1")
    tls.server.key.unlink()
    bridge = run_bridge(cluster, token=TOKEN, tls=tls, wait_ready=False)
    assert exited(bridge) == 1
    assert f"--tls-key {tls.server.key}: not a readable file" in bridge.read_log()
    assert free_port()  # nothing left behind
