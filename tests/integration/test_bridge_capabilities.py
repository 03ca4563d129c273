"""The bridge knows its Slurm: at start it reads the release and what its backend can do there,
logs it in one line and serves it at ``/v1/capabilities``; a backend that cannot requeue on
that Slurm is refused at start in one line (real bridge processes, real 22.05 and 26.05
sandboxes, slurmrestd with rest_auth/local on 22.05 and JWT on 26.05)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable

import pytest

from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.bridge_harness import BridgeProcess, exited

pytestmark = pytest.mark.integration

TOKEN = "capabilities-token-0123456789abcdef"
NODES = ("gpu-node-0", "gpu-node-1")


def capabilities(bridge: BridgeProcess) -> dict[str, object]:
    request = urllib.request.Request(
        f"{bridge.url}/v1/capabilities", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        body: dict[str, object] = json.loads(resp.read())
    return body


def rest_args(cluster: SlurmCluster) -> list[str]:
    assert cluster.restd_url is not None
    args = ["--backend", "rest", "--rest-url", cluster.restd_url]
    if cluster.restd_token_file is not None:  # 26.05: JWT
        args += ["--rest-token-file", str(cluster.restd_token_file)]
    return args


def test_a_rest_only_bridge_that_cannot_requeue_refuses_to_start_in_one_line(
    make_slurm_cluster: Callable[..., SlurmCluster],
    run_bridge: Callable[..., BridgeProcess],
) -> None:
    """22.05's slurmrestd (v0.0.38) has no requeue: refused, naming what to configure instead."""
    cluster = make_slurm_cluster(NODES, name="caprest22", restd=True, slurm="22.05")
    bridge = run_bridge(cluster, *rest_args(cluster), token=TOKEN, wait_ready=False)
    assert exited(bridge) == 1
    lines = [line for line in bridge.read_log().splitlines() if line.strip()]
    assert lines[-1].startswith(
        "gpuheal-slurm-bridge: the rest backend cannot requeue jobs on Slurm 22.05."
    ), lines
    assert "(slurmrestd v0.0.38 has no requeue" in lines[-1]
    assert "--backend cli" in lines[-1]
    assert "--rest-write-fallback cli" in lines[-1]
    assert not [line for line in lines if "Traceback" in line]


def test_a_rest_only_bridge_on_26_05_starts_and_requeues_with_slurmrestd_alone(
    make_slurm_cluster: Callable[..., SlurmCluster],
    run_bridge: Callable[..., BridgeProcess],
) -> None:
    """26.05's slurmrestd (v0.0.45) requeues and updates jobs: the rest backend alone can do
    everything but reboot (no REST endpoint), and the bridge starts."""
    cluster = make_slurm_cluster(NODES, name="caprest26", restd=True, slurm="26.05")
    bridge = run_bridge(cluster, *rest_args(cluster), token=TOKEN)
    got = capabilities(bridge)
    assert (got["backend"], got["rest_api_version"]) == ("rest", "v0.0.45")
    assert str(got["slurm_version"]).startswith("26.05.")
    assert got["missing"] == ["reboot"]
    assert got["backends"] == {"rest": got["capabilities"]}
    assert {"requeue", "update_job"} <= set(got["capabilities"])  # type: ignore[arg-type]


@pytest.mark.parametrize("release", ["22.05", "26.05"])
def test_the_bridge_reads_its_slurm_logs_it_and_serves_it(
    make_slurm_cluster: Callable[..., SlurmCluster],
    run_bridge: Callable[..., BridgeProcess],
    release: str,
) -> None:
    """The CLI backend (that release's own scontrol) can do everything; slurmrestd with the CLI
    as its write fallback reads and drains itself where its API can (v0.0.45)."""
    cluster = make_slurm_cluster(NODES, name=f"capcli{release[:2]}", restd=True, slurm=release)
    cli = run_bridge(cluster, "--log-level", "info", token=TOKEN, name="cli")
    got = capabilities(cli)
    assert got["backend"] == "cli"
    assert str(got["slurm_version"]).startswith(f"{release}.")
    assert got["missing"] == []
    assert "requeue" in got["capabilities"]  # type: ignore[operator]
    logged = [line for line in cli.read_log().splitlines() if "backend cli on Slurm" in line]
    assert len(logged) == 1
    assert f"backend cli on Slurm {got['slurm_version']}: can drain, " in logged[0]

    hybrid = run_bridge(
        cluster, *rest_args(cluster), "--rest-write-fallback", "cli", token=TOKEN, name="rest"
    )
    got = capabilities(hybrid)
    assert got["backend"] == "rest"
    assert str(got["slurm_version"]).startswith(f"{release}.")
    assert got["missing"] == []
    backends = got["backends"]
    assert isinstance(backends, dict)
    assert "requeue" in backends["cli"]
    if release == "22.05":
        assert got["rest_api_version"] == "v0.0.38"
        assert backends["rest"] == ["read_jobs", "read_nodes"]
    else:
        assert got["rest_api_version"] == "v0.0.45"
        assert backends["rest"] == [
            "drain", "read_jobs", "read_nodes", "requeue", "resume", "signal", "update_job",
        ]  # fmt: skip
