"""Slurm accounting for a sandbox cluster: MariaDB and slurmdbd on loopback, so that users,
accounts and ``AdminLevel`` exist (what the bridge's service user needs: ``AdminLevel=Operator``
instead of running as SlurmUser).

    dbd = SlurmDbd(root, port=free_port)
    cluster = SlurmCluster(root2, nodes, dbd_port=dbd.port)   # its slurm.conf names the dbd
    dbd.start(cluster)          # first: slurmctld refuses to start on a database it cannot reach
    dbd.sacctmgr("add", "user", "svc", "account=ops", "adminlevel=Operator")
    cluster.start()             # slurmctld reads users and their AdminLevel as it starts

Set users up before the cluster starts: Debian's slurmctld 22.05.8 was seen to crash
(SIGSEGV in an RPC thread, about one time in two here) on the update slurmdbd pushes to it
when a user changes while it runs.

slurmctld accepts a slurmdbd of its own release or newer: a cluster of a release in a root of
its own (26.05, `gpuheal_dev.sandbox.slurmroot`) gets munged, slurmdbd and sacctmgr from that
root; MariaDB is the host's either way.

MariaDB runs from an empty data directory with ``--skip-grant-tables`` (Debian's
``mariadb-server-core`` alone, no system tables: slurmdbd creates its own database), on a
free port of 127.0.0.1; slurmdbd connects as root without a password, and authenticates with
its own munged over the cluster's key (the cluster's munged starts later, with the cluster).
All three are stopped by PID.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from gpuheal_dev.sandbox import _proc
from gpuheal_dev.sandbox.slurm import (
    SlurmCluster,
    SlurmConfig,
    SlurmSandboxError,
    short_hostname,
)
from gpuheal_dev.sandbox.slurmroot import SlurmRoot

log = logging.getLogger("gpuheal_dev.sandbox")

CLUSTER_NAME = SlurmConfig.cluster_name  # the sandbox clusters' ClusterName
PACKAGES = ("mariadb-server-core", "slurmdbd", "slurm-wlm-mysql-plugin")
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")


def _sbin(name: str) -> str | None:
    return shutil.which(name) or next(
        (f"{d}/{name}" for d in _SBIN if os.access(f"{d}/{name}", os.X_OK)), None
    )


def missing(*, own_root: bool = False) -> list[str]:
    """The programs accounting needs that are not installed (``hack/install-system-deps.sh``
    installs them: ``PACKAGES``). ``own_root``: for a release in a root of its own, which
    carries its slurmdbd and sacctmgr: MariaDB alone is the host's."""
    wanted = ("mariadbd",) if own_root else ("mariadbd", "slurmdbd", "sacctmgr")
    return [n for n in wanted if _sbin(n) is None]


