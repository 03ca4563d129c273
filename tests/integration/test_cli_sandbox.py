"""The CLI against the sandbox's API server, as a kubectl plugin (`kubectl gpuheal`, found
on PATH by the sandbox's own kubectl): JSON that parses, a watch that prints changes and
stops on Ctrl-C, --context, and one `error:` line for forbidden, not found, unreachable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from gpuheal.cli.simulate import simulate_xid
from gpuheal_dev.sandbox import Sandbox
from tests.integration.operator_harness import (
    REPO,
    Objects,
    OperatorProcess,
    condition,
    cordon_only_rule,
    free_port,
    policy,
    wait_for,
)

pytestmark = pytest.mark.integration
VENV_BIN = Path(sys.executable).parent


def _env(sandbox: Sandbox, kubeconfig: Path | None = None) -> dict[str, str]:
    return {
        **os.environ,
        **sandbox.env(),
        "PATH": f"{VENV_BIN}:{sandbox.env()['PATH']}",
        "KUBECONFIG": str(kubeconfig or sandbox.kubeconfig),
    }


def kubectl_gpuheal(
    sandbox: Sandbox, *argv: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`kubectl gpuheal ...`: kubectl finds `kubectl-gpuheal` on PATH and runs it."""
    return subprocess.run(
        ["kubectl", "gpuheal", *argv], capture_output=True, text=True, timeout=120,
        env=_env(sandbox, kubeconfig), check=False,
    )  # fmt: skip


def incident(name: str, node: str) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples/noderemediation.yaml").read_text())
    body["metadata"] = {"name": name, "labels": {"gpuheal.io/node": node}}
    body["spec"]["nodeName"] = node
    return dict(body)


@pytest.fixture
def made(objects: Objects) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        objects.delete("noderemediations", name)


def test_kubectl_gpuheal_status_json_parses(
    sandbox: Sandbox, objects: Objects, made: list[str]
) -> None:
    node = f"cli-{uuid.uuid4().hex[:6]}"
    made.append(f"nrem-{node}")
    objects.apply("noderemediations", incident(f"nrem-{node}", node))
    out = kubectl_gpuheal(sandbox, "status", "--node", node, "-o", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kind"] == "IncidentList"
    (item,) = doc["items"]
    assert (item["name"], item["node"], item["rule"], item["xid"]) == (
        f"nrem-{node}", node, "fell-off-bus", 79)  # fmt: skip
    as_yaml = yaml.safe_load(
        kubectl_gpuheal(sandbox, "status", "--node", node, "-o", "yaml").stdout
    )
    assert [i["name"] for i in as_yaml["items"]] == [f"nrem-{node}"]
    table = kubectl_gpuheal(sandbox, "status", "--node", node).stdout.splitlines()
    assert table[0].split()[:2] == ["NAME", "NODE"]
    assert table[1].split()[:2] == [f"nrem-{node}", node]
    none = kubectl_gpuheal(sandbox, "status", "--node", "no-such-node")
    assert (none.returncode, none.stdout, none.stderr) == (0, "", "No incidents found.\n")
    version = kubectl_gpuheal(sandbox, "--version")
    assert version.stdout.strip() == "kubectl gpuheal 0.1.0"


def _one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 1, out
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: "), line
    return line


def test_forbidden_not_found_and_unreachable_are_one_error_line(
    sandbox: Sandbox, gpuheal_crds: None, tmp_path: Path
) -> None:
    nobody = sandbox.control_plane.kubeconfig_for_user("cli-nobody")
    line = _one_error_line(kubectl_gpuheal(sandbox, "status", "-o", "json", kubeconfig=nobody))
    assert 'User "cli-nobody" cannot list resource "noderemediations"' in line
    line = _one_error_line(kubectl_gpuheal(sandbox, "explain", "no-such-node-x"))
    assert line == 'error: nodes "no-such-node-x" not found'
    line = _one_error_line(
        kubectl_gpuheal(sandbox, "simulate", "xid", "--node", "no-such-node-x", "--xid", "79")
    )
    assert line == 'error: nodes "no-such-node-x" not found'
    # a kubeconfig whose current context points nowhere; --context picks the sandbox
    config = yaml.safe_load(Path(sandbox.kubeconfig).read_text())
    good = config["contexts"][0]["name"]
    dead_port = free_port()
    config["clusters"].append(
        {
            "name": "dead",
            "cluster": {
                "server": f"https://127.0.0.1:{dead_port}",
                "insecure-skip-tls-verify": True,
            },
        }
    )
    config["contexts"].append(
        {"name": "dead", "context": {"cluster": "dead", "user": config["users"][0]["name"]}}
    )
    config["current-context"] = "dead"
    two = tmp_path / "two-contexts.kubeconfig"
    two.write_text(yaml.safe_dump(config))
    line = _one_error_line(kubectl_gpuheal(sandbox, "status", "-o", "json", kubeconfig=two))
    assert line == (
        f"error: cannot reach the Kubernetes API server at https://127.0.0.1:{dead_port}: "
        "Connection refused"
    )
    ok = kubectl_gpuheal(sandbox, "status", "-o", "json", "--context", good, kubeconfig=two)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["kind"] == "IncidentList"


def test_watch_prints_each_change_and_stops_quietly_on_ctrl_c(
    sandbox: Sandbox, objects: Objects, made: list[str]
) -> None:
    node = f"cli-w-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen(
        ["kubectl", "gpuheal", "status", "-w", "-o", "json", "--node", node],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(sandbox),
        preexec_fn=_ctrl_c_default,  # noqa: PLW1509 - the test starts no threads of its own
    )  # fmt: skip
    assert proc.stdout is not None
    docs = _JsonDocs(proc.stdout)
    try:
        # the listing printed means the watch is about to open: what follows is a change
        wait_for(lambda: len(docs.docs) >= 1, "the initial listing", timeout=30)
        made.append(f"nrem-{node}")
        objects.apply("noderemediations", incident(f"nrem-{node}", node))
        wait_for(lambda: len(docs.docs) >= 2, "the ADDED change", timeout=30)
        objects.patch("noderemediations", f"nrem-{node}", {"metadata": {"labels": {"x": "y"}}})
        wait_for(lambda: len(docs.docs) >= 3, "the MODIFIED change", timeout=30)
    finally:
        # kubectl runs the plugin in the same process group: Ctrl-C reaches both
        proc.send_signal(signal.SIGINT)
        for child in _children(proc.pid):
            os.kill(child, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        docs.thread.join(timeout=10)
    assert "Traceback" not in err, err
    assert not docs.rest.strip(), docs.rest
    assert docs.docs[0] == {"kind": "IncidentList", "items": []}
    changes = [(d["change"], d["name"]) for d in docs.docs[1:]]
    assert changes == [("ADDED", f"nrem-{node}"), ("MODIFIED", f"nrem-{node}")]
    wait_for(lambda: proc.poll() is not None, "the watch ended")


class _JsonDocs:
    """The JSON documents a process prints, parsed as they arrive (a reader thread)."""

    def __init__(self, stream: IO[str]) -> None:
        self.docs: list[Any] = []
        self.rest = ""
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: IO[str]) -> None:
        decoder = json.JSONDecoder()
        for line in stream:
            self.rest += line
            while self.rest.strip():
                try:
                    doc, end = decoder.raw_decode(self.rest.lstrip())
                except json.JSONDecodeError:
                    break  # a document still arriving
                self.rest = self.rest.lstrip()[end:]
                self.docs.append(doc)


