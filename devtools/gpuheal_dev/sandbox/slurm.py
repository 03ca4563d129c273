"""A real Slurm cluster on loopback: munged, slurmctld, one ``slurmd -N <name>`` per node.

Debian's slurm-wlm 22.05 is built with MULTIPLE_SLURMD, so one host runs as many Slurm nodes
as we like, each ``slurmd`` on its own port. Node names are the caller's (they equal the
Kubernetes node names). Fake GPUs: ``gres/gpu`` backed by symlinks to ``/dev/null`` with
``AutoDetect=off``. Everything (config, munge key and socket, state, spool, logs, PIDs) lives
under one root directory; ports are picked free at start, so clusters run side by side.

    with SlurmCluster(tmp / "slurm", ["gpu-node-0", "gpu-node-1"]) as slurm:
        slurm.run("sbatch", "--wrap", "sleep 60")
        print(slurm.run("sinfo").stdout)

Facts this relies on, measured with Debian bookworm's slurm-wlm 22.05.8: daemons fork and exit 0
even when they die at once (we run them in the foreground and poll ``scontrol ping``/``sinfo``);
a requeued job is held for munge's ``cred_expire`` seconds (minimum 5) unless
``scontrol update JobId=X StartTime=now`` is sent once it shows PENDING/BeginTime; ``slurmstepd``
and job processes can outlive ``slurmd`` (stop cancels jobs first, then kills leftovers of this
cluster found through /proc); gres ``gpu:8`` needs 8 distinct files (``File=/dev/null`` repeated,
listed or with ``Count=8`` makes slurmd exit), so ``root/dev/gpu0..7`` are symlinks to /dev/null;
slurmd and slurmctld retry a taken port for 5 s before dying.

``slurm="26.05"`` runs Slurm 26.05 instead, from a Debian root of its own
(`gpuheal_dev.sandbox.slurmroot`): the daemons and clients run through that root's way in,
the rest (paths, ports, node names, fake GPUs) is the same. What differs on 26.05, seen on
26.05.5: slurmd needs ``CgroupPlugin=disabled`` without a cgroup filesystem of its own, and
with the cluster's freezer bind (`gpuheal_dev.sandbox.cgroup`) tracks jobs with
proctrack/cgroup and ``cgroup/v1`` as 22.05 does (its daemons see the host's
``/sys/fs/cgroup``); its slurmstepd wipe their environment (found by working directory,
`SlurmCluster.steps`); the cluster's root is a shared mount so that a mount made there later
reaches its daemons' namespaces (`SlurmCluster._share_root`); slurmrestd authenticates with
JWT (``auth/jwt`` on slurmctld, a key under ``etc/``, a token for root under ``run/``),
listens on a TCP port of 127.0.0.1 and refuses to run as SlurmUser (root here), so it runs
as ``nobody``; expedited requeue is on (``SlurmctldParameters=enable_expedited_requeue``) for
jobs that ask for it (``--requeue=expedite``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from gpuheal_dev.sandbox import _proc, cgroup
from gpuheal_dev.sandbox.slurmroot import HOST_SLURM, SLURM_VERSIONS, SlurmRoot, ensure_root

log = logging.getLogger("gpuheal_dev.sandbox.slurm")

#: Slurm node names we accept: what Slurm hostlists handle and Kubernetes node names use.
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
#: Munge rejects smaller values (and silently falls back to 120 s).
MIN_CRED_EXPIRE = 5
#: Env marker put on every daemon we spawn (inherited by slurmscriptd and slurmstepd), so that
#: ``stop()`` finds this cluster's processes even when a PID file is lost.
SANDBOX_ENV_MARKER = "GPUHEAL_SLURM_SANDBOX"
#: slurmrestd 22.05 offers these; the dbv0.0.3x plugins are fatal without slurmdbd.
RESTD_OPENAPI_PLUGINS = "openapi/v0.0.38,openapi/v0.0.37,openapi/v0.0.36"
#: slurmrestd 26.05: the slurmctld API in every data parser it has (v0.0.42-45); no slurmdbd.
RESTD_OPENAPI_PLUGINS_26 = "openapi/slurmctld"
#: what slurmrestd runs as where it refuses SlurmUser (26.05): it needs no rights of its own,
#: the JWT of each request says who acts.
RESTD_USER = "65534"  # nobody (a uid: the root may not name it)
#: lifespan of the sandbox's JWT for root (seconds): longer than any sandbox lives.
JWT_LIFESPAN = 7 * 86400

_DEBIAN_PACKAGES = (
    "munge",
    "slurmctld",
    "slurmd",
    "slurm-client",
    "slurmrestd",
    "slurm-wlm-jwt-plugin",
)
_CLIENTS = ("scontrol", "sinfo", "squeue", "sbatch", "scancel", "munge", "unmunge")
_SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin"
# Debian installs the daemons through alternatives: /proc/PID/exe is e.g. slurmd-wlm.
_EXE = {
    "munged": frozenset({"munged"}),
    "slurmctld": frozenset({"slurmctld", "slurmctld-wlm"}),
    "slurmd": frozenset({"slurmd", "slurmd-wlm"}),
    "slurmstepd": frozenset({"slurmstepd", "slurmstepd-wlm"}),
    "slurmrestd": frozenset({"slurmrestd", "slurmrestd-wlm"}),
}
_BIND_ERROR = "Address already in use"
# sun_path is 108 bytes including the terminating NUL.
_MAX_UNIX_SOCKET_PATH = 107
# squeue states of jobs that still have (or may get) processes.
_ACTIVE_JOB_STATES = "PD,R,CG,S,CF,RQ,RS,SO,ST,RD,RF,RH,SI,SE"


class SlurmSandboxError(RuntimeError):
    """The sandbox Slurm cluster failed to start or stop; the message carries log tails."""


class SlurmCommandError(subprocess.CalledProcessError):
    """A Slurm client command exited non-zero; ``str()`` includes its stderr."""

    def __str__(self) -> str:
        err = (self.stderr or self.output or "").strip()
        return f"{' '.join(map(str, self.cmd))} exited {self.returncode}: {err}"


class _PortInUse(SlurmSandboxError):
    pass


# --------------------------------------------------------------------------------------------
# Pure pieces: layout, validation, config rendering


@dataclass(frozen=True)
class SlurmLayout:
    """Where everything of one cluster lives, all under ``root``."""

    root: Path

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.etc / "gres.conf"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def log_prev(self) -> Path:
        return self.root / "log.prev"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def dev(self) -> Path:
        return self.root / "dev"

    @property
    def munge(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge / "munge.sock"

    @property
    def munge_key(self) -> Path:
        return self.munge / "munge.key"

    @property
    def restd_socket(self) -> Path:
        return self.run / "slurmrestd.sock"

    @property
    def jwt_key(self) -> Path:
        return self.etc / "jwt_hs256.key"

    @property
    def jwt_token(self) -> Path:
        """root's JWT for slurmrestd (``scontrol token``), the bare token."""
        return self.run / "jwt-root.token"

    @property
    def reboot_program(self) -> Path:
        return self.etc / "reboot-program.sh"

    @property
    def saved_spec(self) -> Path:
        return self.root / "cluster.json"

    def pidfile(self, daemon: str) -> Path:
        """Our own record of a daemon's PID (``slurmd@<node>`` for node daemons)."""
        return self.run / f"{daemon}.pid"

    def daemon_log(self, daemon: str) -> Path:
        return self.log / f"{daemon}.log"

    def console_log(self, daemon: str) -> Path:
        """stdout/stderr of a daemon: early failures (bad config) land here, not in its log."""
        return self.log / f"{daemon}.console"

    def step_socket_worst_case(self, node: str) -> Path:
        """slurmstepd's socket for the largest job and step ids (10 digits each)."""
        return self.spool / node / f"{node}_{2**32 - 1}.{2**32 - 1}"

    def gpu_files(self, count: int) -> list[Path]:
        return [self.dev / f"gpu{i}" for i in range(count)]


