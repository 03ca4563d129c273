"""Shared pytest setup: fixture plugins per subsystem, and the `kind` marker's skip rule."""

from __future__ import annotations

import shutil
import subprocess

import pytest

pytest_plugins = ["tests.fixtures.k8s", "tests.fixtures.slurm"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = [tool for tool in ("docker", "kind") if shutil.which(tool) is None]
    docker_dead = not missing and not _docker_engine_answers()
    if not missing and not docker_dead:
        return
    # kind's podman provider was tried on these machines: a node image made here comes up, but
    # the tests also need images only a registry has (README, Known gaps).
    podman = "kind's podman provider lacks kindest/node and CoreDNS without a registry"
    why = (
        f"kind tests need Docker and kind (not on PATH: {', '.join(missing)}); {podman}"
        if missing
        else f"kind tests need a running Docker engine (`docker info` failed); {podman}"
    )
    for item in items:
        if "kind" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=why))


def _docker_engine_answers() -> bool:
    try:
        probe = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0