class SlurmDbd:
    def __init__(self, root: Path, *, port: int, db_port: int | None = None) -> None:
        self.root = Path(root).absolute()
        self.port = port
        self.db_port = db_port or _proc.free_tcp_ports(1)[0]
        self._popens: dict[str, subprocess.Popen[bytes]] = {}
        self.cluster: SlurmCluster | None = None
        #: the cluster's release's root, None for the host's packages (set by ``start``)
        self.slurm_root: SlurmRoot | None = None

    def _argv(self, daemon: str, *args: str) -> list[str]:
        """A Slurm or munge daemon of the cluster's release."""
        if self.slurm_root is not None:
            return self.slurm_root.enter_argv(f"/usr/sbin/{daemon}", *args)
        return [str(_sbin(daemon)), *args]

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    def start(self, cluster: SlurmCluster, timeout: float = 60.0) -> SlurmDbd:
        """munged (the cluster's key), MariaDB, slurmdbd: before the cluster starts."""
        self.slurm_root = cluster.prepare_root()
        if lacking := missing(own_root=self.slurm_root is not None):
            raise SlurmSandboxError(f"accounting needs {', '.join(lacking)}: {PACKAGES}")
        self.cluster = cluster
        data, logs, munge = self.root / "mariadb", self.root / "log", self.root / "munge"
        for d in (data, logs, munge, self.etc, cluster.layout.munge):
            d.mkdir(parents=True, exist_ok=True)
        munge.chmod(0o711)
        key = cluster.layout.munge_key  # the cluster keeps a key it finds (>= 32 bytes)
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        socket = munge / "munge.sock"
        self._spawn(
            "munged",
            self._argv(
                "munged", "--foreground", "--force", f"--socket={socket}",
                f"--key-file={key}", f"--log-file={logs / 'munged.log'}",
                f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}",
            ),
        )  # fmt: skip
        _proc.wait_for(socket.exists, what="munged's socket", timeout=timeout)
        self._spawn(
            "mariadbd",
            [
                str(_sbin("mariadbd")), "--no-defaults", f"--datadir={data}",
                f"--socket={self.root / 'mariadb.sock'}", f"--port={self.db_port}",
                "--bind-address=127.0.0.1", "--user=root", "--skip-grant-tables",
                f"--pid-file={self.root / 'mariadb.pid'}", f"--log-error={logs / 'mariadb.log'}",
            ],
        )  # fmt: skip
        _proc.wait_for(
            lambda: not _proc.port_free(self.db_port), what="MariaDB to listen", timeout=timeout
        )
        conf = self.etc / "slurmdbd.conf"
        conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={socket}",
                    f"DbdHost={short_hostname()}",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={self.port}",
                    "SlurmUser=root",
                    "DebugLevel=info",
                    f"LogFile={logs / 'slurmdbd.log'}",
                    f"PidFile={self.root / 'slurmdbd.pid'}",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.db_port}",
                    "StorageUser=root",
                    "StorageLoc=slurm_acct_db",
                ]
            )
            + "\n"
        )
        conf.chmod(0o600)  # slurmdbd refuses a readable one
        client = self.root / "client"
        client.mkdir(exist_ok=True)
        (client / "slurm.conf").write_text(  # what sacctmgr needs before the cluster's exists
            "\n".join(
                [
                    f"ClusterName={CLUSTER_NAME}",
                    f"SlurmctldHost={short_hostname()}(127.0.0.1)",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={socket}",
                    "AccountingStorageType=accounting_storage/slurmdbd",
                    "AccountingStorageHost=127.0.0.1",
                    f"AccountingStoragePort={self.port}",
                    f"AccountingStoragePass={socket}",
                ]
            )
            + "\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.etc / "slurm.conf")  # slurmdbd.conf is read beside it
        self._spawn("slurmdbd", self._argv("slurmdbd", "-D"), env=env)
        _proc.wait_for(
            lambda: not _proc.port_free(self.port), what="slurmdbd to listen", timeout=timeout
        )
        self.sacctmgr("add", "cluster", CLUSTER_NAME)
        return self

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log_path = self.root / "log" / f"{name}.console.log"
        with log_path.open("ab") as out:
            self._popens[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env or dict(os.environ), start_new_session=True,
            )  # fmt: skip

    def sacctmgr(self, *args: str, check: bool = True) -> str:
        """``sacctmgr -i -n -P ARGS`` against this accounting (the cluster need not run)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.root / "client" / "slurm.conf")
        sacctmgr = self.slurm_root.tool("sacctmgr") if self.slurm_root is not None else "sacctmgr"
        out = subprocess.run(
            [sacctmgr, "-i", "-n", "-P", *args], env=env, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        if check and out.returncode != 0:
            raise SlurmSandboxError(f"sacctmgr {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def stop(self) -> None:
        for name in ("slurmdbd", "mariadbd", "munged"):
            popen = self._popens.pop(name, None)
            if popen is None or popen.poll() is not None:
                continue
            popen.terminate()
            try:
                popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=10)
