"""Daemon start-up for the sandbox's control plane, on top of the generic ``_proc`` helpers."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpuheal_dev.sandbox._proc import WaitTimeout, log_tail, pid_alive, wait_for


class SandboxError(RuntimeError):
    """A sandbox component failed to start or answer; the message carries its log's tail."""


def spawn(
    argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a daemon in its own session (so the terminal's Ctrl-C does not reach it)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        return subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )


def wait_ready(
    probe: Callable[[], bool],
    what: str,
    timeout: float,
    *,
    pid: int | None = None,
    log_path: Path | None = None,
    interval: float = 0.1,
) -> None:
    """Poll ``probe`` (an exception means "not yet"); fail at once if ``pid`` died."""

    def check() -> bool:
        if pid is not None and not pid_alive(pid):
            raise SandboxError(f"{what}: process {pid} exited\n{_tail(log_path)}")
        try:
            return probe()
        except Exception:
            return False

    try:
        wait_for(check, what=what, timeout=timeout, interval=interval)
    except WaitTimeout as exc:
        raise SandboxError(f"{exc}\n{_tail(log_path)}") from exc


def _tail(log_path: Path | None) -> str:
    return log_tail(log_path) if log_path is not None else ""
