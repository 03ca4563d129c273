"""The chart's gpu-reset Job, step by step, without a GPU: files/gpu-reset.sh with a fake
`nvidia-smi` and `fuser` on PATH (each call logged), and files/gpu_operands.py against a
small fake API server (a Node and its pods; a merge patch as the API server applies it).

What this cannot show: that NVIDIA's driver resets a real GPU, or that the GPU operator's
DaemonSets leave a node labelled nvidia.com/gpu.deploy.<operand>=false (its documented
behaviour); both need a GPU node with the GPU operator.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

FILES = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpuheal" / "files"
RESET = FILES / "gpu-reset.sh"
OPERANDS = FILES / "gpu_operands.py"

FAKE_SMI = """#!/bin/bash
echo "nvidia-smi $*" >> "$FAKE_LOG"
case "$*" in
  *--query-compute-apps*) printf '%s' "${FAKE_APPS:-}" ;;
  *--query-gpu=pci.bus_id,persistence_mode*)
    printf '00000000:3B:00.0, Enabled\\n00000000:5E:00.0, Disabled\\n' ;;
  *--query-gpu=index,pci.bus_id,uuid*)
    printf '0, 00000000:3B:00.0, GPU-a\\n'
    [ -n "${FAKE_LOST_ONE:-}" ] || printf '1, 00000000:5E:00.0, GPU-b\\n' ;;
  "-r -i ${FAKE_FAIL_BUS:-none}") exit 1 ;;
esac
exit 0
"""
FAKE_FUSER = """#!/bin/bash
echo "fuser $*" >> "$FAKE_LOG"
[ -n "${FAKE_HOLDER:-}" ] || exit 1
echo "/dev/nvidia0:" >&2
echo " $FAKE_HOLDER"
"""


def run_reset(tmp_path: Path, *, stopped: bool = True, **env: str) -> tuple[int, str, list[str]]:
    """Run gpu-reset.sh; (exit code, output, the fake tools' calls in order)."""
    bin_dir, state, log = tmp_path / "bin", tmp_path / "state", tmp_path / "calls.log"
    bin_dir.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    for name, text in (("nvidia-smi", FAKE_SMI), ("fuser", FAKE_FUSER)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    if stopped:
        (state / "operands-stopped").write_text("GPU operands off the node\n")
    proc = subprocess.run(
        ["/bin/bash", str(RESET)],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": str(log),
             "GPUHEAL_STATE_DIR": str(state), "GPUHEAL_INCIDENT": "nrem-1",
             "NODE_NAME": "gpu-1", **env},
    )  # fmt: skip
    calls = log.read_text().splitlines() if log.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, calls


A, B = "00000000:3B:00.0", "00000000:5E:00.0"


def test_reset_follows_nvidias_procedure(tmp_path: Path) -> None:
    code, out, calls = run_reset(tmp_path)
    assert code == 0, out
    assert calls == [
        "nvidia-smi --query-compute-apps=pid,process_name,gpu_bus_id --format=csv,noheader",
        "fuser /dev/nvidia*",  # no GPU here: the glob stays as it is
        "nvidia-smi --query-gpu=pci.bus_id,persistence_mode --format=csv,noheader",
        f"nvidia-smi -i {A} -pm 0",  # only the GPU that had persistence mode on
        f"nvidia-smi -r -i {A}",
        f"nvidia-smi -r -i {B}",
        "nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader",
        f"nvidia-smi -i {A} -pm 1",  # back on where it was
    ]
    assert "reset 2 GPU(s)" in out


def test_all_gpus_together_where_the_system_needs_it(tmp_path: Path) -> None:
    code, out, calls = run_reset(tmp_path, GPU_RESET_SCOPE="all")
    assert code == 0, out
    assert [c for c in calls if " -r" in c] == ["nvidia-smi -r"]


@pytest.mark.parametrize(
    ("env", "code", "says"),
    [
        ({"FAKE_APPS": "4242, python, 00000000:3B:00.0\n"}, 4, "compute applications still run"),
        ({"FAKE_HOLDER": "4243"}, 4, "processes hold /dev/nvidia*: 4243"),
    ],
)
def test_no_reset_while_anything_holds_a_gpu(
    tmp_path: Path, env: dict[str, str], code: int, says: str
) -> None:
    got, out, calls = run_reset(tmp_path, **env)
    assert (got, says in out) == (code, True), out
    assert not [c for c in calls if " -r" in c or " -pm " in c], calls


def test_no_reset_until_the_operands_left(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "operands-failed").write_text("GPU operands not stopped: 403\n")
    code, out, calls = run_reset(tmp_path, stopped=False)
    assert code == 3
    assert "not reset: GPU operands not stopped: 403" in out
    assert calls == []
    code, out, calls = run_reset(
        tmp_path / "late", stopped=False, GPUHEAL_OPERANDS_WAIT_SECONDS="1"
    )
    assert code == 3
    assert "not off the node within 1s" in out
    assert calls == []


def test_a_failed_reset_fails_the_job_and_restores_persistence(tmp_path: Path) -> None:
    code, out, calls = run_reset(tmp_path, FAKE_FAIL_BUS=B)
    assert code == 7
    assert f"GPU reset of {B} failed" in out
    assert calls[-1] == f"nvidia-smi -i {A} -pm 1"


def test_a_gpu_missing_after_the_reset_fails_the_job(tmp_path: Path) -> None:
    code, out, _ = run_reset(tmp_path, FAKE_LOST_ONE="1")
    assert code == 8
    assert "only 1 of 2 GPUs after the reset" in out


# ---- the operands sidecar -------------------------------------------------------------------
def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict):
            _merge(into.setdefault(key, {}), value)
        else:
            into[key] = value