@dataclass(frozen=True)
class SlurmConfig:
    """Everything ``slurm.conf`` and ``gres.conf`` depend on."""

    layout: SlurmLayout
    host: str
    ctld_port: int
    node_ports: Mapping[str, int]
    gpus_per_node: int = 8
    cpus_per_node: int = 8
    memory_mb: int = 64000
    cred_expire: int = MIN_CRED_EXPIRE
    cluster_name: str = "gpuheal"
    partition: str = "main"
    #: ``linuxproc`` or ``cgroup`` (see gpuheal_dev.sandbox.cgroup)
    proctrack: str = "linuxproc"
    #: seconds a step's processes may outlive SIGKILL before slurmd drains the node
    unkillable_step_timeout: int = 60
    #: port of a slurmdbd on 127.0.0.1 (`gpuheal_dev.sandbox.slurmdbd`); None: no accounting
    dbd_port: int | None = None
    reboot_timeout: int = 60
    #: Slurm release (``slurmroot.SLURM_VERSIONS``): 26.05 adds JWT and expedited requeue
    release: str = HOST_SLURM


def validate_node_names(nodes: Sequence[str]) -> list[str]:
    """Return ``nodes`` as a list, or raise ValueError for empty, duplicate or bad names."""
    names = list(nodes)
    if not names:
        raise ValueError("a Slurm cluster needs at least one node")
    bad = [n for n in names if not NODE_NAME_RE.match(n)]
    if bad:
        raise ValueError(
            f"invalid Slurm node names {bad}: use letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate node names: {dupes}")
    return names


def check_socket_paths(layout: SlurmLayout, nodes: Sequence[str]) -> None:
    """Raise ValueError if a unix socket of this cluster would not fit in sun_path.

    The longest are slurmstepd's: ``<spool>/<node>/<node>_<jobid>.<stepid>``; when too long
    the batch step dies at launch ("Unix socket name exceeded maximum length") and the job
    is requeued and held. Keep the root short (pytest's tmp_path can be too deep).
    """
    paths = [layout.munge_socket, layout.restd_socket, *map(layout.step_socket_worst_case, nodes)]
    longest = max(paths, key=lambda p: len(os.fsencode(p)))
    if len(os.fsencode(longest)) > _MAX_UNIX_SOCKET_PATH:
        raise ValueError(
            f"Slurm root {layout.root} is too deep for unix sockets (at most "
            f"{_MAX_UNIX_SOCKET_PATH} bytes): {longest} has {len(os.fsencode(longest))};"
            " use a shorter root (or shorter node names)"
        )


def short_hostname() -> str:
    """What ``hostname -s`` prints; SlurmctldHost must equal it."""
    return socket.gethostname().split(".", 1)[0]


