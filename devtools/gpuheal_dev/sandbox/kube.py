"""A real Kubernetes control plane as local processes: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (which plays the kubelets of fake GPU nodes).

The binaries are upstream's, built from pinned Go modules by ``hack/build-cluster-bins.sh``;
this is the envtest / kwok "binary runtime" approach, for machines without Docker.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuheal_dev.sandbox._proc import free_tcp_ports, pid_alive, stop_pid
from gpuheal_dev.sandbox.pki import Pki, create_pki, issue_client_cert
from gpuheal_dev.sandbox.process import SandboxError, spawn, wait_ready

log = logging.getLogger("gpuheal_dev.sandbox")

# Nodes carrying this annotation are the ones kwok acts as kubelet for.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
KUBELET_CLIENT = "apiserver-kubelet-client"
_COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
#: DRA device taints as 1.36 has them: ResourceSlice taints are beta and on by default
#: (DRADeviceTaints), DeviceTaintRule is beta but off (DRADeviceTaintRules) and served only as
#: resource.k8s.io/v1beta2, an API off by default. The gate goes to the apiserver (the API and
#: its RBAC), the scheduler (it honours a rule's NoSchedule) and kube-controller-manager (its
#: device-taint-eviction controller reads the rules for NoExecute). Flags only: nothing starts
#: slower for them (pkg/features/kube_features.go, pkg/registry/resource/rest, v1.36.3).
DRA_FEATURE_GATES = "--feature-gates=DRADeviceTaintRules=true"
DRA_RUNTIME_CONFIG = "--runtime-config=resource.k8s.io/v1beta2=true"


def repo_root() -> Path | None:
    """The source checkout this module runs from, if any (the sandbox is dev tooling)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "hack" / "build-cluster-bins.sh").exists():
            return parent
    return None


