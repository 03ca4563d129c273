"""The wrappers that join a held namespace of a Slurm root (gpuheal_dev.sandbox.slurmclients):
what each runs, without a root (the real one: tests/integration/test_slurm_clients.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuheal_dev.sandbox import slurmclients
from gpuheal_dev.sandbox.slurmroot import CLIENTS, SlurmRoot


def fake_root(tmp_path: Path) -> SlurmRoot:
    root = SlurmRoot(tmp_path / "slurm-26.05.5-1_munge-0.5.18-1")
    for tool in CLIENTS:
        d = root.tree / ("usr/sbin" if tool == "slurmctld" else "usr/bin")
        d.mkdir(parents=True, exist_ok=True)
        (d / tool).write_text("")
    root.bin_dir.mkdir(parents=True)
    for tool in CLIENTS:  # the root's own wrappers: here, say who was called
        wrapper = root.bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\necho "fallback {tool} $*"\n')
        wrapper.chmod(0o755)
    return root


def test_each_client_joins_the_held_namespace_with_its_path_in_the_root(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    out = slurmclients.write_wrappers(root, tmp_path / "clients", 4321)
    assert sorted(p.name for p in out.iterdir()) == sorted(CLIENTS)
    text = (out / "scontrol").read_text()
    assert 'exec nsenter --mount=/proc/4321/ns/mnt --wd=. -- /usr/bin/scontrol "$@"' in text


def test_a_client_whose_holder_is_gone_takes_the_roots_own_way_in(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    dead = subprocess.Popen(["true"])  # a PID nothing holds any more
    dead.wait()
    out = slurmclients.write_wrappers(root, tmp_path / "clients", dead.pid)
    done = subprocess.run(
        [out / "squeue", "-h", "-j", "7"], capture_output=True, text=True, check=True
    )
    assert done.stdout == "fallback squeue -h -j 7\n"


def test_a_client_missing_from_the_root_is_named(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    (root.tree / "usr/bin/sdiag").unlink()
    with pytest.raises(FileNotFoundError, match="sdiag"):
        slurmclients.write_wrappers(root, tmp_path / "clients", 1)
