"""GPU faults for the sandbox: what a real fault does to the job on the node.

The sandbox's GPUs are ``/dev/null``; nothing happens to a job when gpuheal is told of an
XID unless a test makes it. Measured on real clusters (and in the issue that asked for this):
a GPU that falls off the bus makes the CUDA process fail at once, so the Slurm job is FAILED
before any controller reacts; a process stuck in the driver may instead hang and ignore
every signal but SIGKILL, or, in uninterruptible sleep, outlive SIGKILL too.

- :class:`FakeGpus`: one small file per node says what its GPUs do (``ok``, ``lost``,
  ``hung``, ``wedged <path>``); the demo's training job reads it at every step, like a CUDA
  call, and dies (``lost``: exit 1 with CUDA's message), hangs with every catchable signal
  blocked (``hung``: only SIGKILL ends it) or blocks in uninterruptible sleep on a
  :class:`Wedge` path (``wedged``: not even SIGKILL ends it).
- :class:`Wedge`: a FUSE file system that reads requests and never answers them. A process
  that touches a path under it sleeps in ``request_wait_answer`` (state D); a SIGKILL leaves
  it there (the kernel waits for the answer of a request the daemon has read). Closing the
  wedge aborts the connection and the process goes. Root and ``/dev/fuse`` needed.
- :func:`job_processes` / :func:`kill_job_processes`: the processes of a Slurm job on one
  node of one sandbox cluster (by their environment), for faults any job suffers (SIGKILL).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import os
import select
import signal
import struct
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from gpuheal_dev.sandbox import _proc

log = logging.getLogger("gpuheal_dev.sandbox.faults")

#: The variable that tells a job where its node's fake GPU state lives.
FAKE_GPUS_ENV = "GPUHEAL_FAKE_GPUS"


class GpuState(enum.StrEnum):
    OK = "ok"
    LOST = "lost"  # fell off the bus: the CUDA process fails at once
    HUNG = "hung"  # stuck in the driver, killable (only by SIGKILL)
    WEDGED = "wedged"  # stuck in the driver, uninterruptible (outlives SIGKILL)


class FakeGpus:
    """The state of each node's GPUs, as files under ``root`` (one per node)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        """What a job needs in its environment to see the fake GPUs."""
        return {FAKE_GPUS_ENV: str(self.root)}

    def set(self, node: str, state: GpuState, wedge: Path | None = None) -> None:
        if state is GpuState.WEDGED and wedge is None:
            raise ValueError("a wedged GPU needs a Wedge path to block on")
        text = state.value if wedge is None else f"{state.value} {wedge}"
        tmp = self.root / f".{node}.tmp"
        tmp.write_text(text + "\n")
        tmp.replace(self.root / node)

    def heal(self, node: str) -> None:
        (self.root / node).unlink(missing_ok=True)


def read_gpu_state(env: Mapping[str, str]) -> tuple[GpuState, str | None]:
    """What this node's GPUs do now (for the job side): ``(state, wedge path or None)``."""
    root, node = env.get(FAKE_GPUS_ENV), env.get("SLURMD_NODENAME")
    if not root or not node:
        return GpuState.OK, None
    try:
        text = (Path(root) / node).read_text().split()
    except OSError:
        return GpuState.OK, None
    if not text:
        return GpuState.OK, None
    try:
        state = GpuState(text[0])
    except ValueError:
        return GpuState.OK, None
    return state, (text[1] if len(text) > 1 else None)


# ---- processes of a job ----------------------------------------------------------------------


def job_processes(conf: Path, node: str, job_id: int | None = None) -> list[int]:
    """PIDs of the job processes on ``node`` of the cluster whose ``SLURM_CONF`` is ``conf``
    (of one job when ``job_id`` is given); slurmstepd itself excluded."""
    match = {"SLURM_CONF": str(conf), "SLURMD_NODENAME": node}
    if job_id is not None:
        match["SLURM_JOB_ID"] = str(job_id)
    pids = _proc.find_pids(env_match=match, env_has=("SLURM_JOB_ID",))
    return [p for p in pids if (_proc.exe_name(p) or "") not in ("slurmstepd", "slurmstepd-wlm")]