class FakeApi:
    """A Node and the pods on it. An operand pod leaves once its deploy label is false,
    as the GPU operator's DaemonSet controller does it."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.node: dict[str, Any] = {"metadata": {"name": "gpu-1", "labels": dict(labels)}}
        self.pods = {
            "nvidia-device-plugin-daemonset": "nvidia.com/gpu.deploy.device-plugin",
            "nvidia-dcgm-exporter": "nvidia.com/gpu.deploy.dcgm-exporter",
        }
        self.patches: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.fail_next = 0  # answer that many requests 503 (an API server restarting)

    def pods_on_node(self, selector: str) -> list[dict[str, Any]]:
        key, _, value = selector.partition("=")
        labels = self.node["metadata"]["labels"]
        return [
            {"metadata": {"namespace": "gpu-operator", "name": f"{app}-x"}}
            for app, gate in self.pods.items()
            if key == "app" and value == app and labels.get(gate) != "false"
        ]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[str, FakeApi]]:
    fake = FakeApi({"nvidia.com/gpu.deploy.device-plugin": "true",
                    "nvidia.com/gpu.deploy.dcgm-exporter": "true", "other": "x"})  # fmt: skip

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            assert self.headers["Authorization"] == "Bearer t0ken"
            url = urllib.parse.urlparse(self.path)
            with fake.lock:
                if fake.fail_next:
                    fake.fail_next -= 1
                    self.send_error(503)
                    return
                if url.path == "/api/v1/nodes/gpu-1":
                    self._send(fake.node)
                    return
                query = urllib.parse.parse_qs(url.query)
                assert query["fieldSelector"] == ["spec.nodeName=gpu-1"]
                self._send({"items": fake.pods_on_node(query["labelSelector"][0])})

        def do_PATCH(self) -> None:
            assert self.headers["Content-Type"] == "application/merge-patch+json"
            patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with fake.lock:
                fake.patches.append(patch)
                _merge(fake.node, patch)
                self._send(fake.node)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    (tmp_path / "token").write_text("t0ken\n")
    yield f"http://127.0.0.1:{server.server_address[1]}", fake
    server.shutdown()


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    return {
        "NODE_NAME": "gpu-1",
        "GPUHEAL_INCIDENT": "nrem-1",
        "GPU_OPERANDS": "device-plugin,dcgm-exporter",
        "GPU_OPERAND_PODS": "app=nvidia-device-plugin-daemonset;app=nvidia-dcgm-exporter",
        "GPUHEAL_OPERANDS_WAIT_SECONDS": "10",
        "GPUHEAL_KUBE_API": url,
        "GPUHEAL_KUBE_TOKEN_FILE": str(tmp_path / "token"),
        "GPUHEAL_STATE_DIR": str(tmp_path),
    }


def _module(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> ModuleType:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = importlib.util.spec_from_file_location("gpu_operands", OPERANDS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BEFORE = {
    "nvidia.com/gpu.deploy.device-plugin": "true",
    "nvidia.com/gpu.deploy.dcgm-exporter": "true",
    "gpuheal.io/gpu-reset": None,
}


def test_operands_leave_and_come_back_as_they_were(
    tmp_path: Path, api: tuple[str, FakeApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, fake = api
    ops = _module(monkeypatch, _env(tmp_path, url))
    assert ops.main(["gpu_operands.py", "stop"]) == 0
    labels = fake.node["metadata"]["labels"]
    assert labels == {"nvidia.com/gpu.deploy.device-plugin": "false",
                      "nvidia.com/gpu.deploy.dcgm-exporter": "false",
                      "gpuheal.io/gpu-reset": "nrem-1", "other": "x"}  # fmt: skip
    before = fake.node["metadata"]["annotations"]["gpuheal.io/gpu-reset-labels-before"]
    assert json.loads(before) == BEFORE
    assert (tmp_path / "operands-stopped").exists()
    # Run again (a Job retried after a crash): the labels from before the first run stay.
    assert ops.main(["gpu_operands.py", "stop"]) == 0
    assert "annotations" not in fake.patches[-1]["metadata"]
    assert ops.main(["gpu_operands.py", "restore"]) == 0
    assert fake.node["metadata"]["labels"] == {
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.dcgm-exporter": "true",
        "other": "x",
    }
    assert fake.node["metadata"]["annotations"] == {}
    assert ops.main(["gpu_operands.py", "restore"]) == 0  # nothing left to restore


def test_operands_that_do_not_leave_fail_the_reset_and_are_restored(
    tmp_path: Path, api: tuple[str, FakeApi]
) -> None:
    """The sidecar as the Job runs it: `hold` says it failed (the reset container then exits
    without resetting) and restores the labels on SIGTERM, trying again when the API server
    does not answer."""
    url, fake = api
    fake.pods["nvidia-dcgm-exporter"] = "a-label-nobody-sets"  # a pod that never goes
    env = {**os.environ, **_env(tmp_path, url), "GPUHEAL_OPERANDS_WAIT_SECONDS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(OPERANDS), "hold"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    failed = tmp_path / "operands-failed"
    deadline = time.monotonic() + 20
    while not failed.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "gpu-operator/nvidia-dcgm-exporter-x" in failed.read_text()
    assert not (tmp_path / "operands-stopped").exists()
    fake.fail_next = 1  # the first restore fails: it is tried again
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert "labels not restored yet" in out
    assert fake.node["metadata"]["labels"]["nvidia.com/gpu.deploy.dcgm-exporter"] == "true"
    assert "gpuheal.io/gpu-reset" not in fake.node["metadata"]["labels"]