def cluster_bin_dir() -> Path:
    """Directory with the cluster binaries: ``$GPUHEAL_BIN_DIR`` or the cached hack/ build."""
    env = os.environ.get("GPUHEAL_BIN_DIR")
    if env:
        return Path(env)
    root = repo_root()
    if root is None:
        raise SandboxError(
            "cluster binaries not found: set GPUHEAL_BIN_DIR or run from a gpuheal checkout"
        )
    out = subprocess.run(
        [str(root / "hack" / "build-cluster-bins.sh")],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class ControlPlane:
    """The control plane rooted at ``root``; its state file lets another process stop it."""

    root: Path
    bin_dir: Path
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    #: the API server writes an audit log (every request, Metadata level) to `audit_log_path`:
    #: for tests that compare what a client did with what RBAC grants it. Off by default.
    audit: bool = False

    @property
    def pki(self) -> Pki:
        return create_pki(self.root / "pki")

    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    @property
    def state_file(self) -> Path:
        return self.root / "control-plane.json"

    @property
    def audit_log_path(self) -> Path:
        return self.root / "logs" / "audit.jsonl"

    def _audit_flags(self) -> list[str]:
        if not self.audit:
            return []
        policy = self.root / "audit-policy.yaml"
        policy.write_text(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\n"
            "omitStages: [RequestReceived]\nrules:\n  - level: Metadata\n"
        )
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log_path}",
            "--audit-log-format=json",
            # Written as requests finish, not batched: a test reads it right after.
            "--audit-log-mode=blocking",
        ]

    def log_path(self, component: str) -> Path:
        return self.root / "logs" / f"{component}.log"

    def bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    # ---- lifecycle --------------------------------------------------------------------
    @classmethod
    def load(cls, root: Path) -> ControlPlane | None:
        state = root / "control-plane.json"
        if not state.exists():
            return None
        data = json.loads(state.read_text())
        return cls(root=root, bin_dir=Path(data["bin_dir"]), ports=data["ports"], pids=data["pids"])

    def _save(self) -> None:
        self.state_file.write_text(
            json.dumps(
                {"bin_dir": str(self.bin_dir), "ports": self.ports, "pids": self.pids}, indent=2
            )
        )

    def running(self) -> dict[str, bool]:
        return {name: pid_alive(pid) for name, pid in self.pids.items()}

    def start(self, *, progress: bool = True) -> None:
        on_disk = ControlPlane.load(self.root)
        if any(self.running().values()) or (on_disk and any(on_disk.running().values())):
            raise SandboxError(
                f"a sandbox under {self.root.parent} is running: `gpuheal-dev sandbox down` first"
            )
        t0 = time.monotonic()

        def step(msg: str) -> None:
            if progress:
                log.info("[sandbox %5.1fs] %s", time.monotonic() - t0, msg)

        self.root.mkdir(parents=True, exist_ok=True)
        names = ("etcd", "etcd-peer", *_COMPONENTS[1:])
        self.ports = dict(zip(names, free_tcp_ports(len(names)), strict=True))
        pki = self.pki
        self._write_component_kubeconfigs(pki)
        self._save()
        try:
            self._start_etcd()
            step(f"etcd up on 127.0.0.1:{self.ports['etcd']}")
            self._start_apiserver(pki)
            step(f"kube-apiserver up at {self.server}")
            self._start_controller_manager(pki)
            self._start_scheduler()
            self._start_kwok()
            self._wait_healthz("kube-controller-manager")
            self._wait_healthz("kube-scheduler")
            step("kube-controller-manager, kube-scheduler, kwok up")
            self._wait_default_service_account()
            step("default ServiceAccount present: ready")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for name in reversed(_COMPONENTS):
            pid = self.pids.get(name)
            if pid is not None:
                stop_pid(pid, {name})
        self.pids.clear()
        if self.state_file.exists():
            self._save()

    def stop_component(self, name: str) -> None:
        """Stop one component (SIGTERM, then SIGKILL after 10 s); the others keep running.
        A fault for tests: `start_component` brings it back on the same port."""
        pid = self.pids.pop(name, None)
        if pid is not None:
            stop_pid(pid, {name})
            self._save()

    def start_component(self, name: str) -> None:
        """Start a component stopped by `stop_component` again, with the same ports,
        certificates and (for etcd) the data it had: a restart, not a new cluster."""
        if name == "etcd":
            self._start_etcd(keep_data=True)
        elif name == "kube-apiserver":
            self._start_apiserver(self.pki)
        else:
            raise SandboxError(f"start_component: {name} is not etcd or kube-apiserver")

    # ---- components -------------------------------------------------------------------
    def _launch(self, name: str, argv: list[str]) -> int:
        proc = spawn(argv, self.log_path(name))
        self.pids[name] = proc.pid
        self._save()
        return proc.pid

    def _start_etcd(self, *, keep_data: bool = False) -> None:
        data = self.root / "etcd-data"
        if not keep_data:
            shutil.rmtree(data, ignore_errors=True)
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        pid = self._launch(
            "etcd",
            [
                self.bin("etcd"),
                f"--data-dir={data}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                # A throwaway store: fsync buys durability we do not want to pay for.
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--quota-backend-bytes=4294967296",
            ],
        )
        wait_ready(
            lambda: _http_ok(f"{client}/health"),
            "etcd",
            30,
            log_path=self.log_path("etcd"),
            pid=pid,
        )

    def _start_apiserver(self, pki: Pki) -> None:
        pid = self._launch(
            "kube-apiserver",
            [
                self.bin("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports['kube-apiserver']}",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={pki.sa_public_key}",
                f"--service-account-signing-key-file={pki.sa_private_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                # what the apiserver shows a real kubelet (logs, exec: the real node's)
                f"--kubelet-client-certificate={pki.client(KUBELET_CLIENT).cert}",
                f"--kubelet-client-key={pki.client(KUBELET_CLIENT).key}",
                # node names (the default's first choice) resolve nowhere here
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--profiling=false",
                # Benchmarks create 1,000s of nodes and watch them: lift the default in-flight caps.
                "--max-requests-inflight=2000",
                "--max-mutating-requests-inflight=1000",
                DRA_FEATURE_GATES,
                DRA_RUNTIME_CONFIG,
                "--v=1",
                *self._audit_flags(),
            ],
        )
        wait_ready(
            lambda: self._https_ok(f"{self.server}/readyz"),
            "kube-apiserver",
            120,
            interval=0.25,
            log_path=self.log_path("kube-apiserver"),
            pid=pid,
        )

    def _start_controller_manager(self, pki: Pki) -> None:
        kc = str(self.root / "kube-controller-manager.kubeconfig")
        self._launch(
            "kube-controller-manager",
            [
                self.bin("kube-controller-manager"),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['kube-controller-manager']}",
                f"--service-account-private-key-file={pki.sa_private_key}",
                f"--root-ca-file={pki.ca.cert}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--leader-elect=false",
                DRA_FEATURE_GATES,
                "--v=1",
            ],
        )

    def _start_scheduler(self) -> None:
        kc = str(self.root / "kube-scheduler.kubeconfig")
        self._launch(
            "kube-scheduler",
            [
                self.bin("kube-scheduler"),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['kube-scheduler']}",
                "--leader-elect=false",
                DRA_FEATURE_GATES,
                "--v=1",
            ],
        )

    def _start_kwok(self) -> None:
        self._launch(
            "kwok",
            [
                self.bin("kwok"),
                f"--config={Path(__file__).parent / 'data' / 'kwok-stages.yaml'}",
                f"--kubeconfig={self.root / 'kwok.kubeconfig'}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}",
                "--cidr=10.0.0.0/16",
                "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{self.ports['kwok']}",
            ],
        )

    def _wait_healthz(self, name: str) -> None:
        wait_ready(
            lambda: self._https_ok(f"https://127.0.0.1:{self.ports[name]}/healthz", verify=False),
            name,
            60,
            interval=0.25,
            log_path=self.log_path(name),
            pid=self.pids[name],
        )

    def _wait_default_service_account(self) -> None:
        # A GET from this process, not `kubectl get`: the controller takes seconds to make it,
        # and a kubectl per poll was most of the test suite's ~1,200 kubectl starts.
        url = f"{self.server}/api/v1/namespaces/default/serviceaccounts/default"
        wait_ready(lambda: self._https_ok(url), "ServiceAccount controller", 60, interval=0.25)

    # ---- clients ----------------------------------------------------------------------
    def _ssl_context(self, *, verify: bool = True) -> ssl.SSLContext:
        pki = self.pki
        ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
        if not verify:  # controller-manager/scheduler serve self-signed certs of their own
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        admin = pki.client("admin")
        ctx.load_cert_chain(str(admin.cert), str(admin.key))
        return ctx

    def _https_ok(self, url: str, *, verify: bool = True) -> bool:
        with urllib.request.urlopen(url, context=self._ssl_context(verify=verify), timeout=5) as r:  # noqa: S310 - our own loopback URL
            return bool(r.status == 200)

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.bin("kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        result = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=120, check=False
        )
        if check and result.returncode != 0:
            raise SandboxError(f"{' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def _write_component_kubeconfigs(self, pki: Pki) -> None:
        issue_client_cert(pki, "admin", "gpuheal-admin", ("system:masters",))
        issue_client_cert(pki, KUBELET_CLIENT, "kube-apiserver-kubelet-client", ("system:masters",))
        self.write_cert_kubeconfig(self.kubeconfig, "admin")
        for name, user in (
            ("kube-controller-manager", "system:kube-controller-manager"),
            ("kube-scheduler", "system:kube-scheduler"),
        ):
            issue_client_cert(pki, name, user)
            self.write_cert_kubeconfig(self.root / f"{name}.kubeconfig", name)
        # kwok plays thousands of kubelets; admin rights keep its node+lease writes simple.
        self.write_cert_kubeconfig(self.root / "kwok.kubeconfig", "admin")

    def write_cert_kubeconfig(self, path: Path, cert_name: str) -> Path:
        cert = self.pki.client(cert_name)
        return _write_kubeconfig(
            path,
            self.server,
            self.pki.ca.cert,
            {"client-certificate": str(cert.cert), "client-key": str(cert.key)},
        )

    def kubeconfig_for_user(self, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig authenticating as ``user`` in ``groups`` by client certificate."""
        name = "user-" + user.replace(":", "-")
        issue_client_cert(self.pki, name, user, groups)
        return self.write_cert_kubeconfig(self.root / "kubeconfigs" / f"{name}.kubeconfig", name)

    def kubeconfig_for_service_account(
        self,
        namespace: str,
        name: str,
        *,
        duration_seconds: int = 3600,
        bound_pod: str | None = None,
    ) -> Path:
        """A kubeconfig with a TokenRequest token of ``namespace/name``; with ``bound_pod`` (a
        pod of that namespace), the token bound to it, exactly what the kubelet mounts in the
        pod: its user then carries the pod's node (`authentication.kubernetes.io/node-name`)."""
        bound = ["--bound-object-kind=Pod", f"--bound-object-name={bound_pod}"] if bound_pod else []
        out = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration_seconds}s", *bound
        )
        suffix = f"-{bound_pod}" if bound_pod else ""
        path = self.root / "kubeconfigs" / f"sa-{namespace}-{name}{suffix}.kubeconfig"
        return _write_kubeconfig(path, self.server, self.pki.ca.cert, {"token": out.stdout.strip()})


def _write_kubeconfig(path: Path, server: str, ca: Path, user: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "sandbox", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": "user"}}],
        "current-context": "sandbox",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - our own loopback URL
        return bool(r.status == 200)
