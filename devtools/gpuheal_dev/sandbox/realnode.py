"""One real node for the sandbox: a kubelet built from the pinned ``k8s.io/kubernetes`` module,
Debian's containerd + runc, and the CNI bridge plugin, beside the kwok GPU nodes.

Pods scheduled there really run, from images imported into its containerd (no registry is
reachable here: :func:`RealNode.load_image`). Everything that could collide with another
sandbox on the same machine is its own: containerd's root, state and socket, the kubelet's
root, pod-log directory and ports, the cgroup parent of its pods, the CNI network, bridge and
subnet. ``stop`` removes what it made: containers, mounts, network namespaces, the bridge and
the cgroups.

Settings this machine needs (measured, DESIGN-NOTES "Containers on these machines"):
``failCgroupV1: false`` (kubelet 1.36 refuses cgroup v1 without it), ``cgroupDriver: cgroupfs``
(no systemd here), containerd's ``restrict_oom_score_adj`` (no CAP_SYS_RESOURCE: runc cannot
lower oom_score_adj, and every pod sandbox fails with "can't get final child's PID from
pipe"), a pause image made locally. The kubelet serves (logs, exec) on the CNI bridge's
gateway address, made before it starts: its ``--node-ip`` may not be loopback (1.36 refuses:
"nodeIP can't be loopback address", and the node then has no address, so ``kubectl logs``
fails), and eth0's address is not reachable for the apiserver here. A host address on our
own bridge stays on this host and differs between sandboxes.

What is still shared between sandboxes: the kubelet's device-plugin socket directory
(/var/lib/kubelet/device-plugins is built into the kubelet; no device plugin runs here) and
the /var/log/containers symlinks (named by pod, namespace and container id).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client

from gpuheal_dev.sandbox import podnet
from gpuheal_dev.sandbox._proc import (
    all_pids,
    free_tcp_ports,
    kill_pids,
    pid_alive,
    proc_environ,
    stop_pid,
)
from gpuheal_dev.sandbox.kube import ControlPlane, repo_root
from gpuheal_dev.sandbox.localimage import PAUSE_IMAGE, pause_image
from gpuheal_dev.sandbox.nodes import GPU_RESOURCE, gpu_node_manifest
from gpuheal_dev.sandbox.process import SandboxError, spawn, wait_ready

log = logging.getLogger("gpuheal_dev.sandbox")

REAL_NODE_NAME = "gpu-real-0"
CNI_BIN_DIR = Path("/usr/lib/cni")
HOST_CGROUP = Path("/sys/fs/cgroup")
#: set in containerd's environment (its shims inherit it): how ``stop`` finds what it started
TAG_ENV = "GPUHEAL_REALNODE"
#: left out of the real node's labels: the kubelet sets the first three itself, and
#: ``type=kwok`` is kwok's mark of its fake nodes
_LABELS_NOT_PASSED = ("kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch", "type")
#: the kubernetes.io/k8s.io labels a kubelet may set on itself (kubelet 1.36 refuses the rest
#: of those namespaces in --node-labels, and NodeRestriction would too); e.g. the rack's
#: topology.kubernetes.io/rack is set by whoever provisions the node: here, the sandbox
_KUBELET_SETS = (
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
)


def kubelet_may_set(key: str) -> bool:
    """Whether a kubelet may give itself this label (``--node-labels``)."""
    domain = key.split("/", 1)[0] if "/" in key else ""
    restricted = any(domain == d or domain.endswith("." + d) for d in ("kubernetes.io", "k8s.io"))
    return (
        not restricted
        or key in _KUBELET_SETS
        or domain.endswith(("kubelet.kubernetes.io", "node.kubernetes.io"))
    )


def kubelet_bin() -> Path:
    """``$GPUHEAL_KUBELET``, or the cached build of ``build-cluster-bins.sh kubelet``."""
    env = os.environ.get("GPUHEAL_KUBELET")
    if env:
        return Path(env)
    root = repo_root()
    if root is None:
        raise SandboxError("kubelet not found: set GPUHEAL_KUBELET or run from a gpuheal checkout")
    out = subprocess.run(
        [str(root / "hack" / "build-cluster-bins.sh"), "kubelet"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1]) / "kubelet"


def missing_tools() -> list[str]:
    """What ``make realnode-deps`` installs and is not here."""
    need = ["containerd", "ctr", "runc"]
    missing = [t for t in need if shutil.which(t) is None]
    missing += [
        str(CNI_BIN_DIR / p)
        for p in ("bridge", "host-local", "loopback")
        if not (CNI_BIN_DIR / p).exists()
    ]
    return missing


@dataclass(frozen=True)
class RealNodeLayout:
    """Every path and name of one real node, derived from its root (so two sandboxes differ)."""

    root: Path

    @property
    def key(self) -> str:
        return hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:8]

    @property
    def run_dir(self) -> Path:
        # unix sockets must fit in 108 bytes: pytest's tmp paths do not, /run/<key> does
        return Path("/run") / f"gpuheal-{self.key}"

    @property
    def socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def state_file(self) -> Path:
        return self.root / "realnode.json"

    @property
    def cgroup_parent(self) -> str:
        return f"/gpuheal-{self.key}"

    @property
    def network(self) -> str:
        return f"gpuheal-{self.key}"

    @property
    def bridge(self) -> str:
        return f"gh{self.key}"  # 10 characters: interface names stop at 15

    @property
    def subnet(self) -> str:
        # 10.200.0.0-10.249.255.0: away from kwok's 10.0.0.0/16 and the service range
        n = int(self.key, 16)
        return f"10.{200 + n % 50}.{(n >> 8) % 256}.0/24"

    @property
    def node_ip(self) -> str:
        """The bridge's address on the host (the pods' gateway, host-local's default)."""
        return self.subnet.removesuffix("0/24") + "1"

    @property
    def host_ports_file(self) -> Path:
        """Host ports (one a line) pods reach at ``node_ip`` (``RealNode.expose_host_port``)."""
        return self.root / "host-ports"

    def log_path(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"


def containerd_config(layout: RealNodeLayout) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""\
version = 2
root = "{layout.root / "containerd" / "root"}"
state = "{layout.root / "containerd" / "state"}"
# snapshotters this machine lacks: they only log errors at start
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{layout.socket}"
[ttrpc]
  address = "{layout.socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # no CAP_SYS_RESOURCE here: runc must not try to lower a container's oom_score_adj
  restrict_oom_score_adj = true
  # network namespaces under our state directory, not /var/run/netns: ours to clean up
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{layout.cni_conf_dir}"
"""


def cni_config(layout: RealNodeLayout) -> dict[str, Any]:
    return {
        "cniVersion": "0.4.0",
        "name": layout.network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": layout.bridge,
                "isGateway": True,
                # the pods' default route: Service IPs (podnet) are off the pods' subnet
                "isDefaultGateway": True,
                # pods talk to loopback and each other only: no NAT rules on the host
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": layout.subnet}]],
                    "dataDir": str(layout.root / "cni" / "ipam"),
                },
            }
        ],
    }


def kubelet_config(layout: RealNodeLayout, ca: Path, ports: Mapping[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": layout.cgroup_parent,
        "containerRuntimeEndpoint": f"unix://{layout.socket}",
        "address": layout.node_ip,
        "port": ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports["kubelet-healthz"],
        # the apiserver reaches the kubelet (logs, exec) with its client certificate
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "podLogsDir": str(layout.pod_logs),
        # the kubelet's host-wide iptables chains (a localnet DROP rule in INPUT and OUTPUT)
        # would outlive the sandbox; nothing here needs them (no kube-proxy)
        "makeIPTablesUtilChains": False,
        "failSwapOn": False,
        "resolvConf": "/etc/resolv.conf",
        # a shared development machine: do not evict or GC over someone else's disk use
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "10s",
        "maxPods": 30,
        # pods resolve Service names through podnet's DNS server on the bridge's gateway
        "clusterDNS": [layout.node_ip],
        "clusterDomain": podnet.CLUSTER_DOMAIN,
    }


@dataclass
class RealNode:
    """The real node rooted at ``layout.root``; its state file (PIDs, ports) lets another
    process, ``gpuheal-dev sandbox down``, stop it."""

    layout: RealNodeLayout
    name: str = REAL_NODE_NAME
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    @classmethod
    def attach(cls, root: Path) -> RealNode | None:
        layout = RealNodeLayout(root)
        if not layout.state_file.exists():
            return None
        data = json.loads(layout.state_file.read_text())
        return cls(layout, name=data["name"], pids=data["pids"], ports=data["ports"])

    def _save(self) -> None:
        self.layout.state_file.write_text(
            json.dumps({"name": self.name, "pids": self.pids, "ports": self.ports}, indent=2)
        )

    @property
    def socket(self) -> Path:
        return self.layout.socket

    # ---- start ----------------------------------------------------------------------------
    def start(
        self,
        control_plane: ControlPlane,
        *,
        images: Sequence[Path] = (),
        labels: Mapping[str, str] | None = None,
        gpus: int = 8,
        timeout: float = 180,
    ) -> None:
        """containerd up, the pause image and ``images`` imported, the kubelet registered with
        the GPU node labels; returns when the node is Ready."""
        missing = missing_tools()
        if missing:
            raise SandboxError(
                f"the real node needs {', '.join(missing)}: run `make realnode-deps`"
            )
        kubelet = kubelet_bin()
        lay = self.layout
        for d in (lay.root, lay.run_dir, lay.cni_conf_dir, lay.pod_logs, lay.images):
            d.mkdir(parents=True, exist_ok=True)
        self.ports = dict(zip(("kubelet", "kubelet-healthz"), free_tcp_ports(2), strict=True))
        self._save()
        try:
            self._start_containerd()
            self.load_image(pause_image(lay.images / "pause.tar"))
            for tar in images:
                self.load_image(tar)
            self._make_cgroup_parent()
            self._make_bridge()
            self._start_kubelet(kubelet, control_plane, labels or {})
            self._start_podnet(control_plane)
            core = client.CoreV1Api(_api_client(control_plane.kubeconfig))
            self._wait_ready(core, timeout)
            # what the kubelet may not set on itself, set as a provisioner would
            provisioned = {
                k: v
                for k, v in gpu_node_manifest(self.name, labels=dict(labels or {}))["metadata"][
                    "labels"
                ].items()
                if k not in _LABELS_NOT_PASSED and not kubelet_may_set(k)
            }
            if provisioned:
                core.patch_node(
                    self.name, cast(client.V1Node, {"metadata": {"labels": provisioned}})
                )
            # Advertise the GPUs as an extended resource (the documented way for resources
            # no device plugin reports): the kubelet keeps it on every status update.
            # (allocatable too: the kubelet derives it from capacity, but only at its next
            # status update, up to 10 s later)
            gpu = {GPU_RESOURCE: str(gpus)}
            core.patch_node_status(
                self.name,
                cast(client.V1Node, {"status": {"capacity": gpu, "allocatable": gpu}}),
            )
        except BaseException:
            self.stop()
            raise

    def _start_containerd(self) -> None:
        lay = self.layout
        lay.containerd_config.parent.mkdir(parents=True, exist_ok=True)
        lay.containerd_config.write_text(containerd_config(lay))
        (lay.cni_conf_dir / "10-gpuheal.conflist").write_text(json.dumps(cni_config(lay), indent=2))
        env = {**os.environ, TAG_ENV: str(lay.root)}
        proc = spawn(
            ["containerd", f"--config={lay.containerd_config}", "--log-level=warn"],
            lay.log_path("containerd"),
            env=env,
        )
        self.pids["containerd"] = proc.pid
        self._save()
        wait_ready(
            lambda: self.ctr("version", check=False).returncode == 0,
            "containerd",
            60,
            interval=0.2,
            pid=proc.pid,
            log_path=lay.log_path("containerd"),
        )

    def _make_cgroup_parent(self) -> None:
        """The kubelet wants its cgroupRoot to exist in every hierarchy; cpuset needs the
        parent's cpus and mems copied, or no process can join a cgroup below it."""
        for hierarchy in _v1_hierarchies():
            path = hierarchy / self.layout.cgroup_parent.lstrip("/")
            path.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (path / name).exists() and not (path / name).read_text().strip():
                    (path / name).write_text((hierarchy / name).read_text())

    def _make_bridge(self) -> None:
        """The CNI bridge with its gateway address, before the first pod: the kubelet's
        address (the bridge plugin takes an existing bridge and address as they are)."""
        lay = self.layout
        for argv in (
            ["ip", "link", "add", "name", lay.bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{lay.node_ip}/24", "dev", lay.bridge],
            ["ip", "link", "set", lay.bridge, "up"],
        ):
            out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
            if out.returncode != 0 and "File exists" not in out.stderr:
                raise SandboxError(f"{' '.join(argv)}: {out.stderr.strip()}")
        # packets from pods may be sent on to 127.0.0.1 (podnet: the API server, slurmrestd);
        # this bridge's setting only, gone with it
        Path(f"/proc/sys/net/ipv4/conf/{lay.bridge}/route_localnet").write_text("1\n")

    def _start_kubelet(
        self, kubelet: Path, control_plane: ControlPlane, labels: Mapping[str, str]
    ) -> None:
        from gpuheal_dev.sandbox.pki import issue_client_cert

        lay = self.layout
        pki = control_plane.pki
        cert = f"kubelet-{self.name}"
        # the Node authorizer's user for this node: it may write its own Node and Lease only
        issue_client_cert(pki, cert, f"system:node:{self.name}", ("system:nodes",))
        control_plane.write_cert_kubeconfig(lay.kubeconfig, cert)
        lay.kubelet_config.write_text(
            yaml.safe_dump(kubelet_config(lay, pki.ca.cert, self.ports), sort_keys=False)
        )
        node_labels = {
            k: v
            for k, v in gpu_node_manifest(self.name, labels=dict(labels))["metadata"][
                "labels"
            ].items()
            if k not in _LABELS_NOT_PASSED and kubelet_may_set(k)
        }
        proc = spawn(
            [
                str(kubelet),
                f"--config={lay.kubelet_config}",
                f"--kubeconfig={lay.kubeconfig}",
                f"--root-dir={lay.kubelet_dir}",
                # its self-signed serving certificate: else /var/lib/kubelet/pki, shared
                f"--cert-dir={lay.kubelet_dir / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={lay.node_ip}",
                "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(node_labels.items())),
                "--v=1",
            ],
            lay.log_path("kubelet"),
            env={**os.environ, TAG_ENV: str(lay.root)},
        )
        self.pids["kubelet"] = proc.pid
        self._save()

    def _start_podnet(self, control_plane: ControlPlane) -> None:
        """Services and cluster DNS for the pods (``podnet``)."""
        lay = self.layout
        lay.host_ports_file.touch()
        argv = [
            sys.executable, "-m", "gpuheal_dev.sandbox.podnet",
            f"--kubeconfig={control_plane.kubeconfig}", f"--key={lay.key}",
            f"--bridge={lay.bridge}", f"--subnet={lay.subnet}",
            f"--gateway={lay.node_ip}", f"--host-ports-file={lay.host_ports_file}",
        ]  # fmt: skip
        proc = spawn(
            argv,
            lay.log_path("podnet"),
            env={**os.environ, TAG_ENV: str(lay.root)},
        )
        self.pids["podnet"] = proc.pid
        self._save()

    def expose_host_port(self, port: int) -> str:
        """Let pods reach the host's ``127.0.0.1:port`` at ``<node_ip>:port``; returns that
        address (e.g. slurmrestd's, for the in-cluster bridge)."""
        ports = set(podnet.read_ports(self.layout.host_ports_file)) | {port}
        self.layout.host_ports_file.write_text("".join(f"{p}\n" for p in sorted(ports)))
        return f"{self.layout.node_ip}:{port}"

    def _wait_ready(self, core: client.CoreV1Api, timeout: float) -> None:
        def ready() -> bool:
            node = core.read_node(self.name)
            conds = (node.status.conditions if node.status else None) or []
            return any(c.type == "Ready" and c.status == "True" for c in conds)

        wait_ready(
            ready,
            f"real node {self.name} Ready",
            timeout,
            interval=0.5,
            pid=self.pids["kubelet"],
            log_path=self.layout.log_path("kubelet"),
        )

    # ---- images ---------------------------------------------------------------------------
    def ctr(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd, in the CRI's namespace (k8s.io)."""
        result = subprocess.run(
            ["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise SandboxError(f"ctr {' '.join(args)}: {result.stderr.strip()}")
        return result

    def load_image(self, tar: Path) -> None:
        """Import an image tar (docker-archive or OCI layout, as ``docker save`` or buildah
        write them) into this node's containerd: pods then run it with
        ``imagePullPolicy: Never`` (or IfNotPresent), no registry involved."""
        if not tar.is_file():
            raise SandboxError(f"load_image: {tar} is not a file")
        self.ctr("images", "import", str(tar), timeout=600)

    # ---- stop -----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the kubelet, every container and containerd; remove mounts, network
        namespaces, the bridge, the cgroups and the sockets. Safe to call again."""
        lay = self.layout
        if (pid := self.pids.pop("kubelet", None)) is not None:
            stop_pid(pid, {"kubelet"})
        if (pid := self.pids.pop("podnet", None)) is not None:
            stop_pid(pid, {"python", "python3", Path(os.path.realpath(sys.executable)).name})
        containerd = self.pids.get("containerd")
        if containerd is not None and pid_alive(containerd):
            self._remove_containers()
        if (pid := self.pids.pop("containerd", None)) is not None:
            stop_pid(pid, {"containerd"})
        # What outlived that (a shim whose task would not die, a container process): ours by
        # the tag in its environment or by its cgroup.
        left = kill_pids(self.processes())
        if left:
            log.error("real node: processes %s survived SIGKILL", left)
        self._unmount_all()
        podnet.cleanup(lay.key, lay.bridge)  # again: a podnet killed had no time to
        subprocess.run(
            ["ip", "link", "delete", lay.bridge], capture_output=True, check=False, timeout=30
        )
        self._remove_cgroups()
        with contextlib.suppress(FileNotFoundError):
            for link in Path("/var/log/containers").iterdir():
                if link.is_symlink() and str(lay.pod_logs) in os.readlink(link):
                    link.unlink()
        for cached in Path("/var/lib/cni/results").glob(f"{lay.network}-*"):
            cached.unlink(missing_ok=True)
        shutil.rmtree(lay.run_dir, ignore_errors=True)
        if lay.state_file.exists():
            self._save()

    def _remove_containers(self) -> None:
        tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "--all", "--signal=SIGKILL", task, check=False)
        for task in tasks:
            self.ctr("tasks", "delete", "--force", task, check=False)
        containers = self.ctr("containers", "ls", "-q", check=False).stdout.split()
        if containers:
            self.ctr("containers", "delete", *containers, check=False)

    def processes(self) -> list[int]:
        """Live processes of this node: containerd, its shims, the kubelet (by the tag in their
        environment) and every process in its pods' cgroups."""
        lay = self.layout
        found = []
        marker = f":{lay.cgroup_parent}/"
        for pid in all_pids():
            if pid == os.getpid() or not pid_alive(pid):
                continue
            env = proc_environ(pid)
            if env is not None and env.get(TAG_ENV) == str(lay.root):
                found.append(pid)
                continue
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{pid}/cgroup").read_text():
                    found.append(pid)
        return found

    def _unmount_all(self) -> None:
        roots = (str(self.layout.root.resolve()) + "/", str(self.layout.run_dir) + "/")
        mounts = [
            line.split()[1].replace("\\040", " ")
            for line in Path("/proc/self/mounts").read_text().splitlines()
        ]
        for mnt in sorted({m for m in mounts if m.startswith(roots)}, key=len, reverse=True):
            # lazy: a mount still busy (a dying process) goes when it is let go
            subprocess.run(["umount", "-l", mnt], capture_output=True, check=False, timeout=30)

    def _remove_cgroups(self) -> None:
        for hierarchy in _v1_hierarchies(with_unified=True):
            top = hierarchy / self.layout.cgroup_parent.lstrip("/")
            if not top.is_dir():
                continue
            dirs = [Path(d) for d, _, _ in os.walk(top)]
            for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()

    def cgroups_left(self) -> list[Path]:
        return [
            p
            for h in _v1_hierarchies(with_unified=True)
            if (p := h / self.layout.cgroup_parent.lstrip("/")).exists()
        ]

    def mounts_left(self) -> list[str]:
        roots = (str(self.layout.root.resolve()) + "/", str(self.layout.run_dir) + "/")
        return [
            line.split()[1]
            for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(roots)
        ]


def _v1_hierarchies(*, with_unified: bool = False) -> list[Path]:
    """The mounted cgroup v1 hierarchies (cpu, memory, pids, ..., the named systemd one);
    ``with_unified``: also a hybrid host's cgroup v2 tree (``/sys/fs/cgroup/unified``), where
    the kubelet makes its cgroupRoot too (left behind by every sandbox until this was looked
    at: 212 on this machine)."""
    kinds = ("cgroup", "cgroup2") if with_unified else ("cgroup",)
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] in kinds and parts[1].startswith(str(HOST_CGROUP)):
            found.append(Path(parts[1]))
    return found


def _api_client(kubeconfig: Path) -> client.ApiClient:
    from kubernetes import config

    load: Any = config.new_client_from_config
    return cast(client.ApiClient, load(config_file=str(kubeconfig)))