def render_slurm_conf(cfg: SlurmConfig) -> str:
    lay = cfg.layout
    lines = [
        "# generated by gpuheal_dev.sandbox.slurm; do not edit",
        f"ClusterName={cfg.cluster_name}",
        f"SlurmctldHost={cfg.host}(127.0.0.1)",
        f"SlurmctldPort={cfg.ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        *(
            []
            if cfg.release == HOST_SLURM
            else [
                "# slurmrestd's requests carry a JWT signed with this key (scontrol token)",
                "AuthAltTypes=auth/jwt",
                f"AuthAltParameters=jwt_key={lay.jwt_key}",
                "# a job submitted with --requeue=expedite restarts at once when requeued",
                "SlurmctldParameters=enable_expedited_requeue",
            ]
        ),
        "CredType=cred/munge",
        "# cred_expire is also how long a requeued job is held (BeginTime); munge minimum is 5",
        f"AuthInfo=socket={lay.munge_socket},cred_expire={cfg.cred_expire}",
        f"StateSaveLocation={lay.state}",
        f"SlurmdSpoolDir={lay.spool}/%n",
        f"SlurmctldPidFile={lay.run}/slurm/slurmctld.pid",
        f"SlurmdPidFile={lay.run}/slurm/slurmd-%n.pid",
        f"SlurmctldLogFile={lay.daemon_log('slurmctld')}",
        f"SlurmdLogFile={lay.log}/slurmd@%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "MailProg=/bin/true",
        f"ProctrackType=proctrack/{cfg.proctrack}",
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        *(
            [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={cfg.dbd_port}",
                # the munge socket for the dbd connection (the default is /run/munge's)
                f"AccountingStoragePass={lay.munge_socket}",
            ]
            if cfg.dbd_port
            else ["AccountingStorageType=accounting_storage/none"]
        ),
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "# node sizes below are taken as configured, not probed from this machine",
        "SlurmdParameters=config_overrides",
        "JobRequeue=1",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=2,bf_interval=1",
        "MinJobAge=600",
        "KillWait=2",
        "# a step whose processes outlive SIGKILL this long: slurmd drains the node"
        " ('Kill task failed')",
        f"UnkillableStepTimeout={cfg.unkillable_step_timeout}",
        "InactiveLimit=0",
        "SlurmdTimeout=30",
        "SlurmctldTimeout=30",
        "MessageTimeout=5",
        "# `scontrol reboot` restarts the node's slurmd with -b (see reboot-program.sh); a node",
        "# that does not come back within ResumeTimeout goes DOWN 'reboot timed out'",
        f"RebootProgram={lay.reboot_program}",
        f"ResumeTimeout={cfg.reboot_timeout}",
    ]
    gres = f" Gres=gpu:{cfg.gpus_per_node}" if cfg.gpus_per_node else ""
    for name, port in cfg.node_ports.items():
        lines.append(
            f"NodeName={name} NodeHostname={cfg.host} NodeAddr=127.0.0.1 Port={port}"
            f" CPUs={cfg.cpus_per_node} RealMemory={cfg.memory_mb}{gres} State=UNKNOWN"
        )
    lines.append(f"PartitionName={cfg.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def render_gres_conf(cfg: SlurmConfig) -> str:
    """One ``File=`` per GPU; the files are symlinks to /dev/null (see ``SlurmLayout.gpu_files``).

    A Count-only line reports 0 GPUs and the node goes INVAL+DRAIN, so files are required.
    """
    lines = [
        "# generated by gpuheal_dev.sandbox.slurm; fake GPUs backed by /dev/null",
        "AutoDetect=off",
    ]
    if cfg.gpus_per_node:
        files = cfg.layout.gpu_files(cfg.gpus_per_node)
        spec = str(files[0]) if len(files) == 1 else f"{cfg.layout.dev}/gpu[0-{len(files) - 1}]"
        lines += [f"NodeName={name} Name=gpu File={spec}" for name in cfg.node_ports]
    return "\n".join(lines) + "\n"


def client_env(conf: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: os.environ) without inherited ``SLURM_*`` variables, plus SLURM_CONF."""
    src = os.environ if base is None else base
    env = {k: v for k, v in src.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(conf)
    return env


def parse_node_states(sinfo_out: str) -> dict[str, str]:
    """Parse ``sinfo -h -N -o '%N %T'`` into {node: state} (a node listed twice keeps the first)."""
    states: dict[str, str] = {}
    for line in sinfo_out.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            states.setdefault(parts[0], parts[1])
    return states


def _is_mountpoint(path: Path) -> bool:
    """``path`` is a mount point in this namespace (a bind of a directory on itself too, which
    ``os.path.ismount`` misses: same device)."""
    want = str(path.absolute())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        # field 5 is the mount point, octal-escaped (a space is \040)
        if len(fields) > 4 and re.sub(r"\\(\d{3})", lambda m: chr(int(m[1], 8)), fields[4]) == want:
            return True
    return False


# --------------------------------------------------------------------------------------------
# Installation


def missing_binaries(*, restd: bool = False) -> list[str]:
    path = f"{os.environ.get('PATH', '')}:{_SBIN_PATH}"
    wanted = ["munged", "slurmctld", "slurmd", *_CLIENTS] + (["slurmrestd"] if restd else [])
    return [b for b in wanted if shutil.which(b, path=path) is None]


def ensure_installed(*, restd: bool = False) -> None:
    """Install Debian's munge + Slurm when a binary is missing (hack/install-system-deps.sh when
    this runs from a checkout, else apt-get directly). A no-op when everything is there."""
    missing = missing_binaries(restd=restd)
    if not missing:
        return
    log.info("slurm: installing Debian packages (missing: %s)", " ".join(missing))
    script = Path(__file__).resolve().parents[3] / "hack" / "install-system-deps.sh"
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    if script.is_file():
        subprocess.run([str(script)], check=True)
    else:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(
            [
                *sudo,
                "apt-get",
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                *_DEBIAN_PACKAGES,
            ],
            check=True,
            env=env,
        )
    still = missing_binaries(restd=restd)
    if still:
        raise SlurmSandboxError(f"Slurm/munge binaries still missing after install: {still}")


def _sbin(name: str) -> str:
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_SBIN_PATH}")
    if found is None:
        raise SlurmSandboxError(f"{name} not found; run hack/install-system-deps.sh")
    return found


# --------------------------------------------------------------------------------------------
# The cluster


@dataclass(frozen=True)
class DaemonStatus:
    name: str
    pid: int | None
    alive: bool


@dataclass(frozen=True)
class SlurmStatus:
    root: Path
    conf_path: Path
    ctld_port: int | None
    node_ports: Mapping[str, int]
    daemons: list[DaemonStatus]
    ctld_up: bool
    #: {node: sinfo state} when slurmctld answers, else empty
    nodes: Mapping[str, str] = field(default_factory=dict)
    restd_socket: Path | None = None
    release: str = HOST_SLURM
    #: the cluster's own clients (``export PATH=<bin_dir>:$PATH``); None: the host's
    bin_dir: Path | None = None

    @property
    def running(self) -> bool:
        return any(d.alive for d in self.daemons)


class SlurmCluster:
    """A throwaway Slurm cluster under ``root`` with one slurmd per name in ``nodes``.

    ``start()`` blocks until every node is idle (about 0.3 s on an idle machine) and raises
    ``SlurmSandboxError`` with log tails when a daemon dies or does not come up. ``stop()`` is
    idempotent and kills only processes of this cluster (by PID, exe and environment).
    """

    def __init__(
        self,
        root: Path,
        nodes: Sequence[str],
        *,
        cred_expire: int = MIN_CRED_EXPIRE,
        restd: bool = False,
        gpus_per_node: int = 8,
        cpus_per_node: int = 8,
        memory_mb: int = 64000,
        install: bool = True,
        start_timeout: float = 60.0,
        proctrack: str = "auto",
        unkillable_step_timeout: int = 60,
        dbd_port: int | None = None,
        slurm: str = HOST_SLURM,
    ) -> None:
        if slurm not in SLURM_VERSIONS:
            raise ValueError(f"slurm must be one of {', '.join(SLURM_VERSIONS)}, not {slurm!r}")
        if proctrack not in ("auto", "cgroup", "linuxproc"):
            raise ValueError(f"proctrack must be auto, cgroup or linuxproc, not {proctrack!r}")
        if cred_expire < MIN_CRED_EXPIRE:
            raise ValueError(
                f"cred_expire must be >= {MIN_CRED_EXPIRE} (munge silently uses 120 s otherwise)"
            )
        if gpus_per_node < 0 or cpus_per_node < 1:
            raise ValueError("gpus_per_node must be >= 0 and cpus_per_node >= 1")
        self.layout = SlurmLayout(Path(root).absolute())
        self.nodes: list[str] = validate_node_names(nodes)
        check_socket_paths(self.layout, self.nodes)
        self.cred_expire = cred_expire
        self.restd = restd
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        self.memory_mb = memory_mb
        self.install = install
        self.start_timeout = start_timeout
        self.unkillable_step_timeout = unkillable_step_timeout
        #: what was asked for; ``proctrack`` is what runs (``auto``: cgroup where possible)
        self.proctrack_wanted = proctrack
        self.proctrack = "linuxproc" if proctrack == "auto" else proctrack
        #: why this process tracking (for ``auto``: why not cgroup, when not)
        self.proctrack_reason = ""
        self.dbd_port = dbd_port  # accounting (AdminLevel, users) through a slurmdbd there
        #: the Slurm release that runs (``22.05``: the host's packages)
        self.release = slurm
        #: where that release lives when it is not the host's (found or built by ``start()``)
        self.slurm_root: SlurmRoot | None = None
        self.restd_port: int | None = None
        self.ctld_port: int | None = None
        self.node_ports: dict[str, int] = {}
        #: seconds the last successful ``start()`` took
        self.start_seconds: float | None = None
        self._popens: dict[str, subprocess.Popen[bytes]] = {}
        self._t0 = time.monotonic()

    # ---- construction from a running cluster (e.g. `gpuheal-dev sandbox down` in a new process)

    @classmethod
    def attach(cls, root: Path) -> SlurmCluster:
        """The cluster started earlier under ``root`` (reads ``root/cluster.json``)."""
        layout = SlurmLayout(Path(root).absolute())
        try:
            spec = json.loads(layout.saved_spec.read_text())
        except (OSError, ValueError) as exc:
            raise SlurmSandboxError(f"no Slurm sandbox under {root}: {exc}") from exc
        cluster = cls(
            layout.root,
            list(spec["node_ports"]),
            cred_expire=spec["cred_expire"],
            restd=spec["restd"],
            gpus_per_node=spec["gpus_per_node"],
            cpus_per_node=spec["cpus_per_node"],
            memory_mb=spec["memory_mb"],
            install=False,
            proctrack=spec.get("proctrack", "linuxproc"),
            unkillable_step_timeout=spec.get("unkillable_step_timeout", 60),
            slurm=spec.get("slurm", HOST_SLURM),
        )
        cluster.ctld_port = spec["ctld_port"]
        cluster.node_ports = dict(spec["node_ports"])
        cluster.restd_port = spec.get("restd_port")
        if spec.get("slurm_root"):
            cluster.slurm_root = SlurmRoot(Path(spec["slurm_root"]))
        return cluster

    # ---- what callers use

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def conf_path(self) -> Path:
        return self.layout.conf

    @property
    def log_dir(self) -> Path:
        return self.layout.log

    @property
    def env(self) -> dict[str, str]:
        """Variables that point Slurm clients at this cluster (``SLURM_CONF``), to merge into an
        environment: ``subprocess.run(cmd, env={**os.environ, **cluster.env})``. For a complete
        environment without inherited ``SLURM_*`` variables use ``subprocess_env()``."""
        return {"SLURM_CONF": str(self.conf_path)}

    def subprocess_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """A complete environment for Slurm clients: ``base`` (default os.environ) minus
        inherited ``SLURM_*`` variables, plus ``SLURM_CONF``."""
        return client_env(self.conf_path, base)

    @property
    def own_root(self) -> bool:
        """Slurm runs from a root of its own (not the host's packages)."""
        return self.release != HOST_SLURM

    @property
    def restd_socket(self) -> Path | None:
        """Unix socket of slurmrestd (rest_auth/local) when started with ``restd=True`` on
        22.05 (26.05 listens on TCP with JWT: ``restd_url``, ``restd_token_file``).

        ``httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://localhost")``
        then ``GET /slurm/v0.0.38/nodes``. slurmrestd 22.05 cannot drain or requeue.
        """
        return self.layout.restd_socket if self.restd and not self.own_root else None

    @property
    def restd_url(self) -> str | None:
        """Where slurmrestd listens when restd is on, else None: ``unix:<socket>``
        (slurmrestd's own listen syntax) on 22.05, ``http://127.0.0.1:<port>`` on 26.05."""
        if not self.restd:
            return None
        if self.own_root:
            return f"http://127.0.0.1:{self.restd_port}"
        return f"unix:{self.layout.restd_socket}"

    @property
    def restd_token_file(self) -> Path | None:
        """root's JWT for slurmrestd (26.05 with restd), else None."""
        return self.layout.jwt_token if self.restd and self.own_root else None

    @property
    def bin_dir(self) -> Path | None:
        """Where this cluster's own clients are (wrappers into its root); None: the host's."""
        return self.slurm_root.bin_dir if self.slurm_root is not None else None

    def tool(self, name: str) -> str:
        """The program to run for a Slurm client (``scontrol``...) of this cluster's release."""
        return self.slurm_root.tool(name) if self.slurm_root is not None else name

    def _daemon_argv(self, name: str, *args: str) -> list[str]:
        """argv of a daemon (``slurmctld``...): the host's, or the one in the root."""
        if self.slurm_root is not None:
            return self.slurm_root.enter_argv(f"/usr/sbin/{name}", *args)
        return [_sbin(name), *args]

    def version(self) -> str:
        """``scontrol --version`` of this cluster's clients, e.g. ``slurm 26.05.5``."""
        return self.run("scontrol", "--version").stdout.strip()

    def run(
        self, *args: str, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client (``run("scontrol", "ping")``) against this cluster, text output."""
        proc = subprocess.run(
            [self.tool(args[0]), *args[1:]],
            env=self.subprocess_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise SlurmCommandError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc

    def node_states(self) -> dict[str, str]:
        """{node: state} as ``sinfo -N`` reports it (``idle``, ``mixed``, ``drained``, ...)."""
        return parse_node_states(self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- start

    def start(self) -> Self:
        running = self._live_daemons()
        if running:
            raise SlurmSandboxError(
                f"a Slurm sandbox under {self.root} is already running "
                f"({', '.join(f'{n} pid {p}' for n, p in running.items())}); stop it first"
            )
        self._reap_popens()  # stopped from elsewhere (e.g. SlurmCluster.attach(root).stop())
        self._popens.clear()
        if self.own_root:
            self.prepare_root()
        elif self.install:
            ensure_installed(restd=self.restd)
        self._choose_proctrack()
        self._t0 = time.monotonic()
        self._progress(f"starting Slurm under {self.root} with nodes {', '.join(self.nodes)}")
        for attempt in range(1, 4):
            self._pick_ports()
            try:
                self._start_once()
            except _PortInUse as exc:
                first_line = str(exc).splitlines()[0]
                self._progress(
                    f"a port was taken meanwhile ({first_line}); retrying with new ports"
                )
                self.stop(quiet=True)
                if attempt == 3:
                    raise
                continue
            except BaseException:
                self.stop(quiet=True)
                raise
            break
        self.start_seconds = time.monotonic() - self._t0
        self._progress(
            f"ready in {self.start_seconds:.2f}s: SLURM_CONF={self.conf_path}"
            f" (slurmctld port {self.ctld_port}, logs in {self.log_dir})"
        )
        return self

    def _choose_proctrack(self) -> None:
        """``auto``: proctrack/cgroup where this machine allows it, else linuxproc and why."""
        if self.proctrack_wanted == "linuxproc":
            self.proctrack, self.proctrack_reason = "linuxproc", "asked for"
            return
        support = self.cgroup_support()
        if support.ok:
            self.proctrack, self.proctrack_reason = "cgroup", support.reason
            return
        if self.proctrack_wanted == "cgroup":
            raise SlurmSandboxError(f"proctrack/cgroup is not available here: {support.reason}")
        self.proctrack, self.proctrack_reason = "linuxproc", f"no cgroup: {support.reason}"
        log.info("slurm: proctrack/linuxproc (%s)", support.reason)

    def cgroup_support(self) -> cgroup.CgroupSupport:
        """Whether this machine lets this cluster's release track jobs with proctrack/cgroup
        (what ``proctrack="auto"`` chooses), and why not. A release in a root of its own is
        built first when it is not cached: its daemons see the host's ``/sys/fs/cgroup`` and
        this cluster's freezer bind as the host does, its plugins are the root's."""
        root = self.prepare_root()
        return cgroup.cgroup_support(root.tree if root is not None else Path("/"))

    def prepare_root(self) -> SlurmRoot | None:
        """The root this cluster's release runs from (built first when it is not cached), None
        for the host's packages: what runs beside it (its slurmdbd) comes from there too."""
        if self.own_root and self.slurm_root is None:
            self.slurm_root = ensure_root(self.release)
        return self.slurm_root

    def _pick_ports(self) -> None:
        ports = _proc.free_tcp_ports(2 + len(self.nodes))
        self.ctld_port, self.restd_port = ports[0], ports[1]
        self.node_ports = dict(zip(self.nodes, ports[2:], strict=True))

    def config(self) -> SlurmConfig:
        if self.ctld_port is None:
            raise SlurmSandboxError("ports are chosen by start(); the cluster was never started")
        return SlurmConfig(
            layout=self.layout,
            host=short_hostname(),
            ctld_port=self.ctld_port,
            node_ports=self.node_ports,
            gpus_per_node=self.gpus_per_node,
            cpus_per_node=self.cpus_per_node,
            memory_mb=self.memory_mb,
            cred_expire=self.cred_expire,
            proctrack=self.proctrack,
            unkillable_step_timeout=self.unkillable_step_timeout,
            dbd_port=self.dbd_port,
            release=self.release,
        )

    def _prepare_files(self) -> None:
        lay = self.layout
        for d in (lay.state, lay.spool, lay.run, lay.dev):
            shutil.rmtree(d, ignore_errors=True)
        # log/ is this run's, log.prev/ the one before (a failed attempt, a previous start)
        if lay.log.is_dir() and any(lay.log.iterdir()):
            shutil.rmtree(lay.log_prev, ignore_errors=True)
            lay.log.rename(lay.log_prev)
        for d in (lay.etc, lay.state, lay.log, lay.run / "slurm", lay.dev, lay.munge):
            d.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (lay.spool / node).mkdir(parents=True, exist_ok=True)
        lay.root.chmod(0o755)
        lay.munge.chmod(0o711)  # clients of any uid must reach the socket, not read the key
        if not lay.munge_key.exists() or lay.munge_key.stat().st_size < 32:
            lay.munge_key.write_bytes(os.urandom(1024))
        lay.munge_key.chmod(0o400)
        for p in (lay.munge_socket, Path(f"{lay.munge_socket}.lock"), lay.restd_socket):
            p.unlink(missing_ok=True)
        for f in lay.gpu_files(self.gpus_per_node):
            f.symlink_to("/dev/null")
        shutil.copyfile(Path(__file__).parent / "data" / "reboot-program.sh", lay.reboot_program)
        lay.reboot_program.chmod(0o755)
        cfg = self.config()
        lay.conf.write_text(render_slurm_conf(cfg))
        lay.gres_conf.write_text(render_gres_conf(cfg))
        cgroup_conf = lay.etc / "cgroup.conf"
        cgroup_conf.unlink(missing_ok=True)
        if self.own_root:
            # 26.05's slurmd dies at start without a cgroup filesystem it can use (replaced
            # below with proctrack/cgroup)
            cgroup_conf.write_text("CgroupPlugin=disabled\n")
            self._share_root()
            lay.jwt_key.write_bytes(os.urandom(32))
            lay.jwt_key.chmod(0o600)  # slurmctld refuses a key others can read
        if self.proctrack == "cgroup":
            cgroup_conf.write_text(cgroup.render_cgroup_conf(lay.root))
            try:
                cgroup.setup(lay.root)
            except (OSError, subprocess.CalledProcessError) as exc:
                raise SlurmSandboxError(f"proctrack/cgroup: bind mount failed: {exc}") from exc
        lay.saved_spec.write_text(
            json.dumps(
                {
                    "ctld_port": self.ctld_port,
                    "node_ports": self.node_ports,
                    "cred_expire": self.cred_expire,
                    "restd": self.restd,
                    "gpus_per_node": self.gpus_per_node,
                    "cpus_per_node": self.cpus_per_node,
                    "memory_mb": self.memory_mb,
                    "proctrack": self.proctrack,
                    "unkillable_step_timeout": self.unkillable_step_timeout,
                    "slurm": self.release,
                    "slurm_root": str(self.slurm_root.path) if self.slurm_root else None,
                    "restd_port": self.restd_port,
                },
                indent=2,
            )
        )

    def _share_root(self) -> None:
        """Bind the cluster's root on itself as a shared mount: the root's daemons enter their
        namespace as its slaves (``slurmroot``'s way in), so a mount made later under the root
        on the host (a test's FUSE wedge) shows to them, as a mount on a node shows to its
        slurmd. The host's / is private here: without this nothing made later reaches them."""
        root = str(self.root)
        try:
            if not _is_mountpoint(self.root):
                subprocess.run(["mount", "--bind", root, root], check=True, capture_output=True)
            subprocess.run(["mount", "--make-shared", root], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            err = getattr(exc, "stderr", b"") or b""
            raise SlurmSandboxError(
                f"sharing {root} with Slurm {self.release}'s namespaces (mount --bind, "
                f"--make-shared; needs root): {exc} {err.decode(errors='replace').strip()}"
            ) from exc

    def _unshare_root(self) -> None:
        """Undo `_share_root` (lazily when a stuck process still holds something in it)."""
        while _is_mountpoint(self.root):
            done = subprocess.run(["umount", str(self.root)], capture_output=True, check=False)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", str(self.root)], capture_output=True, check=False)
                break

    def _start_once(self) -> None:
        lay = self.layout
        self._prepare_files()
        # munged in the foreground: its PID is ours to record, its death visible at once.
        self._spawn(
            "munged",
            self._daemon_argv(
                "munged",
                "--foreground",
                "--force",
                f"--socket={lay.munge_socket}",
                f"--key-file={lay.munge_key}",
                f"--log-file={lay.daemon_log('munged')}",
                f"--pid-file={lay.run / 'slurm' / 'munged.pid'}",
                f"--seed-file={lay.munge / 'munged.seed'}",
            ),
        )
        self._wait("munged", self._munge_works, "munged to answer", logs=["munged"])
        self._progress(f"munged up (pid {self._popens['munged'].pid})")

        # slurmctld and slurmd retry a taken port for 5 s before they die: look first
        self._check_ports_free()
        self._spawn("slurmctld", self._daemon_argv("slurmctld", "-D", "-f", str(lay.conf)))
        self._wait("slurmctld", self._ctld_up, "slurmctld to answer ping", logs=["slurmctld"])
        self._progress(
            f"slurmctld up on port {self.ctld_port} (pid {self._popens['slurmctld'].pid})"
        )

        for node in self.nodes:
            argv = self._daemon_argv("slurmd", "-D", "-f", str(lay.conf), "-N", node)
            self._spawn(f"slurmd@{node}", argv)
        self._wait(
            None,
            self._all_idle,
            f"all {len(self.nodes)} nodes idle",
            logs=["slurmctld", *(f"slurmd@{n}" for n in self.nodes)],
        )
        gres = self.run("sinfo", "-h", "-N", "-o", "%N %G").stdout.split()
        self._progress(
            f"{len(self.nodes)} slurmd up, all idle"
            + (f" with {gres[1]}" if len(gres) > 1 else "")
            + f": {' '.join(f'{n}:{p}' for n, p in self.node_ports.items())}"
        )

        if self.restd and self.own_root:
            self._start_restd_jwt()
        elif self.restd:
            self._spawn(
                "slurmrestd",
                [
                    _sbin("slurmrestd"),
                    "-a",
                    "rest_auth/local",
                    "-s",
                    RESTD_OPENAPI_PLUGINS,
                    f"unix:{lay.restd_socket}",
                ],
                extra_env={"SLURMRESTD_SECURITY": "disable_user_check"},
            )
            self._wait(
                "slurmrestd", self._restd_up, "slurmrestd to answer ping", logs=["slurmrestd"]
            )
            self._progress(
                f"slurmrestd up (pid {self._popens['slurmrestd'].pid}) on unix:{lay.restd_socket}"
            )

    def _start_restd_jwt(self) -> None:
        """slurmrestd on 127.0.0.1:<restd_port> with JWT auth, and root's token in a file."""
        lay = self.layout
        token = self.run("scontrol", "token", "username=root", f"lifespan={JWT_LIFESPAN}")
        bare = token.stdout.strip().removeprefix("SLURM_JWT=")
        lay.jwt_token.write_text(bare + "\n")
        lay.jwt_token.chmod(0o600)
        argv = self._daemon_argv(
            "slurmrestd", "-a", "rest_auth/jwt", "-s", RESTD_OPENAPI_PLUGINS_26,
            "-u", RESTD_USER, "-g", RESTD_USER, f"127.0.0.1:{self.restd_port}",
        )  # fmt: skip
        # SLURM_JWT=daemon: slurmrestd itself talks to slurmctld with each request's token
        self._spawn("slurmrestd", argv, extra_env={"SLURM_JWT": "daemon"})
        self._wait("slurmrestd", self._restd_up, "slurmrestd to answer ping", logs=["slurmrestd"])
        self._progress(
            f"slurmrestd up (pid {self._popens['slurmrestd'].pid}) on {self.restd_url} (JWT)"
        )

    def stop_daemon(self, name: str) -> None:
        """Stop one daemon (``slurmctld`` or ``slurmd@NODE``) and leave the rest running: a
        fault for tests. Jobs keep running under their slurmstepd; `start_daemon` brings it
        back."""
        if name != "slurmctld" and not name.startswith("slurmd@"):
            raise SlurmSandboxError(f"stop_daemon: {name} is not slurmctld or slurmd@NODE")
        self._stop_daemon(name, self._recorded_pids())
        self._reap_popens()

    def start_daemon(self, name: str) -> None:
        """Start a daemon stopped by `stop_daemon` again on its port; slurmctld recovers its
        state (jobs, node drains) from StateSaveLocation, as after a real restart."""
        conf = str(self.layout.conf)
        if name == "slurmctld":
            self._spawn(name, self._daemon_argv("slurmctld", "-D", "-f", conf))
            self._wait(name, self._ctld_up, "slurmctld to answer ping", logs=[name])
        elif name.startswith("slurmd@"):
            node = name.split("@", 1)[1]
            self._spawn(name, self._daemon_argv("slurmd", "-D", "-f", conf, "-N", node))
        else:
            raise SlurmSandboxError(f"start_daemon: {name} is not slurmctld or slurmd@NODE")

    def _check_ports_free(self) -> None:
        taken = [
            p for p in (self.ctld_port, *self.node_ports.values()) if p and not _proc.port_free(p)
        ]
        if taken:
            raise _PortInUse(f"Slurm sandbox under {self.root}: ports {taken} are taken")

    def _spawn(
        self, name: str, argv: list[str], extra_env: Mapping[str, str] | None = None
    ) -> None:
        env = client_env(self.conf_path)
        env[SANDBOX_ENV_MARKER] = str(self.root)
        env.update(extra_env or {})
        with self.layout.console_log(name).open("ab") as out:
            out.write(f"==== {time.strftime('%F %T')} {' '.join(argv)}\n".encode())
            out.flush()
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.root,  # also how 26.05's slurmstepd are told apart (`steps`)
                start_new_session=True,  # the terminal's Ctrl-C reaches us, not the daemons
            )
        self._popens[name] = popen
        self.layout.pidfile(name).write_text(f"{popen.pid}\n")

    def _wait(
        self,
        daemon: str | None,
        check: Callable[[], bool],
        what: str,
        logs: Sequence[str],
    ) -> None:
        def probe() -> bool:
            dead = [n for n, p in self._popens.items() if p.poll() is not None]
            if dead:
                self._fail(f"{', '.join(dead)} exited while waiting for {what}", dead)
            return check()

        try:
            _proc.wait_for(probe, what=what, timeout=self.start_timeout)
        except _proc.WaitTimeout as exc:
            self._fail(str(exc), list(logs) if daemon is None else [daemon])

    def _fail(self, message: str, daemons: Sequence[str]) -> None:
        tails = []
        for d in daemons:
            for path in (self.layout.daemon_log(d), self.layout.console_log(d)):
                if path.exists():
                    tails.append(_proc.log_tail(path, 15))
        text = "\n".join(tails)
        cls = _PortInUse if _BIND_ERROR in text else SlurmSandboxError
        raise cls(f"Slurm sandbox under {self.root}: {message}\n{text}")

    def _munge_works(self) -> bool:
        sock = str(self.layout.munge_socket)
        if not self.layout.munge_socket.exists():
            return False
        cred = subprocess.run(
            [self.tool("munge"), "-n", "-S", sock], capture_output=True, text=True, check=False
        )
        if cred.returncode != 0:
            return False
        check = subprocess.run(
            [self.tool("unmunge"), "-S", sock],
            input=cred.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
        return check.returncode == 0

    def _ctld_up(self) -> bool:
        return "is UP" in self.run("scontrol", "ping", check=False, timeout=10).stdout

    def _all_idle(self) -> bool:
        states = parse_node_states(
            self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=10).stdout
        )
        return set(states) == set(self.nodes) and all(s == "idle" for s in states.values())

    def _restd_up(self) -> bool:
        import httpx

        if self.own_root:
            headers = {
                "X-SLURM-USER-NAME": "root",
                "X-SLURM-USER-TOKEN": self.layout.jwt_token.read_text().strip(),
            }
            try:
                with httpx.Client(base_url=str(self.restd_url), timeout=5) as client:
                    ping = client.get("/slurm/v0.0.45/ping", headers=headers)
                    return ping.status_code == 200
            except httpx.HTTPError:
                return False
        if not self.layout.restd_socket.exists():
            return False
        try:
            with httpx.Client(
                transport=httpx.HTTPTransport(uds=str(self.layout.restd_socket)),
                base_url="http://localhost",
                timeout=5,
            ) as client:
                return client.get("/slurm/v0.0.38/ping").status_code == 200
        except httpx.HTTPError:
            return False

    def _progress(self, msg: str) -> None:
        log.info("[slurm %5.2fs] %s", time.monotonic() - self._t0, msg)

    # ---- status

    def _recorded_pids(self) -> dict[str, int]:
        pids: dict[str, int] = {}
        run = self.layout.run
        if run.is_dir():
            for f in sorted(run.glob("*.pid")):
                pid = _proc.read_pidfile(f)
                if pid is not None:
                    pids[f.stem] = pid
        return pids

    def _live_daemons(self) -> dict[str, int]:
        return {
            name: pid
            for name, pid in self._recorded_pids().items()
            if _proc.pid_alive(pid) and _proc.exe_name(pid) in _EXE[name.split("@")[0]]
        }

    def status(self) -> SlurmStatus:
        if self.ctld_port is None:
            with contextlib.suppress(OSError, ValueError, KeyError):
                spec = json.loads(self.layout.saved_spec.read_text())
                self.ctld_port, self.node_ports = spec["ctld_port"], dict(spec["node_ports"])
        live = self._live_daemons()
        daemons = [
            DaemonStatus(name, pid, name in live) for name, pid in self._recorded_pids().items()
        ]
        ctld_up = False
        nodes: dict[str, str] = {}
        if "slurmctld" in live and self.conf_path.exists():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                ctld_up = self._ctld_up()
                if ctld_up:
                    nodes = self.node_states()
        return SlurmStatus(
            root=self.root,
            conf_path=self.conf_path,
            ctld_port=self.ctld_port,
            node_ports=dict(self.node_ports),
            daemons=daemons,
            release=self.release,
            bin_dir=self.bin_dir,
            ctld_up=ctld_up,
            nodes=nodes,
            restd_socket=self.restd_socket if "slurmrestd" in live else None,
        )

    # ---- stop

    def stop(self, *, quiet: bool = False, wait_for_jobs: bool = True) -> None:
        """Cancel jobs, stop every daemon of this cluster by PID and kill leftover job steps.

        ``wait_for_jobs=False`` kills the jobs' processes with the steps instead of cancelling
        them through Slurm first (1.7 s for a running job: the cancel itself, or slurmd's exit
        while it still kills the job): for a cluster thrown away after a test. Idempotent;
        never touches processes of other clusters (checked by exe and environment).
        """
        pids = self._recorded_pids()
        own = self._own_processes()
        if not pids and not own:
            self._reap_popens()
            if cgroup.mountpoint(self.root).exists():
                cgroup.teardown(self.root)
            self._unshare_root()
            return
        t0 = time.monotonic()
        if not quiet:
            self._progress(f"stopping Slurm under {self.root}")
        ctld = pids.get("slurmctld")
        if wait_for_jobs and ctld is not None and _proc.pid_alive(ctld):
            self._cancel_jobs()
        order = ["slurmrestd", *sorted(n for n in pids if n.startswith("slurmd@"))]
        for name in order:
            self._stop_daemon(name, pids)
        self._kill_leftover_steps()
        for name in ("slurmctld", "munged"):
            self._stop_daemon(name, pids)
        # Anything still carrying our marker (a lost PID file, slurmscriptd): stop it too.
        for pid in self._own_processes():
            exe = _proc.exe_name(pid) or ""
            log.warning("slurm: leftover process %d (%s) of %s: stopping it", pid, exe, self.root)
            _proc.stop_pid(pid, {exe}, timeout=5)
        left = _proc.kill_pids(self._job_processes())
        if left:
            log.error("slurm: job processes %s of %s survived SIGKILL", left, self.root)
        if self.proctrack == "cgroup" or cgroup.mountpoint(self.root).exists():
            cgroup.teardown(self.root)
        self._unshare_root()
        for p in (self.layout.munge_socket, Path(f"{self.layout.munge_socket}.lock")):
            p.unlink(missing_ok=True)
        self.layout.restd_socket.unlink(missing_ok=True)
        self._reap_popens()
        if not quiet:
            self._progress(f"stopped in {time.monotonic() - t0:.2f}s")

    def _stop_daemon(self, name: str, pids: Mapping[str, int]) -> None:
        pid = pids.get(name)
        if pid is None:
            return
        if _proc.stop_pid(pid, _EXE[name.split("@", maxsplit=1)[0]], timeout=10):
            log.debug("slurm: stopped %s (pid %d)", name, pid)
        self.layout.pidfile(name).unlink(missing_ok=True)

    def _cancel_jobs(self) -> None:
        try:
            out = self.run("squeue", "-h", "-o", "%i", check=False, timeout=10).stdout
            jobs = out.split()
            if not jobs:
                return
            self.run("scancel", *jobs, check=False, timeout=10)

            def settled() -> bool:
                # Jobs on a node whose slurmd is dead stay COMPLETING until SlurmdTimeout: don't
                # wait for those (their processes are killed below), only for the others.
                out = self.run(
                    "squeue", "-h", "-t", _ACTIVE_JOB_STATES, "-o", "%N", check=False, timeout=10
                )
                if out.returncode != 0:
                    return False
                live = {
                    name.split("@", 1)[1]
                    for name in self._live_daemons()
                    if name.startswith("slurmd@")
                }
                for nodelist in out.stdout.split():
                    if set(self._expand_hostlist(nodelist)) & live:
                        return False
                return not any(line == "" for line in out.stdout.splitlines())

            _proc.wait_for(settled, what="cancelled jobs to finish", timeout=15)
            self._progress(f"cancelled {len(jobs)} job(s)")
        except (_proc.WaitTimeout, subprocess.SubprocessError, OSError) as exc:
            log.warning(
                "slurm: cancelling jobs of %s: %s (killing leftovers instead)", self.root, exc
            )

    def _expand_hostlist(self, hostlist: str) -> list[str]:
        if "[" not in hostlist and "," not in hostlist:
            return [hostlist]
        return self.run("scontrol", "show", "hostnames", hostlist, timeout=10).stdout.split()

    def _own_processes(self) -> list[int]:
        """Live processes spawned by this cluster's daemons (marker in their environment), and
        its slurmstepd (`steps`)."""
        own = _proc.find_pids(env_match={SANDBOX_ENV_MARKER: str(self.root)})
        return sorted({*own, *self.steps()})

    def steps(self) -> list[int]:
        """This cluster's slurmstepd, also orphaned (their slurmd dead). 22.05's carry the
        marker in their environment; 26.05's wipe theirs (its title is written over it), but
        keep the working directory of the slurmd that started them: the cluster's root
        (`_spawn`), which no other cluster's shares."""
        marked = _proc.find_pids(
            exe_names=_EXE["slurmstepd"], env_match={SANDBOX_ENV_MARKER: str(self.root)}
        )
        return sorted({*marked, *_proc.find_pids(exe_names=_EXE["slurmstepd"], cwd=self.root)})

    def _job_processes(self) -> list[int]:
        """Live job processes of this cluster (submitted with our SLURM_CONF), even orphaned."""
        return _proc.find_pids(
            env_match={"SLURM_CONF": str(self.conf_path)}, env_has=("SLURM_JOB_ID",)
        )

    def _kill_leftover_steps(self) -> None:
        victims: list[int] = []
        for step in self.steps():
            victims += [step, *_proc.descendants(step)]
        victims += [p for p in self._job_processes() if p not in victims]
        if victims:
            self._progress(f"killing leftover slurmstepd/job processes {victims}")
            left = _proc.kill_pids(victims)
            if left:
                log.error("slurm: processes %s survived SIGKILL", left)

    def _reap_popens(self) -> None:
        for popen in self._popens.values():
            if popen.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=0.1)
        self._popens = {name: p for name, p in self._popens.items() if p.returncode is None}