def kill_job_processes(
    conf: Path, node: str, job_id: int | None = None, sig: int = signal.SIGKILL
) -> list[int]:
    """Send ``sig`` to the job processes on ``node``; returns the PIDs signalled."""
    hit = []
    for pid in job_processes(conf, node, job_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            hit.append(pid)
    return hit


# ---- a file system that never answers ---------------------------------------------------------

_IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
_OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
_FUSE_LOOKUP, _FUSE_FORGET, _FUSE_GETATTR = 1, 2, 3
_FUSE_INIT, _FUSE_INTERRUPT, _FUSE_DESTROY, _FUSE_BATCH_FORGET = 26, 36, 38, 42
_NO_REPLY = frozenset({_FUSE_FORGET, _FUSE_BATCH_FORGET, _FUSE_INTERRUPT})
# fuse_attr of the root directory: ino 1, mode 040755, nlink 2, blksize 4096
_ROOT_ATTR = struct.pack(
    "<QQQQQQIIIIIIIIII", 1, 0, 0, 0, 0, 0, 0, 0, 0, 0o40755, 2, 0, 0, 0, 4096, 0
)


class WedgeUnavailable(RuntimeError):
    """FUSE is not usable here (not root, no /dev/fuse, mount refused)."""


class Wedge:
    """A FUSE mount at ``mountpoint`` whose lookups never return (see the module doc).

    ``with Wedge(path) as w:`` ... ``w.path("gpu0")`` is a path that blocks whoever touches it;
    leaving the block (or ``close()``) aborts the connection and frees them.
    """

    def __init__(self, mountpoint: Path) -> None:
        self.mountpoint = mountpoint
        self._fd: int | None = None
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None  # a pipe that tells the server to leave
        self.held: list[int] = []  # pids whose requests are held

    def path(self, name: str = "gpu0") -> Path:
        return self.mountpoint / name

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def open(self) -> Self:
        if os.geteuid() != 0:
            raise WedgeUnavailable("mounting FUSE needs root")
        try:
            fd = os.open("/dev/fuse", os.O_RDWR)
        except OSError as exc:
            raise WedgeUnavailable(f"/dev/fuse: {exc}") from exc
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other"
        done = subprocess.run(
            # -i: the kernel's own mount, not /sbin/mount.fuse (fuse3, which podman and
            # buildah bring), which takes the source for a program to run
            ["mount", "-i", "-t", "fuse", "-o", options, "gpuheal-wedge", str(self.mountpoint)],
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            os.close(fd)
            raise WedgeUnavailable(f"mount -t fuse: {done.stderr.strip()}")
        self._fd = fd
        self._wake = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="fuse-wedge", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Abort the connection (held requests fail, their processes go) and unmount.

        The server leaves its read first: a close() while another thread blocks in read()
        on the device does not release it (the read holds the file), so the connection,
        and the process held in D state, stayed until long after (5 s lost to the join,
        then slurmd's 10 s SIGTERM wait and a SIGKILL that could not end the process: ~20 s
        in each teardown of the wedged-job tests)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._wake is not None:
            os.write(self._wake[1], b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            os.close(fd)  # the last reference to the device: the kernel aborts the connection
        if self._wake is not None:
            for end in self._wake:
                os.close(end)
            self._wake = None

    def _reply(self, unique: int, error: int = 0, body: bytes = b"") -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._fd, _OUT_HEADER.pack(_OUT_HEADER.size + len(body), error, unique) + body)

    def _serve(self) -> None:
        fd, wake = self._fd, self._wake
        assert fd is not None
        assert wake is not None
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(wake[0], select.POLLIN)
        while True:
            ready = dict(poller.poll())
            if wake[0] in ready:
                return  # close(): leave the device so that closing it aborts the connection
            if ready.get(fd, 0) & (select.POLLERR | select.POLLHUP):
                return  # unmounted
            try:
                buf = os.read(fd, 1 << 20)
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return  # closed or unmounted
            if len(buf) < _IN_HEADER.size:
                continue
            _, opcode, unique, _, _, _, pid, _ = _IN_HEADER.unpack_from(buf)
            if opcode == _FUSE_INIT:
                _, _, readahead, _ = struct.unpack_from("<IIII", buf, _IN_HEADER.size)
                init = struct.pack("<IIIIHHIIHHI", 7, 31, readahead, 0, 16, 12, 4096, 1, 0, 0, 0)
                self._reply(unique, 0, init + b"\0" * 28)
            elif opcode == _FUSE_GETATTR:
                self._reply(unique, 0, struct.pack("<QII", 1, 0, 0) + _ROOT_ATTR)
            elif opcode == _FUSE_LOOKUP:
                self.held.append(pid)  # read and never answered: the caller sleeps in D
                log.info("wedge: holding a lookup of pid %d", pid)
            elif opcode == _FUSE_DESTROY:
                return
            elif opcode not in _NO_REPLY:
                self._reply(unique, -errno.ENOSYS)
