"""The chart's gpu-reset Job, step by step, without a GPU: files/gpu-reset.sh with a fake
`nvidia-smi` and `fuser` on PATH (each call logged) and a fake /proc/driver/nvidia/gpus, and
files/gpu_operands.py against a small fake API server (a Node and its pods; a merge patch as
the API server applies it).

What this cannot show: that NVIDIA's driver resets a real GPU (one alone, or all together),
that fuser in the Job's container finds the node's processes holding a GPU's device node, or
that the GPU operator's DaemonSets leave a node labelled nvidia.com/gpu.deploy.<operand>=false
(its documented behaviour); they need a GPU node with the GPU operator.
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
    if [ -n "${FAKE_AFTER:-}" ]; then printf '%s' "$FAKE_AFTER"; exit 0; fi
    printf '0, 00000000:3B:00.0, GPU-a\\n'
    [ -n "${FAKE_LOST_ONE:-}" ] || printf '1, 00000000:5E:00.0, GPU-b\\n' ;;
  "-r -i ${FAKE_FAIL_BUS:-none}") exit 1 ;;
esac
exit 0
"""
# FAKE_HOLDER holds every file; FAKE_OPEN ("/dev/nvidia1=4242 /dev/nvidiactl=4242") the files
# it names, found as fuser finds them: by name, or by a glob that the shell left as it is.
FAKE_FUSER = """#!/bin/bash
echo "fuser $*" >> "$FAKE_LOG"
pids=""
for arg in "$@"; do
  [ -z "${FAKE_HOLDER:-}" ] || pids="$pids $FAKE_HOLDER"
  for open in ${FAKE_OPEN:-}; do
    [[ ${open%%=*} == $arg ]] && pids="$pids ${open#*=}"
  done
done
[ -n "$pids" ] || exit 1
echo "/dev/nvidia0:" >&2
echo "$pids"
"""
# The driver's /proc/driver/nvidia/gpus: each GPU's device minor (/dev/nvidia<minor>).
DRIVER = {"0000:3b:00.0": 0, "0000:5e:00.0": 1}


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
    for address, minor in DRIVER.items():
        (tmp_path / "driver" / address).mkdir(parents=True, exist_ok=True)
        (tmp_path / "driver" / address / "information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nDevice Minor: \t {minor}\n"
        )
    proc = subprocess.run(
        ["/bin/bash", str(RESET)],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": str(log),
             "GPUHEAL_STATE_DIR": str(state), "GPUHEAL_INCIDENT": "nrem-1",
             "GPUHEAL_DRIVER_GPUS": str(tmp_path / "driver"), "NODE_NAME": "gpu-1", **env},
    )  # fmt: skip
    calls = log.read_text().splitlines() if log.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, calls


A, B = "00000000:3B:00.0", "00000000:5E:00.0"


