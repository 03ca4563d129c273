"""Helpers and fixtures for the kind-based end-to-end tests: a kind cluster, both images
built and loaded, the chart installed. Everything here needs Docker and kind; tests/conftest.py
skips the `kind` tests with a reason when they are missing.

Environment:
  GPUHEAL_KIND_CLUSTER  reuse this existing kind cluster (default: create gpuheal-e2e-<id>)
  GPUHEAL_KIND_KEEP=1   keep the cluster afterwards (to look around)
  GPUHEAL_E2E_IMAGE_TAG tag of the images built and loaded (default: e2e)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuheal"
KIND_CONFIG = Path(__file__).with_name("kind-config.yaml")
RELEASE = "gpuheal"
NAMESPACE = "gpuheal-system"


def run(*cmd: str, timeout: float = 900, input: str | None = None, **kw: Any) -> str:
    result = subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=timeout, input=input, check=False, **kw
    )
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


@dataclass
class KindCluster:
    name: str
    kubeconfig: Path
    image_tag: str

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        cmd = ["kubectl", f"--kubeconfig={self.kubeconfig}", *args]
        if check:
            return run(*cmd, input=input, timeout=300)
        return subprocess.run(
            cmd, capture_output=True, text=True, input=input, timeout=300, check=False
        ).stdout

    def apply(self, obj: dict[str, Any], namespace: str | None = None) -> None:
        ns = ["-n", namespace] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", input=json.dumps(obj))

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def nodes(self, role: str) -> list[str]:
        items = self.get("nodes", "-l", f"gpuheal.io/e2e-role={role}")["items"]
        return sorted(n["metadata"]["name"] for n in items)

    def helm(self, *args: str) -> str:
        return run("helm", *args, f"--kubeconfig={self.kubeconfig}")

    def gpuheal(self, *args: str) -> str:
        """The gpuheal CLI against this cluster (`gpuheal simulate xid ...`)."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        return run(str(Path(sys.executable).parent / "gpuheal"), *args, env=env)


def wait_for(check: Callable[[], Any], what: str, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    value: Any = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {value!r}")


@pytest.fixture(scope="session")
def kind_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindCluster]:
    for tool in ("kubectl", "helm"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not on PATH (the kind tests drive the cluster with it)")
    tmp = tmp_path_factory.mktemp("kind")
    kubeconfig = tmp / "kubeconfig"
    reuse = os.environ.get("GPUHEAL_KIND_CLUSTER")
    name = reuse or f"gpuheal-e2e-{uuid.uuid4().hex[:6]}"
    if reuse:
        kubeconfig.write_text(run("kind", "get", "kubeconfig", "--name", name))
    else:
        run(
            "kind", "create", "cluster", "--name", name, "--config", str(KIND_CONFIG),
            "--kubeconfig", str(kubeconfig), "--wait", "180s",
        )  # fmt: skip
    cluster = KindCluster(name, kubeconfig, os.environ.get("GPUHEAL_E2E_IMAGE_TAG", "e2e"))
    try:
        yield cluster
    finally:
        if not reuse and os.environ.get("GPUHEAL_KIND_KEEP") != "1":
            run("kind", "delete", "cluster", "--name", name)


@pytest.fixture(scope="session")
def images(kind_cluster: KindCluster) -> dict[str, str]:
    """Build both images from deploy/docker/ and load them into the kind nodes."""
    tag = kind_cluster.image_tag
    built = {}
    for component, dockerfile in (
        ("operator", "operator.Dockerfile"),
        ("slurm-bridge", "slurm-bridge.Dockerfile"),
    ):
        repo = "gpuheal" if component == "operator" else "gpuheal-slurm-bridge"
        image = f"{repo}:{tag}"
        run(
            "docker", "build", "-f", str(ROOT / "deploy" / "docker" / dockerfile),
            "-t", image, str(ROOT), timeout=1800,
        )  # fmt: skip
        run("kind", "load", "docker-image", image, "--name", kind_cluster.name, timeout=600)
        built[component] = image
    return built


@pytest.fixture(scope="session")
def installed(kind_cluster: KindCluster, images: dict[str, str]) -> str:
    """The chart installed with the images just built (never pulled)."""
    kind_cluster.helm(
        "upgrade", "--install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
        "--set", "operator.image.repository=gpuheal",
        "--set", f"operator.image.tag={kind_cluster.image_tag}",
        "--set", "operator.image.pullPolicy=Never",
        "--set", "operator.logFormat=plain",
        # `gpuheal simulate xid` posts what node-problem-detector posts (kernel-monitor).
        "--set", "signalTrust.trustedReporters={gpuheal-agent,kernel-monitor}",
        "--wait", "--timeout=5m",
    )  # fmt: skip
    return NAMESPACE
