"""Generic process plumbing for the sandbox: PIDs, /proc, polling with deadlines, free ports.

Nothing here knows about Slurm or Kubernetes. Everything works by PID and /proc, never by
process name, so sandboxes of several users or tests can run side by side on one machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

log = logging.getLogger("gpuheal_dev.sandbox")

T = TypeVar("T")

_PROC = Path("/proc")


class WaitTimeout(TimeoutError):
    """``wait_for`` ran out of time; the message says what it waited for and the last answer."""


def pid_alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (a zombie still answers ``kill -0``)."""
    state = proc_state(pid)
    return state is not None and state not in ("Z", "X")


def proc_state(pid: int) -> str | None:
    """The state letter in /proc/PID/stat (R, S, D, Z, ...); None when there is no such PID."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The state follows the parenthesised command name, which may itself contain ") ".
    return stat.rsplit(")", 1)[1].split()[0]


def parent_pid(pid: int) -> int | None:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def exe_name(pid: int) -> str | None:
    """Basename of /proc/PID/exe (e.g. ``slurmd-wlm`` on Debian), None if unreadable or gone."""
    try:
        return Path(os.readlink(_PROC / str(pid) / "exe")).name
    except OSError:
        return None


def proc_environ(pid: int) -> dict[str, str] | None:
    """The environment a process was started with (needs the same uid or root)."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def all_pids() -> list[int]:
    return [int(p.name) for p in _PROC.iterdir() if p.name.isdigit()]


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children first, then theirs), from one /proc scan."""
    children: dict[int, list[int]] = {}
    for p in all_pids():
        ppid = parent_pid(p)
        if ppid is not None:
            children.setdefault(ppid, []).append(p)
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def find_pids(
    *,
    exe_names: Collection[str] | None = None,
    env_match: Mapping[str, str] | None = None,
    env_has: Collection[str] = (),
    cwd: Path | None = None,
) -> list[int]:
    """Live PIDs whose exe basename is in ``exe_names`` (if given), whose environment contains
    every ``env_match`` item and every ``env_has`` key, and whose working directory is ``cwd``
    (if given). Our own process is never returned."""
    me = os.getpid()
    found: list[int] = []
    for pid in all_pids():
        if pid == me or not pid_alive(pid):
            continue
        if exe_names is not None and exe_name(pid) not in exe_names:
            continue
        if cwd is not None:
            try:
                if os.readlink(f"/proc/{pid}/cwd") != str(cwd):
                    continue
            except OSError:
                continue
        if env_match or env_has:
            env = proc_environ(pid)
            if env is None:
                continue
            if any(env.get(k) != v for k, v in (env_match or {}).items()):
                continue
            if any(k not in env for k in env_has):
                continue
        found.append(pid)
    return found


def read_pidfile(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is our child (no-op otherwise), so no zombie stays."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop_pid(
    pid: int,
    exe_names: Collection[str],
    *,
    timeout: float = 10.0,
    sig: signal.Signals = signal.SIGTERM,
) -> bool:
    """Send ``sig`` (then SIGKILL after ``timeout``) to ``pid`` if its exe is in ``exe_names``.

    Returns True if the process was running and is gone now. A PID running some other program
    (recycled after a crash or reboot) is left alone with a warning. Zombies count as gone.
    """
    if not pid_alive(pid):
        reap(pid)
        return False
    exe = exe_name(pid)
    if exe not in exe_names:
        log.warning("pid %d runs %r, not one of %s: leaving it alone", pid, exe, sorted(exe_names))
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    if _wait_gone(pid, timeout):
        return True
    log.warning("pid %d (%s) still running %.0fs after %s: SIGKILL", pid, exe, timeout, sig.name)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not _wait_gone(pid, 10.0):
        log.error("pid %d (%s) survived SIGKILL (uninterruptible sleep?)", pid, exe)
        return False
    return True


def kill_pids(pids: Iterable[int], timeout: float = 5.0) -> list[int]:
    """SIGKILL every PID at once (no exe check: callers select PIDs precisely) and wait until
    they are gone. Returns the PIDs still alive after ``timeout``."""
    pids = [p for p in pids if pid_alive(p)]
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while True:
        for p in pids:
            reap(p)
        left = [p for p in pids if pid_alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        reap(pid)
        if not pid_alive(pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def wait_for(
    check: Callable[[], T | None],
    *,
    what: str,
    timeout: float,
    interval: float = 0.05,
) -> T:
    """Call ``check`` until it returns something truthy, and return that.

    ``check`` may raise to abort (e.g. "the daemon died"); it should not raise for "not yet".
    Raises ``WaitTimeout`` naming ``what`` and the last value seen.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    tail = text.splitlines()[-lines:]
    return f"--- last {len(tail)} lines of {path} ---\n" + "\n".join(tail)


# Ports handed out by this process recently: two callers in one process never get the same one.
_handed_out: set[int] = set()


def free_tcp_ports(count: int, *, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that are free right now on ``host`` and on all addresses.

    Ports are drawn at random below the kernel's ephemeral range (so outgoing connections do not
    grab them between now and the daemon's bind), never repeated within this process. Another
    process can still take one before the daemon binds it: callers should retry on EADDRINUSE.
    """
    low, high = 20000, _ephemeral_low() - 1
    if high - low < 1000:  # unusual ip_local_port_range: let the kernel choose
        return _kernel_ports(count, host)
    ports: list[int] = []
    for _ in range(count * 50):
        if len(ports) == count:
            break
        port = random.randint(low, high)  # noqa: S311 - not cryptographic
        if port in _handed_out or port in ports or not port_free(port, host):
            continue
        ports.append(port)
    if len(ports) < count:
        raise RuntimeError(f"could not find {count} free TCP ports in {low}-{high}")
    _handed_out.update(ports)
    return ports


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``port`` and it can be bound on ``host`` and 0.0.0.0."""
    for addr in {host, "0.0.0.0"}:  # noqa: S104 - probing only; daemons may bind the wildcard
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr, port))
            except OSError:
                return False
    return True


def _kernel_ports(count: int, host: str) -> list[int]:
    socks: list[socket.socket] = []
    try:
        while len(socks) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