def test_reset_follows_nvidias_procedure(tmp_path: Path) -> None:
    code, out, calls = run_reset(tmp_path)
    assert code == 0, out
    assert calls == [
        "nvidia-smi --query-gpu=pci.bus_id,persistence_mode --format=csv,noheader",
        "nvidia-smi --query-compute-apps=pid,process_name,gpu_bus_id --format=csv,noheader",
        "fuser /dev/nvidia*",  # no GPU here: the glob stays as it is
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


# ---- one GPU named (GPUHEAL_GPU: the GPU a quarantineDevice step holds out) ----------------
# A job on the other GPU (5E, /dev/nvidia1): as every CUDA process, it holds /dev/nvidiactl
# and /dev/nvidia-uvm too.
OTHER_JOB = {
    "FAKE_APPS": f"4242, python, {B}\n",
    "FAKE_OPEN": "/dev/nvidia1=4242 /dev/nvidiactl=4242 /dev/nvidia-uvm=4242",
}


def resets(calls: list[str]) -> list[str]:
    return [c for c in calls if " -r" in c]


def test_the_named_gpu_is_reset_alone_while_the_other_runs_its_job(tmp_path: Path) -> None:
    code, out, calls = run_reset(tmp_path, GPUHEAL_GPU="0000:3b:00", **OTHER_JOB)
    assert code == 0, out
    assert calls == [
        "nvidia-smi --query-gpu=pci.bus_id,persistence_mode --format=csv,noheader",
        "nvidia-smi --query-compute-apps=pid,process_name,gpu_bus_id --format=csv,noheader",
        "fuser /dev/nvidia0",  # its own device node, not /dev/nvidiactl or /dev/nvidia-uvm
        f"nvidia-smi -i {A} -pm 0",  # persistence mode on that GPU only
        f"nvidia-smi -r -i {A}",
        "nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader",
        f"nvidia-smi -i {A} -pm 1",
    ]
    assert "reset 1 GPU(s)" in out


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"FAKE_APPS": f"4242, python, {A}\n"}, f"compute applications still run on GPU {A}"),
        (
            {"FAKE_OPEN": "/dev/nvidia0=4243 /dev/nvidiactl=4243"},
            "processes hold /dev/nvidia0: 4243",
        ),
    ],
)
def test_a_process_on_the_named_gpu_stops_its_reset(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    code, out, calls = run_reset(tmp_path, GPUHEAL_GPU="0000:3b:00", **env)
    assert (code, says in out) == (4, True), out
    assert not [c for c in calls if " -r" in c or " -pm " in c], calls


@pytest.mark.parametrize(
    ("gpu", "says"),
    [
        ("0000:af:00", "GPU 0000:af:00 is not on this node (nvidia-smi lists"),
        ("0001:3b:00", "GPU 0001:3b:00 is not on this node"),  # another PCI domain
        ("0000:3b:00.1", "GPU 0000:3b:00.1 is not on this node"),  # another function
        ("gpu-3", "GPUHEAL_GPU=gpu-3 is not a PCI address"),
    ],
)
def test_a_gpu_not_on_the_node_is_not_reset(tmp_path: Path, gpu: str, says: str) -> None:
    code, out, calls = run_reset(tmp_path, GPUHEAL_GPU=gpu)
    assert (code, says in out) == (9, True), out
    assert not [c for c in calls if " -r" in c or " -pm " in c], calls


@pytest.mark.parametrize(
    "gpu",
    ["0000:5e:00", "0000:5e:00.0", "00000000:5E:00.0", "5e:00", "PCI:0000:5E:00.0", " 0000:5e:00 "],
)
def test_the_named_gpu_is_found_whatever_the_form_of_its_address(tmp_path: Path, gpu: str) -> None:
    code, out, calls = run_reset(tmp_path, GPUHEAL_GPU=gpu)
    assert code == 0, out
    assert resets(calls) == [f"nvidia-smi -r -i {B}"]  # nvidia-smi's own form
    assert "fuser /dev/nvidia1" in calls
    assert not [c for c in calls if " -pm " in c]  # persistence was off on 5E


def test_scope_all_resets_every_gpu_even_when_one_is_named(tmp_path: Path) -> None:
    """NVSwitch/NVLink systems reset their GPUs together: the scope wins, and says so."""
    code, out, calls = run_reset(tmp_path, GPU_RESET_SCOPE="all", GPUHEAL_GPU="0000:3b:00")
    assert code == 0, out
    assert resets(calls) == ["nvidia-smi -r"]
    assert f"GPU {A} named, but GPU_RESET_SCOPE=all" in out
    assert "fuser /dev/nvidia*" in calls  # every GPU must be free
    # So a job on the other GPU stops it, and a GPU not on the node is still refused.
    code, out, calls = run_reset(
        tmp_path / "busy", GPU_RESET_SCOPE="all", GPUHEAL_GPU="0000:3b:00", **OTHER_JOB
    )
    assert (code, "compute applications still run on the GPUs" in out) == (4, True), out
    assert resets(calls) == []
    code, out, _ = run_reset(tmp_path / "gone", GPU_RESET_SCOPE="all", GPUHEAL_GPU="0000:af:00")
    assert (code, "GPU 0000:af:00 is not on this node" in out) == (9, True), out


def test_no_reset_when_the_driver_names_no_device_minor(tmp_path: Path) -> None:
    """Without /dev/nvidia<minor> nobody can tell which process holds the GPU."""
    code, out, calls = run_reset(
        tmp_path, GPUHEAL_GPU="0000:3b:00", GPUHEAL_DRIVER_GPUS=str(tmp_path / "none")
    )
    assert (code, "the driver names no device minor for GPU" in out) == (10, True), out
    assert resets(calls) == []


def test_the_named_gpu_missing_after_its_reset_fails_the_job(tmp_path: Path) -> None:
    after = f"0, {A}, GPU-a\n1, 00000000:AF:00.0, GPU-c\n"  # as many GPUs, not 5E
    code, out, _ = run_reset(tmp_path, GPUHEAL_GPU="0000:5e:00", FAKE_AFTER=after)
    assert (code, "GPU 0000:5e:00 is not listed after the reset" in out) == (8, True), out


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
