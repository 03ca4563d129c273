"""Run the real bridge (`gpuheal-slurm-bridge`, as a process) in front of a sandbox Slurm
cluster: on any address, with TLS or not, with its own token file (rotate it, SIGHUP it)."""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from gpuheal_dev.sandbox.pki import CertPaths, create_pki, issue_server_cert
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.operator_harness import REPO, free_port, wait_for


def host_address() -> str | None:
    """An address of this machine that is not loopback (None: there is none)."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout
    return next((a for a in out.split() if ":" not in a and not a.startswith("127.")), None)


@dataclass
class BridgeProcess:
    proc: subprocess.Popen[bytes]
    url: str  # as the operator calls it
    port: int
    token_file: Path  # the bridge's tokens ("name:token" lines)
    operator_token: Path  # the bare token, as the operator's --bridge-token-file reads it
    log: Path
    ca: Path | None = None
    argv: list[str] = field(default_factory=list)

    def read_log(self) -> str:
        return self.log.read_text(errors="replace")

    def sighup(self) -> None:
        self.proc.send_signal(signal.SIGHUP)

    def metrics(self) -> str:
        return self.get("/metrics")

    def get(self, path: str) -> str:
        ctx = ssl.create_default_context(cafile=str(self.ca)) if self.ca else None
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10, context=ctx) as resp:
            return str(resp.read().decode())

    def gauge(self, name: str) -> float | None:
        for line in self.metrics().splitlines():
            if line.startswith(f"{name} ") or line.startswith(f"{name}{{"):
                return float(line.rpartition(" ")[2])
        return None


@dataclass
class Tls:
    ca: Path
    server: CertPaths


def make_tls(directory: Path, *names: str) -> Tls:
    """A CA and a bridge serving certificate for ``names`` (addresses or DNS names)."""
    pki = create_pki(directory)
    return Tls(pki.ca.cert, issue_server_cert(pki, "bridge", names))


def start_bridge(
    cluster: SlurmCluster,
    workdir: Path,
    *extra: str,
    token: str,
    tokens: str | None = None,
    name: str = "bridge",
    host: str = "127.0.0.1",
    port: int | None = None,
    tls: Tls | None = None,
    wait_ready: bool = True,
    path: str | None = None,
) -> BridgeProcess:
    """The bridge process in front of ``cluster``, its files in ``workdir`` (named after
    ``name``: a restart on the same ``port`` keeps its idempotency store), ready
    (``/readyz`` says ready) unless ``wait_ready`` is False. The caller stops it. Its token
    file holds ``operator:<token>``, or ``tokens`` (lines of its own) when given. ``path``:
    the bridge's PATH, and no ``--slurm-bin-dir`` (a bridge without Slurm's clients)."""
    port = port or free_port()
    token_lines = tokens if tokens is not None else f"operator:{token}\n"
    tokens_file = workdir / f"{name}-tokens"
    tokens_file.write_text(token_lines)
    operator_token = workdir / f"{name}-operator-token"
    operator_token.write_text(token)
    state = workdir / f"{name}-state"
    state.mkdir(exist_ok=True)
    log = workdir / f"{name}.log"
    argv = [
        "--listen", f"{host}:{port}", "--token-file", str(tokens_file),
        "--slurm-conf", str(cluster.conf_path), "--state-dir", str(state),
        "--expedite-timeout", "15", "--log-level", "warning",
    ]  # fmt: skip
    # that Slurm's own clients (26.05: wrappers into its root), unless the bridge goes without
    if cluster.bin_dir is not None and path is None:
        argv += ["--slurm-bin-dir", str(cluster.bin_dir)]
    if tls is not None:
        argv += ["--tls-cert", str(tls.server.cert), "--tls-key", str(tls.server.key)]
    argv += list(extra)
    env = {
        **cluster.subprocess_env(dict(os.environ)),
        "PYTHONPATH": f"{REPO / 'operator'}:{REPO / 'slurm-bridge'}",
    }
    if path is not None:
        env["PATH"] = path
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from gpuheal_bridge.cli import main; sys.exit(main())", *argv],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    scheme = "https" if tls else "http"
    shown = "127.0.0.1" if host in ("0.0.0.0", "127.0.0.1") else host
    bridge = BridgeProcess(
        proc,
        f"{scheme}://{shown}:{port}",
        port,
        tokens_file,
        operator_token,
        log,
        tls.ca if tls else None,
        argv,
    )
    if wait_ready:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"bridge exited {proc.returncode}: {bridge.read_log()}")
            try:
                return '"ready":true' in bridge.get("/readyz")
            except (OSError, urllib.error.URLError):
                return False

        try:
            # Polled often: a local request, and each of the suite's many bridge starts
            # waits half a poll on average.
            wait_for(ready, f"bridge {name} ready", timeout=60, every=0.05)
        except AssertionError as exc:
            stop(proc)  # the caller never got it: left running, it outlived the test (seen)
            raise AssertionError(f"{exc}\n{bridge.read_log()[-3000:]}") from None
    return bridge


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def exited(bridge: BridgeProcess, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = bridge.proc.poll()
        if code is not None:
            return code
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        bridge.proc.kill()
    raise AssertionError(f"bridge still running after {timeout}s: {bridge.read_log()[-2000:]}")