def _ctrl_c_default() -> None:
    """As from a terminal: a shell starts background jobs with SIGINT ignored, which a child
    inherits (and Python then never turns Ctrl-C into KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    return [int(p) for p in out.split()]


def test_explain_counts_the_breakers_slots_as_the_operator_does(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """`gpuheal explain` on a node the breaker holds back says what the operator recorded on
    its incident, word for word: it reads every Node and incident and counts the slots where
    the operator counts them (`policy.reading`), not from the policy's status."""
    core = sandbox.core_v1()
    nodes = case(6)
    cid = case.case_id  # type: ignore[attr-defined]
    pname = f"p-{cid}"
    objects.apply(
        "remediationpolicies", policy(pname, f"{cid}-work", [cordon_only_rule(94)], max_unhealthy=1)
    )
    run_operator()
    struck = nodes[:2]
    for n in struck:
        simulate_xid(core, n, 94)

    def held() -> str | None:
        for n in struck:
            blocked = condition(objects.incident(n), "Blocked")
            if (
                blocked
                and blocked["status"] == "True"
                and blocked["reason"] == "CircuitBreakerOpen"
            ):
                return n
        return None

    node = wait_for(held, "one incident held by the breaker", timeout=90)
    recorded = condition(objects.incident(node), "Blocked")
    assert recorded is not None
    out = kubectl_gpuheal(sandbox, "explain", node, "-o", "json")
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout)["verdicts"][-1]
    assert last["about"].startswith("incident"), out.stdout
    assert (last["decision"]["kind"], last["decision"]["reason"]) == (
        "Blocked", "CircuitBreakerOpen")  # fmt: skip
    # 1 slot of the 6 nodes the policy selects (every Node read, not only this one)
    assert last["decision"]["message"] == recorded["message"], (last, recorded)
    assert "1 of 6 selected nodes already out of service" in recorded["message"]
