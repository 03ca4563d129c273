"""Slurm 26.05's clients joining one held namespace of its root
(gpuheal_dev.sandbox.slurmclients), as the benchmarks' bridge runs them: the root's own
binaries answer, the holder goes with the block, and a client left behind refuses to run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuheal_dev.sandbox.slurmclients import joined_clients
from gpuheal_dev.sandbox.slurmroot import ensure_root

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def holders(root_path: Path) -> set[int]:
    """Our namespace holders: `tail --pid=<this process>` in the root's namespace."""
    found = set()
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"tail", f"--pid={os.getpid()}".encode()]:
            found.add(int(d.name))
    return found


def test_joined_clients_are_the_roots_and_end_with_the_block(tmp_path: Path) -> None:
    root = ensure_root("26.05")
    munge = root.manifest["versions"]["munge"].split("-")[0]  # type: ignore[index]
    host = subprocess.run(["munge", "--version"], capture_output=True, text=True, check=False)
    assert munge not in host.stdout + host.stderr, "the host's munge would not tell them apart"
    before = holders(root.path)
    with joined_clients(root, tmp_path / "clients") as bin_dir:
        (held,) = holders(root.path) - before
        ns = os.readlink(f"/proc/{held}/ns/mnt")
        assert ns != os.readlink("/proc/self/ns/mnt")
        for _ in range(2):  # each call joins the same namespace, none builds its own
            done = subprocess.run(
                [bin_dir / "munge", "--version"], capture_output=True, text=True, check=True
            )
            assert munge in done.stdout + done.stderr
            assert os.readlink(f"/proc/{held}/ns/mnt") == ns
    assert holders(root.path) == before
    assert not (tmp_path / "clients" / "munge").exists()
