"""Least privilege at the bridge, on the sandbox's real Slurm with the bridge as its own process
(issue 23): a token without ``admin`` cannot lift an admin's drain, not even by naming its
reason as a reserve pool's (only the bridge's ``--reserve-reasons`` are); a requeue that names no
``from_node`` is refused; a node outside ``--allowed-nodes`` is refused; the slurmrestd JWT
is read again when its file changes, with no restart."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gpuheal_dev.sandbox.slurm import SlurmCluster
from gpuheal_dev.sandbox.slurmroot import HOST_SLURM
from tests.fixtures.slurm import on_release
from tests.integration.bridge_harness import BridgeProcess
from tests.integration.operator_harness import wait_for

pytestmark = pytest.mark.integration
OPERATOR = "scoped-operator-token-0123456789abcdef"
ADMIN = "scoped-admin-token-0123456789abcdef"
RESUMER = "scoped-resume-token-0123456789abcdef"
NODES = ("sc-node-0", "sc-node-1", "sc-node-2")
# As the chart writes the operator's token (a bare token: every scope but admin), beside a
# person's admin token and a token that may only resume.
TOKENS = f"{OPERATOR}\nalice:{ADMIN}:admin\nresumer:{RESUMER}:resume\n"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def cluster(make_slurm_cluster: Callable[..., SlurmCluster]) -> SlurmCluster:
    return make_slurm_cluster(NODES, name="scopes")


def reason(cluster: SlurmCluster, node: str) -> str:
    return cluster.run("sinfo", "-h", "-n", node, "-o", "%E").stdout.strip()


def job_state(cluster: SlurmCluster, job: int) -> str:
    return cluster.run("squeue", "-h", "-j", str(job), "-o", "%T").stdout.strip()


def test_the_operators_token_cannot_resume_an_admins_drain(
    cluster: SlurmCluster, run_bridge: Callable[..., BridgeProcess]
) -> None:
    node, spare = NODES[1], NODES[2]
    cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=admin: fan swap")
    cluster.run("scontrol", "update", f"nodename={spare}", "state=drain", "reason=reserve pool")
    bridge = run_bridge(cluster, token=OPERATOR, tokens=TOKENS)
    audit = Path(bridge.argv[bridge.argv.index("--state-dir") + 1]) / "audit.jsonl"
    with httpx.Client(base_url=bridge.url, timeout=30) as h:
        path = f"/v1/nodes/{node}/resume"
        plain = h.post(path, headers=bearer(OPERATOR), json={})
        assert plain.status_code == 409, plain.text  # someone else's drain
        forced = h.post(path, headers=bearer(OPERATOR), json={"force": True})
        assert forced.status_code == 403, forced.text
        assert "lacks the scope admin" in forced.json()["message"]
        # The admin's reason sent back as a reserve pool's: not one of the bridge's
        # --reserve-reasons (default "reserve pool"), refused for either token.
        for token in (RESUMER, OPERATOR):
            named = h.post(path, headers=bearer(token), json={"reserve_reason": "admin: fan swap"})
            assert named.status_code == 403, named.text
            assert (
                "'admin: fan swap' is not one of the bridge's reserve pool reasons"
                in (named.json()["message"])
            )
        assert cluster.node_states()[node] == "drained"
        assert reason(cluster, node) == "admin: fan swap"
        # A spare waiting with the pool's reason: the resume scope lifts it.
        pool = {"reserve_reason": "reserve pool"}
        spared = h.post(f"/v1/nodes/{spare}/resume", headers=bearer(RESUMER), json=pool)
        assert spared.status_code == 200, spared.text
        assert spared.json()["outcome"] == "resumed"
        # the admin's token may
        lifted = h.post(path, headers=bearer(ADMIN), json={"force": True})
        assert lifted.status_code == 200, lifted.text
        assert lifted.json()["forced"] is True
    # back in service ("idle*" for a moment when slurmd had not answered a ping yet)
    wait_for(lambda: cluster.node_states()[node] == "idle", f"{node} idle")
    lines = [httpx.Response(200, content=x).json() for x in audit.read_text().splitlines()]
    assert [(x["who"], x["status"], x["peer"]) for x in lines] == [
        ("token-0", 409, "127.0.0.1"),
        ("token-0", 403, "127.0.0.1"),
        ("resumer", 403, "127.0.0.1"),
        ("token-0", 403, "127.0.0.1"),
        ("resumer", 200, "127.0.0.1"),
        ("alice", 200, "127.0.0.1"),
    ]


def test_a_requeue_without_from_node_is_refused(
    cluster: SlurmCluster, run_bridge: Callable[..., BridgeProcess]
) -> None:
    node = NODES[0]
    job = int(cluster.run("sbatch", "--parsable", "-w", node, "--wrap", "sleep 300").stdout)
    wait_for(lambda: job_state(cluster, job) == "RUNNING", "job running")
    bridge = run_bridge(cluster, token=OPERATOR, tokens=TOKENS)
    with httpx.Client(base_url=bridge.url, timeout=60) as h:
        for body in ({}, {"mode": "requeuehold"}, {"checkpoint": {"signal": "USR1"}}):
            resp = h.post(f"/v1/jobs/{job}/requeue", headers=bearer(ADMIN), json=body)
            assert resp.status_code == 422, resp.text
            assert "from_node" in resp.json()["message"]
        time.sleep(1)
        assert job_state(cluster, job) == "RUNNING"
        restarts = cluster.run("scontrol", "show", "job", str(job)).stdout
        assert "Restarts=0" in restarts
        # named, it is requeued
        resp = h.post(f"/v1/jobs/{job}/requeue", headers=bearer(OPERATOR), json={"from_node": node})
        assert resp.status_code == 200, resp.text
        assert resp.json()["outcome"] == "requeued"
    cluster.run("scancel", str(job))


def test_a_node_outside_the_allowed_nodes_is_refused(
    cluster: SlurmCluster, run_bridge: Callable[..., BridgeProcess]
) -> None:
    outside = NODES[2]
    job = int(cluster.run("sbatch", "--parsable", "-w", outside, "--wrap", "sleep 300").stdout)
    wait_for(lambda: job_state(cluster, job) == "RUNNING", "job running")
    bridge = run_bridge(cluster, "--allowed-nodes", "sc-node-[0-1]", token=OPERATOR, tokens=TOKENS)
    with httpx.Client(base_url=bridge.url, timeout=60) as h:
        for path, body in (
            (f"/v1/nodes/{outside}/drain", {"incident": "nrem-out", "requeue": {}}),
            (f"/v1/nodes/{outside}/reboot", {"incident": "nrem-out"}),
            (f"/v1/jobs/{job}/requeue", {"from_node": outside}),
        ):
            resp = h.post(path, headers=bearer(ADMIN), json=body)
            assert resp.status_code == 403, resp.text
            assert f"{outside} is not in the bridge's allowed nodes" in resp.json()["message"]
        assert h.get(f"/v1/nodes/{outside}", headers=bearer(ADMIN)).status_code == 403
        inside = h.post(f"/v1/nodes/{NODES[0]}/drain", headers=bearer(OPERATOR),
                        json={"incident": "nrem-in"})  # fmt: skip
        assert inside.status_code == 200, inside.text
    assert cluster.node_states()[outside] == "mixed"  # its job's, not drained
    assert job_state(cluster, job) == "RUNNING"
    assert "every node of the Slurm cluster may be" not in bridge.read_log()
    cluster.run("scancel", str(job))


def test_without_allowed_nodes_the_bridge_warns_at_start(
    cluster: SlurmCluster, run_bridge: Callable[..., BridgeProcess]
) -> None:
    bridge = run_bridge(cluster, token=OPERATOR)
    assert "no --allowed-nodes: every node of the Slurm cluster may be" in bridge.read_log()


# ---- the slurmrestd JWT ------------------------------------------------------------------------


class JwtGate:
    """In front of the sandbox's real slurmrestd (``rest_auth/local`` on its socket), what a
    JWT-checking slurmrestd does with a rotated key: only the JWT of the moment (``valid``)
    is let through, any other is answered 401. Records every JWT it was shown."""

    def __init__(self, socket: Path) -> None:
        self.valid = ""
        self.seen: list[str] = []
        upstream = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://slurmrestd"
        )
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                token = self.headers.get("X-SLURM-USER-TOKEN") or ""
                gate.seen.append(token)
                if token != gate.valid:
                    self.send_response(401)
                    self.end_headers()
                    return
                resp = upstream.get(self.path)
                self.send_response(resp.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(resp.content)))
                self.end_headers()
                self.wfile.write(resp.content)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.upstream = upstream

    def __enter__(self) -> JwtGate:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.upstream.close()


@pytest.fixture
def restd_cluster(make_slurm_cluster: Callable[..., SlurmCluster]) -> SlurmCluster:
    return make_slurm_cluster(NODES, name="scopes-restd", restd=True)


@pytest.fixture
def gate(restd_cluster: SlurmCluster) -> Iterator[JwtGate]:
    assert restd_cluster.restd_socket is not None
    with JwtGate(restd_cluster.restd_socket) as g:
        yield g


# the gate plays a JWT-checking slurmrestd in front of 22.05's rest_auth/local socket; on 26.05
# slurmrestd checks JWTs itself: the next test
@on_release(HOST_SLURM)
def test_a_rotated_slurmrestd_jwt_is_used_without_a_restart(
    restd_cluster: SlurmCluster,
    run_bridge: Callable[..., BridgeProcess],
    gate: JwtGate,
    tmp_path: Path,
) -> None:
    jwt = tmp_path / "slurmrestd-jwt"
    jwt.write_text("jwt-before-rotation\n")
    gate.valid = "jwt-before-rotation"
    bridge = run_bridge(
        restd_cluster,
        "--backend", "rest", "--rest-url", gate.url, "--rest-token-file", str(jwt),
        "--rest-user", "gpuheal", "--health-interval", "3600",
        # 22.05's slurmrestd cannot requeue: a REST-only bridge is refused at start
        "--rest-write-fallback", "cli",
        token=OPERATOR,
    )  # fmt: skip
    pid = bridge.proc.pid
    with httpx.Client(base_url=bridge.url, timeout=30) as h:
        node = f"/v1/nodes/{NODES[0]}"
        assert h.get(node, headers=bearer(OPERATOR)).status_code == 200
        # rotated as a Secret volume does it: a new file moved over the old one
        staged = tmp_path / "slurmrestd-jwt.new"
        staged.write_text("jwt-after-rotation\n")
        staged.replace(jwt)
        gate.valid = "jwt-after-rotation"  # slurmctld's key rotated: the old JWT is refused
        resp = h.get(node, headers=bearer(OPERATOR))
        assert resp.status_code == 200, resp.text
        assert resp.json()["slurm_node"] == NODES[0]
    assert bridge.proc.pid == pid
    assert bridge.proc.poll() is None
    assert gate.seen[-1] == "jwt-after-rotation"
    assert "jwt-before-rotation" in gate.seen
    assert "slurmrestd JWT read again" in bridge.read_log()


#: seconds the first JWT of the 26.05 rotation lives: enough for the bridge to start and answer
FIRST_JWT_SECONDS = 20


@on_release("26.05")
def test_a_rotated_jwt_is_used_by_a_rest_bridge_on_26_05_without_a_restart(
    make_slurm_cluster: Callable[..., SlurmCluster],
    run_bridge: Callable[..., BridgeProcess],
    tmp_path: Path,
) -> None:
    """Against 26.05's own slurmrestd (auth/jwt): the bridge starts with a JWT that expires;
    a fresh one is moved over the file as a Secret update does; once the first has expired
    (slurmrestd refuses it) the same bridge process still reads and writes through REST."""
    cluster = make_slurm_cluster(NODES, name="jwt26", restd=True)
    assert cluster.restd_url is not None

    def token(lifespan: int) -> str:
        out = cluster.run("scontrol", "token", "username=root", f"lifespan={lifespan}").stdout
        return out.strip().removeprefix("SLURM_JWT=")

    def restd_status(jwt: str) -> int:
        headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": jwt}
        with httpx.Client(base_url=str(cluster.restd_url), timeout=10) as h:
            return h.get(f"/slurm/v0.0.45/node/{NODES[0]}", headers=headers).status_code

    short = token(FIRST_JWT_SECONDS)
    expires = time.monotonic() + FIRST_JWT_SECONDS
    assert restd_status(short) == 200
    jwt = tmp_path / "slurmrestd-jwt"
    jwt.write_text(short + "\n")
    bridge = run_bridge(
        cluster,
        "--backend", "rest", "--rest-url", cluster.restd_url, "--rest-token-file", str(jwt),
        "--health-interval", "3600",
        token=OPERATOR,
    )  # fmt: skip
    pid = bridge.proc.pid
    node = f"/v1/nodes/{NODES[0]}"
    with httpx.Client(base_url=bridge.url, timeout=30) as h:
        assert h.get(node, headers=bearer(OPERATOR)).status_code == 200
        assert time.monotonic() < expires, "the bridge took the first JWT's whole life to start"
        staged = tmp_path / "slurmrestd-jwt.new"
        staged.write_text(token(3600) + "\n")
        staged.replace(jwt)
        time.sleep(max(0.0, expires - time.monotonic()) + 2)
        # the first JWT is dead (26.05.5 answers 511): only a reread one works now
        assert restd_status(short) != 200
        resp = h.get(node, headers=bearer(OPERATOR))
        assert resp.status_code == 200, resp.text
        assert resp.json()["slurm_node"] == NODES[0]
        drained = h.post(
            f"{node}/drain",
            headers=bearer(OPERATOR),
            json={"incident": "nrem-jwt26"},
        )
        assert drained.status_code == 200, drained.text
    assert "gpuheal: nrem-jwt26" in cluster.run("scontrol", "show", "node", NODES[0]).stdout
    assert bridge.proc.pid == pid
    assert bridge.proc.poll() is None
    assert "slurmrestd JWT read again" in bridge.read_log()
