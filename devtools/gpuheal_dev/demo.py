"""`make demo`: an XID 79 on the node running a Slurm training job; gpuheal cordons the node,
drains it in Slurm and requeues the job, evicts its pods and brings a spare from the
ReservePool into service; the job trains again from its last checkpoint.

The fault does to the job what a real one does (``DemoSettings.fault``): ``dies`` (the
default: the GPU falls off the bus and the CUDA process fails at once, so the job is FAILED
before gpuheal acts; gpuheal requeues it as the fault's victim and it resumes from its last
*interval* checkpoint, the steps since then lost), ``hangs`` (the process is stuck in the
driver and ignores the checkpoint signal and SIGTERM; Slurm's SIGKILL gets it off the node) or
``gentle`` (the GPUs are fine: the job checkpoints on the signal and on SIGTERM, nothing lost).

Everything is real and local: the sandbox (kube-apiserver + kwok GPU nodes, Slurm 26.05, the
sandbox's default, with the same node names), the Slurm bridge and the operator as processes
(`gpuheal-slurm-bridge`, `gpuheal run`), the NumPy training job under sbatch. The demo only
sets the scene, injects the fault (what `gpuheal simulate xid` does) and watches: every step
below is printed when the demo *sees* it in the world (Node, NodeRemediation, pods, `sinfo`,
`scontrol show job`, the job's own metrics), with its time from the fault.

:class:`Demo` is also what ``tests/integration/test_demo_acceptance.py`` drives, so the test
checks the very flow ``make demo`` shows.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import yaml

from gpuheal.api.names import CLAIMED_BY_LABEL, CORDONED_BY_ANNOTATION, EventReason
from gpuheal.cli.simulate import kernel_line, simulate_xid
from gpuheal_dev.demo_job import METRICS_FILE, ModelConfig, RunConfig, write_sbatch
from gpuheal_dev.demo_job.metrics import MetricsTail, Record, describe, read_records
from gpuheal_dev.demo_job.slurm import JobInfo, job_info, submit
from gpuheal_dev.sandbox import Sandbox, SandboxConfig
from gpuheal_dev.sandbox._proc import free_tcp_ports, pid_alive
from gpuheal_dev.sandbox.faults import FakeGpus, GpuState
from gpuheal_dev.sandbox.process import spawn
from gpuheal_dev.sandbox.slurmroot import DEFAULT_SLURM
from gpuheal_dev.timeline import Timeline, build_timeline, incident_report, job_events, render_png

REPO = Path(__file__).resolve().parents[2]
# The demo ladder's per-step Events, left out of the closing Event listing (the timeline
# shows the steps already).
STEP_EVENT_REASONS = (
    EventReason.CORDONED,
    EventReason.SLURM_DRAINED,
    EventReason.DRAINED,
    EventReason.REPLACEMENT_CLAIMED,
)
EXAMPLES = REPO / "examples"
GROUP, VERSION = "gpuheal.io", "v1alpha1"
# The operator's own objects (its Lease); the sandbox has no gpuheal-system namespace.
NAMESPACE = "default"
WORKLOAD_NS = "default"
POOL_LABEL = "gpuheal.io/pool"
SPARE_TAINT = "gpuheal.io/spare"
TRAINER = "trainer"
XID = 79
#: What the fault does to the job: the GPU state the demo sets on its node (None: nothing).
FAULTS: dict[str, GpuState | None] = {
    "dies": GpuState.LOST,
    "hangs": GpuState.HUNG,
    "gentle": None,
}

Out = Callable[[str], None]


class DemoFailed(RuntimeError):
    """A part of the story did not happen in time; the message says which."""


@dataclass(frozen=True)
class DemoSettings:
    """The knobs of one run. The defaults are what ``make demo`` uses (~1 min of training)."""

    steps: int = 300
    ckpt_every: int = 20
    step_seconds: float = 0.1
    seed: int = 0
    #: interval checkpoints to wait for before the fault
    checkpoints_before_fault: int = 2
    policy: Path = EXAMPLES / "demo-policy.yaml"
    pool: Path = EXAMPLES / "reservepool.yaml"
    #: seconds between looks at the world while following the incident
    poll: float = 0.15
    incident_timeout: float = 150.0
    operator_retry_interval: float = 1.0
    #: dies (the job's process fails with its GPU), hangs, or gentle (see the module doc)
    fault: str = "dies"

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(FAULTS)}, not {self.fault!r}")

    def model(self) -> ModelConfig:
        return ModelConfig(seed=self.seed)

    def run(self, workdir: Path) -> RunConfig:
        return RunConfig(
            workdir=workdir,
            steps=self.steps,
            ckpt_every=self.ckpt_every,
            step_seconds=self.step_seconds,
        )


# ---- what the demo looks at each tick (plain values, so the checks below are pure) ---------


@dataclass(frozen=True)
class NodeFacts:
    unschedulable: bool
    labels: dict[str, str]
    annotations: dict[str, str]
    taints: list[str]  # keys


@dataclass(frozen=True)
class PodFacts:
    name: str
    node: str | None
    phase: str
    deleting: bool


@dataclass(frozen=True)
class SlurmNode:
    state: str  # sinfo %T: idle, allocated, mixed, drained, draining, ...
    reason: str


@dataclass(frozen=True)
class Snapshot:
    #: when each part was read (its answer arrived): "nodes", "incidents", "pods", "slurm", "job"
    at: dict[str, float]
    nodes: dict[str, NodeFacts]
    incidents: list[dict[str, Any]]
    pods: list[PodFacts]
    slurm: dict[str, SlurmNode]
    job: JobInfo | None


@dataclass(frozen=True)
class Scene:
    """Who is who in this run."""

    broken: str
    spare: str
    job_id: int
    pods_on_broken: frozenset[str]


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def incident_on(snap: Snapshot, node: str) -> dict[str, Any] | None:
    found = [i for i in snap.incidents if i.get("spec", {}).get("nodeName") == node]
    return found[0] if found else None


Check = Callable[[Snapshot, Scene], str | None]


def _detected(s: Snapshot, sc: Scene) -> str | None:
    inc = incident_on(s, sc.broken)
    if inc is None:
        return None
    rung = (inc.get("spec", {}).get("ladder") or [{}])[0].get("name", "?")
    return f"{inc['metadata']['name']}: rule {inc['spec']['rule']}, rung {rung}"


def _cordoned(s: Snapshot, sc: Scene) -> str | None:
    n = s.nodes.get(sc.broken)
    if n is None or not n.unschedulable:
        return None
    by = n.annotations.get(CORDONED_BY_ANNOTATION)
    return f"{sc.broken} unschedulable, cordoned-by {by}" if by else None


def _slurm_drained(s: Snapshot, sc: Scene) -> str | None:
    n = s.slurm.get(sc.broken)
    if n is None or "drain" not in n.state or not n.reason.startswith("gpuheal:"):
        return None
    return f"{sc.broken} {n.state}: '{n.reason}'"


def _requeued(s: Snapshot, sc: Scene) -> str | None:
    j = s.job
    if j is None or j.restarts < 1:
        return None
    return f"job {j.job_id} back in the queue (Restarts={j.restarts})"


def _job_failed(s: Snapshot, sc: Scene) -> str | None:
    j = s.job
    if j is None or j.restarts > 0 or j.state != "FAILED":
        return None
    return f"job {j.job_id} FAILED in Slurm, which does not requeue it (Restarts=0)"


def _job_waits(s: Snapshot, sc: Scene) -> str | None:
    j = s.job
    if j is None or j.restarts < 1 or j.state != "PENDING" or j.reason != "Resources":
        return None
    return f"job {j.job_id} PENDING (Resources), {j.excluded} excluded, others busy"


def _pods_evicted(s: Snapshot, sc: Scene) -> str | None:
    if not sc.pods_on_broken:
        return None
    live = {p.name for p in s.pods if p.name in sc.pods_on_broken and not p.deleting}
    if live:
        return None
    return f"{', '.join(sorted(sc.pods_on_broken))} (Eviction API)"


def _spare_claimed(s: Snapshot, sc: Scene) -> str | None:
    n = s.nodes.get(sc.spare)
    if n is None or not n.labels.get(CLAIMED_BY_LABEL):
        return None
    taint = "taint removed" if SPARE_TAINT not in n.taints else "taint still on"
    return f"{sc.spare}: pool={n.labels.get(POOL_LABEL)}, {taint}"


def _spare_in_slurm(s: Snapshot, sc: Scene) -> str | None:
    n = s.slurm.get(sc.spare)
    if n is None or "drain" in n.state or "down" in n.state:
        return None
    return f"{sc.spare} {n.state} in Slurm"


def _running_again(s: Snapshot, sc: Scene) -> str | None:
    j = s.job
    if j is None or j.restarts < 1 or j.state != "RUNNING":
        return None
    return f"job {j.job_id} RUNNING on {j.batch_host or j.nodes}"


def _pod_rescheduled(s: Snapshot, sc: Scene) -> str | None:
    on_spare = [p for p in s.pods if p.node == sc.spare and p.phase == "Running"]
    return f"{on_spare[0].name} Running on {sc.spare}" if on_spare else None


def _completed(s: Snapshot, sc: Scene) -> str | None:
    inc = incident_on(s, sc.broken)
    c = _condition(inc, "Completed") if inc else None
    if inc is None or c is None or c.get("status") != "True":
        return None
    return f"Completed={c.get('reason')}, replacement {inc['status'].get('replacementNode')}"


#: What the demo waits to see after the fault, in story order (names as gpuheal_dev.timeline's).
MILESTONES: tuple[tuple[str, Check, str], ...] = (  # (name, check, what it reads)
    ("detected", _detected, "incidents"),
    ("cordoned", _cordoned, "nodes"),
    ("slurm drained", _slurm_drained, "slurm"),
    ("requeued", _requeued, "job"),
    ("pods evicted", _pods_evicted, "pods"),
    ("spare claimed", _spare_claimed, "nodes"),
    ("spare resumed in Slurm", _spare_in_slurm, "slurm"),
    ("job running again", _running_again, "job"),
    ("pod rescheduled", _pod_rescheduled, "pods"),
    ("incident completed", _completed, "incidents"),
)
#: Shown when seen, not waited for (the spare may come before the job waits for it).
OPTIONAL: tuple[tuple[str, Check, str], ...] = (
    ("job FAILED", _job_failed, "job"),
    ("job waits for a node", _job_waits, "job"),
)
#: Printed, but left out of the PNG so that its rows stay readable.
NOT_IN_PNG = frozenset(
    {"job waits for a node", "job stopped", "spare resumed in Slurm", "pod rescheduled",
     "incident completed"}
)  # fmt: skip


def job_milestone(rec: Record, fault_at: float) -> tuple[str, str] | None:
    """A job record that is a step of the story (after the fault): name and detail."""
    if float(rec["time"]) < fault_at:
        return None
    ev = rec["event"]
    if ev == "gpu_error":
        return "job died with its GPU", f"step {rec['step']}: {rec.get('error')}; exit 1"
    if ev == "gpu_hang":
        return "job hung in the driver", f"step {rec['step']}: deaf to SIGUSR1/SIGTERM"
    if ev == "checkpoint" and rec.get("reason") == "SIGUSR1":
        return "checkpoint on signal", f"step {rec['step']} saved on SIGUSR1 from the bridge"
    if ev == "exit":
        return "job stopped", f"{rec.get('reason')} (requeue): saved step {rec.get('step')}, exit"
    return None


# ---- the run -------------------------------------------------------------------------------


@dataclass
class DemoResult:
    broken: str
    spare: str
    job_id: int
    incident: str
    workdir: Path
    png: Path
    events: list[tuple[str, float, str]]
    job: JobInfo
    timeline: Timeline
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def missing(self) -> list[str]:
        return self.timeline.missing

    @property
    def ok(self) -> bool:
        return not self.missing and self.job.state == "COMPLETED" and self.job.restarts == 1


def _clock(at: float) -> str:
    return dt.datetime.fromtimestamp(at, tz=dt.UTC).strftime("%H:%M:%S.%f")[:-3]


class Demo:
    """Sandbox + bridge + operator + workload; ``run()`` tells the story, ``close()`` (or the
    ``with`` block's end) tears everything down, also after a failure or Ctrl-C."""

    def __init__(self, root: Path, settings: DemoSettings | None = None, out: Out = print):
        self.root = root
        self.settings = settings or DemoSettings()
        self.out = out
        self.sandbox: Sandbox | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = root / "logs"
        self.workdir = root / "job"
        self.png = root / "incident-timeline.png"
        self.t_start = time.monotonic()
        self.bridge_url = ""
        self.token_file = root / "bridge" / "operator-token"
        self.extra_jobs: list[int] = []
        self.tail = MetricsTail(self.workdir / METRICS_FILE)
        self.gpus = FakeGpus(root / "gpus")
        #: the job started again after the fault (its ``start`` record was seen)
        self.resumed = False
        self.losses: collections.deque[float] = collections.deque(maxlen=20)

    # -- context ---------------------------------------------------------------------------
    def __enter__(self) -> Demo:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def say(self, line: str = "") -> None:
        self.out(line)

    def phase(self, n: int, title: str) -> None:
        self.say(f"\n[{n}/6] {title}   ({time.monotonic() - self.t_start:.0f} s)")

    # -- objects ---------------------------------------------------------------------------
    @property
    def sb(self) -> Sandbox:
        assert self.sandbox is not None, "sandbox not up"
        return self.sandbox

    @property
    def slurm(self) -> Any:
        return self.sb.slurm

    def apis(self) -> tuple[Any, Any, Any, Any]:
        from kubernetes import client

        api = self.sb.api_client()
        return (
            client.CoreV1Api(api),
            client.CustomObjectsApi(api),
            client.AppsV1Api(api),
            client.PolicyV1Api(api),
        )

    # -- 1: sandbox ------------------------------------------------------------------------
    def start_sandbox(self) -> None:
        self.phase(1, f"sandbox: kube-apiserver v1.36.3 + kwok GPU nodes, Slurm {DEFAULT_SLURM}")
        for stale in (self.workdir, self.logs, self.root / "bridge", self.gpus.root, self.png):
            if stale.is_dir():
                shutil.rmtree(stale)
            elif stale.exists():
                stale.unlink()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.gpus.root.mkdir(parents=True, exist_ok=True)
        self.say("  starting etcd, kube-apiserver, controller-manager, scheduler, kwok, Slurm ...")
        quiet = logging.getLogger("gpuheal_dev.sandbox")
        level = quiet.level
        quiet.setLevel(logging.WARNING)
        try:
            self.sandbox = Sandbox.up(
                SandboxConfig(root=self.root, gpu_nodes=4, spare_nodes=1, slurm=True)
            )
        finally:
            quiet.setLevel(level)
        cfg = self.sb.config
        self.say(f"  up in {self.sb.timings.get('total_s', 0):.1f} s")
        self.say(
            f"  GPU nodes {', '.join(cfg.node_names)}, spare {', '.join(cfg.spare_names)};"
            " 8 GPUs each; the same names in Slurm"
        )
        self.say(f"  KUBECONFIG={self.sb.kubeconfig}")
        self.say(f"  SLURM_CONF={self.slurm.conf_path} ({self.slurm.version()})")

    # -- 2: gpuheal ------------------------------------------------------------------------
    def start_gpuheal(self) -> None:
        self.phase(2, "gpuheal: Slurm bridge, operator, policy, reserve pool")
        core, custom, _, _ = self.apis()
        self.sb.kubectl("apply", "-f", str(REPO / "crds"))
        crds = [f"crd/{p}.gpuheal.io" for p in ("noderemediations", "remediationpolicies",
                                                "reservepools")]  # fmt: skip
        self.sb.kubectl("wait", "--for=condition=Established", *crds, "--timeout=60s")
        # Both start at once (Python start-up is the slow part on a busy machine).
        self._start_bridge()
        health = self._start_operator()
        self._prepare_spare(core)
        for path, plural in ((self.settings.pool, "reservepools"),
                             (self.settings.policy, "remediationpolicies")):  # fmt: skip
            body = yaml.safe_load(path.read_text())
            custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
            self.say(
                f"  applied {path.relative_to(REPO)} ({body['kind']} {body['metadata']['name']})"
            )
        self._wait_http(f"{self.bridge_url}/readyz", "bridge", 90)
        self._wait_http(f"http://127.0.0.1:{health}/healthz", "operator", 120)
        _wait(
            lambda: "gpuheal started" in self._log("operator"),
            "operator start-up",
            60,
            self._check_procs,
        )
        self.say(f"  bridge and operator up ({time.monotonic() - self.t_start:.0f} s)")
        self.say(
            "  policy: XID 79 -> cordon, Slurm drain + requeue (USR1 checkpoint signal, 2 s grace),"
        )
        self.say("          drain pods (Eviction API), replace from ReservePool 'spares'")
        self.say("          (default-policy.yaml power-cycles on a first XID 79 and replaces on a")
        self.say("           second within 24 h; this site replaces at once: see the file)")

    def _start_bridge(self) -> None:
        token = os.urandom(16).hex()
        state = self.root / "bridge"
        state.mkdir(parents=True, exist_ok=True)
        tokens = state / "tokens"
        tokens.write_text(f"operator:{token}\n")
        tokens.chmod(0o600)
        self.token_file.write_text(token)
        self.token_file.chmod(0o600)
        [port] = free_tcp_ports(1)
        self.bridge_url = f"http://127.0.0.1:{port}"
        argv = [
            *_console("gpuheal-slurm-bridge", "gpuheal_bridge.cli"),
            "--listen", f"127.0.0.1:{port}", "--token-file", str(tokens),
            "--slurm-conf", str(self.slurm.conf_path), "--state-dir", str(state),
            "--log-level", "warning",
        ]  # fmt: skip
        if self.slurm.bin_dir is not None:  # a Slurm in its own root: that release's clients
            argv += ["--slurm-bin-dir", str(self.slurm.bin_dir)]
        env = self.slurm.subprocess_env(dict(os.environ))
        self.procs["bridge"] = spawn(argv, self.logs / "bridge.log", env)
        self.say(f"  Slurm bridge   {self.bridge_url} (bearer token, CLI backend)")

    def _start_operator(self) -> int:
        """Start ``gpuheal run``; returns its health port."""
        metrics, health = free_tcp_ports(2)
        argv = [
            *_console("gpuheal", "gpuheal.cli"), "run",
            "--kubeconfig", str(self.sb.kubeconfig),
            "--bridge-url", self.bridge_url, "--bridge-token-file", str(self.token_file),
            "--sources", "events,conditions", "--namespace", NAMESPACE,
            # The demo's faults are node-problem-detector's Events (`gpuheal simulate xid`).
            "--trusted-reporters", "gpuheal-agent,kernel-monitor",
            "--metrics-port", str(metrics), "--health-port", str(health),
            "--retry-interval", f"{self.settings.operator_retry_interval:g}",
            "--log-format", "plain",
        ]  # fmt: skip
        self.procs["operator"] = spawn(argv, self.logs / "operator.log", dict(os.environ))
        self.say(
            f"  operator       gpuheal run --bridge-url {self.bridge_url} --bridge-token-file ..."
        )
        self.say(
            "                 --sources events,conditions"
            " --trusted-reporters gpuheal-agent,kernel-monitor --retry-interval"
            f" {self.settings.operator_retry_interval:g} --namespace {NAMESPACE}"
        )
        return health

    def _prepare_spare(self, core: Any) -> None:
        """The spare waits as a site keeps spares: tainted in Kubernetes (the pool's promotion
        removes the taint) and drained in Slurm (promotion resumes it)."""
        for spare in self.sb.config.spare_names:
            core.patch_node(
                spare,
                {
                    "spec": {
                        "taints": [{"key": SPARE_TAINT, "value": "true", "effect": "NoSchedule"}]
                    }
                },
            )
            self.slurm.run(
                "scontrol", "update", f"NodeName={spare}", "State=DRAIN", "Reason=reserve pool"
            )
            self.say(f"  spare {spare}: taint {SPARE_TAINT}:NoSchedule, Slurm DRAIN 'reserve pool'")

    # -- 3: workload -----------------------------------------------------------------------
    def start_workload(self) -> tuple[int, str]:
        s = self.settings
        self.phase(3, "workload: a training job on Slurm, training pods on Kubernetes")
        run = s.run(self.workdir)
        script = write_sbatch(
            self.workdir / "job.sh",
            s.model(),
            run,
            python=sys.executable,
            extra_directives=["--exclusive"],
            env=self.gpus.env(),
        )
        job_id = submit(self.slurm, script)
        self.say(f"  sbatch job {job_id} 'gpuheal-demo' (--requeue): a NumPy MLP, {s.steps} steps;")
        self.say(
            f"    atomic checkpoint every {s.ckpt_every} steps and on SIGUSR1/SIGTERM,"
            " resumes from the newest"
        )
        info = _wait(lambda: (j := job_info(self.slurm, job_id)).state == "RUNNING" and j,
                     f"job {job_id} RUNNING", 60, self._check_procs)  # fmt: skip
        node = info.batch_host or info.nodes
        others = [n for n in self.sb.config.node_names if n != node]
        for i, other in enumerate(others):
            self.extra_jobs.append(
                submit(
                    self.slurm,
                    self._filler_script(),
                    f"--job-name=team-{'abc'[i % 3]}-pretrain",
                    "--exclusive",
                    f"--nodelist={other}",
                )
            )
        _wait(
            lambda: all(job_info(self.slurm, j).state == "RUNNING" for j in self.extra_jobs),
            "the other jobs RUNNING",
            60,
            self._check_procs,
        )
        self.say(f"  job {job_id} RUNNING on {node}")
        self.say(f"  {len(others)} other jobs keep {', '.join(others)} busy (exclusive):")
        self.say("    once its node is drained, the job can only go to the spare")
        self._start_trainer_pods()
        self.say(f"  waiting for {s.checkpoints_before_fault} checkpoints ...")
        tail = self.tail = MetricsTail(self.workdir / METRICS_FILE)
        want = s.checkpoints_before_fault * s.ckpt_every
        # A real fault comes anywhere between two checkpoints: half an interval after the last
        # one here, so that a job that dies with its GPU visibly loses the steps since.
        mid = FAULTS[s.fault] is not None
        wait_for = ("step", want + s.ckpt_every // 2) if mid else ("checkpoint", want)

        def checkpointed() -> bool:
            for rec in tail.poll():
                self._show_job_record(rec, None)
                if rec["event"] == wait_for[0] and int(rec["step"]) >= wait_for[1]:
                    return True
            return False

        _wait(checkpointed, f"{s.checkpoints_before_fault} checkpoints", 120, self._check_procs)
        return job_id, node

    def _filler_script(self) -> Path:
        path = self.root / "job" / "other-team.sh"
        if not path.exists():
            path.write_text("#!/bin/bash\n#SBATCH --output=/dev/null\nexec sleep 3600\n")
            path.chmod(0o755)
        return path

    def _start_trainer_pods(self) -> None:
        core, _, apps, policy = self.apis()
        n = len(self.sb.config.node_names)
        deployment, pdb = trainer_manifests(n)
        apps.create_namespaced_deployment(WORKLOAD_NS, deployment)
        policy.create_namespaced_pod_disruption_budget(WORKLOAD_NS, pdb)

        def ready() -> bool:
            pods = self._pods(core)
            budget = policy.read_namespaced_pod_disruption_budget(TRAINER, WORKLOAD_NS)
            running = [p for p in pods if p.phase == "Running"]
            return len(running) == n and (budget.status.current_healthy or 0) == n

        _wait(ready, "trainer pods Running, PDB computed", 90, self._check_procs)
        self.say(
            f"  Deployment {TRAINER}: {n} pods, one per GPU node (8 GPUs each),"
            " PodDisruptionBudget maxUnavailable 1"
        )

    # -- 4: fault and what follows ----------------------------------------------------------
    def inject(self, node: str) -> float:
        self.phase(4, f"fault: XID {XID} on {node}, the node running the job")
        core, _, _, _ = self.apis()
        self.say(
            f"  $ gpuheal simulate xid --node {node} --xid {XID}   (the same call, in-process)"
        )
        self.say(f"  kernel line: {kernel_line(XID)}")
        fault = self.settings.fault
        gpu = FAULTS[fault]
        t = time.time()
        if gpu is not None:
            self.gpus.set(node, gpu)  # the sandbox's fake GPU: the job's next step sees it
        simulate_xid(core, node, XID)
        self.say(f"  t = 0 at {_clock(t)} UTC; each line: when the demo saw it happen")
        for line in _FAULT_WORDS[fault]:
            self.say(f"  {line}")
        return t

    def follow(self, scene: Scene, fault_at: float) -> list[tuple[str, float, str]]:
        core, custom, _, _ = self.apis()
        events: list[tuple[str, float, str]] = [
            ("fault", fault_at, f"XID {XID} on {scene.broken} (GPU fell off the bus)")
        ]
        seen: set[str] = set()
        blocked: set[str] = set()
        deadline = time.monotonic() + self.settings.incident_timeout

        def note(name: str, at: float, detail: str) -> None:
            events.append((name, at, detail))
            self.say(f"  {at - fault_at:+7.2f} s  {name:<23} {detail}")

        while True:
            self._check_procs()
            for rec in self.tail.poll():  # the job's own records first: they happened earlier
                self._show_job_record(rec, fault_at, note)
            snap = self.snapshot(core, custom, scene.job_id)
            for name, check, source in (*MILESTONES, *OPTIONAL):
                if name not in seen and (detail := check(snap, scene)) is not None:
                    seen.add(name)
                    note(name, snap.at[source], detail)
            inc = incident_on(snap, scene.broken)
            b = _condition(inc, "Blocked") if inc else None
            if b and b.get("status") == "True" and b.get("reason") not in blocked:
                blocked.add(str(b.get("reason")))
                self.say(f"  {snap.at['incidents'] - fault_at:+7.2f} s  {'(gpuheal waits)':<23} "
                         f"{b.get('reason')}: {str(b.get('message', ''))[:60]}")  # fmt: skip
            if all(m[0] in seen for m in MILESTONES) and self.resumed:
                return events
            if time.monotonic() > deadline:
                missing = [m[0] for m in MILESTONES if m[0] not in seen]
                raise DemoFailed(f"not seen within {self.settings.incident_timeout:.0f} s: "
                                 f"{', '.join(missing) or 'the job resuming'}")  # fmt: skip
            time.sleep(self.settings.poll)

    def _show_job_record(
        self,
        rec: Record,
        fault_at: float | None,
        note: Callable[[str, float, str], None] | None = None,
    ) -> None:
        """Live progress from the job's metrics: checkpoints before the fault, the story's
        job-side steps after it, then every 50th step; loss = mean of the last 20 steps."""
        ev, at = rec["event"], float(rec["time"])
        if ev == "step":
            self.losses.append(float(rec["loss"]))
        when = "  " if fault_at is None else f"  {at - fault_at:+7.2f} s  "
        mean = sum(self.losses) / len(self.losses) if self.losses else float("nan")
        host = rec.get("host")
        if fault_at is None or at < fault_at:
            if ev == "checkpoint":
                self.say(
                    f"{when}step {rec['step']:>3}  loss {mean:.3f}  on {host}, checkpoint saved"
                )
            elif ev == "start":
                self.say(f"{when}{describe(rec)}")
            return
        if ev == "start":
            self.resumed = True
            self.say(
                f"{when}{'resumed from checkpoint':<23} step {rec.get('resume_step') or 0} on "
                f"{host} (SLURM_RESTART_COUNT={rec.get('restart')})"
            )
        elif (named := job_milestone(rec, fault_at)) is not None:
            if note is not None:
                note(named[0], at, named[1])
        elif ev == "step" and int(rec["step"]) % 50 == 0:
            self.say(f"{when}{'training':<23} step {rec['step']:>3}  loss {mean:.3f}  on {host}")
        elif ev == "done":
            self.say(
                f"{when}{'training done':<23} step {rec['step']}, loss {float(rec['loss']):.3f}"
                f" on the whole dataset, accuracy {float(rec.get('accuracy', 0)):.1%}"
            )

    def finish(self, scene: Scene, fault_at: float) -> JobInfo:
        s = self.settings
        self.say("  training continues ...")
        left = s.steps * s.step_seconds * 3 + 60

        def done() -> JobInfo | None:
            for rec in self.tail.poll():
                self._show_job_record(rec, fault_at)
            j = job_info(self.slurm, scene.job_id)
            return j if j.state not in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING") else None

        info: JobInfo = _wait(done, f"job {scene.job_id} to finish", left, self._check_procs)
        for rec in self.tail.poll():
            self._show_job_record(rec, fault_at)
        at = time.time() - fault_at
        self.say(
            f"  {at:+7.2f} s  {'job ' + info.state:<23} Restarts={info.restarts} (one requeue)"
        )
        return info

    # -- the whole story -------------------------------------------------------------------
    def run(self) -> DemoResult:
        self.start_sandbox()
        t_up = time.monotonic()
        self.start_gpuheal()
        job_id, node = self.start_workload()
        core, _, _, _ = self.apis()
        on_node = frozenset(p.name for p in self._pods(core) if p.node == node)
        scene = Scene(node, self.sb.config.spare_names[0], job_id, on_node)
        fault_at = self.inject(node)
        events = self.follow(scene, fault_at)
        job = self.finish(scene, fault_at)
        self.phase(5, "incident timeline")
        _, custom, _, _ = self.apis()
        incs = custom.list_cluster_custom_object(GROUP, VERSION, "noderemediations")["items"]
        name = next(i["metadata"]["name"] for i in incs if i["spec"]["nodeName"] == node)
        records = read_records(self.workdir / METRICS_FILE)
        tl = incident_report(events, records, None, title=f"XID {XID} on {node}", out=self.say)
        # The PNG: the same timeline without the rows NOT_IN_PNG (they crowd it).
        shown = [e for e in events if e[0] not in NOT_IN_PNG]
        how = {"dies": "died with its GPU, ", "hangs": "hung, "}.get(self.settings.fault, "")
        render_png(
            build_timeline([*shown, *job_events(records, fault_at)]),
            records,
            self.png,
            title=f"XID {XID} on {node}: job {job_id} {how}resumed from its checkpoint "
            f"on {scene.spare}",
        )
        self.say(f"timeline PNG: {self.png}")
        self.say()
        self.say(f"what {name} recorded (status.timeline, operator's clock):")
        for e in next(i for i in incs if i["metadata"]["name"] == name)["status"]["timeline"]:
            at = dt.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
            self.say(f"  {at - fault_at:+7.3f} s  {e['step']:<19} {_cut(e['message'], 64)}")
        return DemoResult(
            broken=node,
            spare=scene.spare,
            job_id=job_id,
            incident=name,
            workdir=self.workdir,
            png=self.png,
            events=events,
            job=job,
            timeline=tl,
            seconds={"after_sandbox": time.monotonic() - t_up},
        )

    def show_state(self) -> None:
        self.phase(6, "the cluster now")
        self._show("kubectl get noderemediations", ["kubectl", "get", "noderemediations"])
        self._show(
            "kubectl get nodes -L gpuheal.io/pool,gpuheal.io/claimed-by",
            ["kubectl", "get", "nodes", "-L", "gpuheal.io/pool,gpuheal.io/claimed-by"],
        )
        self._show(
            f"kubectl get pods -l app={TRAINER} -o wide",
            ["kubectl", "get", "pods", "-l", f"app={TRAINER}", "-o",
             "custom-columns=NAME:.metadata.name,STATUS:.status.phase,NODE:.spec.nodeName"],
        )  # fmt: skip
        steps = ",".join(f"reason!={r}" for r in STEP_EVENT_REASONS)
        self._show(
            f"kubectl get events --field-selector source=gpuheal,{steps}",
            ["kubectl", "get", "events", "-n", NAMESPACE,
             "--field-selector", f"source=gpuheal,{steps}",
             "--sort-by=.lastTimestamp",
             "-o", "custom-columns=REASON:.reason,OBJECT:.involvedObject.name,MESSAGE:.message"],
        )  # fmt: skip
        self._show('sinfo -N -o "%N %T %E"', ["sinfo", "-N", "-o", "%N %T %E"])

    def _show(self, title: str, argv: list[str]) -> None:
        env = {**os.environ, **self.sb.env()}
        res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        self.say(f"$ {title}")
        for line in (res.stdout + res.stderr).rstrip().splitlines():
            self.say(f"  {line}")

    # -- looking at the world --------------------------------------------------------------
    def snapshot(self, core: Any, custom: Any, job_id: int) -> Snapshot:
        at: dict[str, float] = {}
        nodes = {}
        for n in core.list_node(label_selector="gpuheal.io/sandbox=true").items:
            nodes[n.metadata.name] = NodeFacts(
                unschedulable=bool(n.spec.unschedulable),
                labels=dict(n.metadata.labels or {}),
                annotations=dict(n.metadata.annotations or {}),
                taints=[t.key for t in n.spec.taints or []],
            )
        at["nodes"] = time.time()
        incidents = custom.list_cluster_custom_object(GROUP, VERSION, "noderemediations")["items"]
        at["incidents"] = time.time()
        pods = self._pods(core)
        at["pods"] = time.time()
        out = self.slurm.run("sinfo", "-N", "-h", "-o", "%N|%T|%E", check=False).stdout
        at["slurm"] = time.time()
        slurm = {}
        for line in out.splitlines():
            name, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            slurm[name.strip()] = SlurmNode(state.strip().rstrip("*~#"), reason.strip())
        try:
            job: JobInfo | None = job_info(self.slurm, job_id)
        except subprocess.CalledProcessError:
            job = None
        at["job"] = time.time()
        return Snapshot(at, nodes, incidents, pods, slurm, job)

    def _pods(self, core: Any) -> list[PodFacts]:
        return [
            PodFacts(
                name=p.metadata.name,
                node=p.spec.node_name,
                phase=p.status.phase or "",
                deleting=p.metadata.deletion_timestamp is not None,
            )
            for p in core.list_namespaced_pod(WORKLOAD_NS, label_selector=f"app={TRAINER}").items
        ]

    def _log(self, name: str) -> str:
        try:
            return (self.logs / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _check_procs(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = "\n".join(self._log(name).splitlines()[-15:])
                raise DemoFailed(f"{name} exited {proc.returncode}; its log ends:\n{tail}")

    def _wait_http(self, url: str, what: str, timeout: float) -> None:
        def up() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 (http://)
                    return bool(resp.status == 200)
            except OSError:
                return False

        _wait(up, f"{what} ready ({url})", timeout, self._check_procs, every=0.2)

    # -- teardown --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop what this demo started: operator, bridge, then the sandbox (Slurm cancels its
        jobs and kills their processes). Safe to call twice. A second Ctrl-C waits for it."""
        with _shielded():
            self._close()

    def _close(self) -> None:
        for name in ("operator", "bridge"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self.sandbox is not None:
            self.sandbox.down()
            self.sandbox = None

    def leftovers(self) -> list[str]:
        """Processes whose command line mentions this demo's root (none after ``close``)."""
        me = os.getpid()
        root = str(self.root)
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if root in cmd and pid_alive(int(entry.name)):
                found.append(f"{entry.name} {cmd[:120]}")
        return found


TRAINER_MANIFESTS = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: trainer}
spec:
  selector: {matchLabels: {app: trainer}}
  template:
    metadata: {labels: {app: trainer}}
    spec:
      terminationGracePeriodSeconds: 1
      affinity:
        nodeAffinity:   # GPU nodes in service only (a spare is labelled pool=reserve)
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{key: gpuheal.io/pool, operator: In, values: [training]}]
        podAntiAffinity:   # one per node
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector: {matchLabels: {app: trainer}}
            topologyKey: kubernetes.io/hostname
      containers:
      - name: train
        image: example.invalid/trainer:1   # kwok runs no containers
        resources: {limits: {nvidia.com/gpu: "8"}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: trainer}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: trainer}}
"""


def trainer_manifests(replicas: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The "training" pods on the GPU nodes: a Deployment, one pod per node, and its PDB."""
    deployment, pdb = yaml.safe_load_all(TRAINER_MANIFESTS)
    deployment["spec"]["replicas"] = replicas
    return deployment, pdb


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _console(script: str, module: str) -> list[str]:
    """The installed console script next to this interpreter, else ``python -m module``."""
    path = Path(sys.executable).parent / script
    return [str(path)] if path.exists() else [sys.executable, "-m", module]


def _wait(
    check: Callable[[], Any],
    what: str,
    timeout: float,
    also: Callable[[], None] | None = None,
    every: float = 0.2,
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        if also is not None:
            also()
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DemoFailed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def demo_root(root: Path) -> Path:
    """``root``, or a short temporary directory when ``root`` is too deep for Slurm's unix
    sockets (``check_socket_paths``)."""
    from gpuheal_dev.sandbox.slurm import SlurmLayout, check_socket_paths

    names = [*SandboxConfig().node_names, *SandboxConfig().spare_names]
    try:
        check_socket_paths(SlurmLayout(root.resolve() / "slurm"), names)
    except ValueError:
        return Path(tempfile.mkdtemp(prefix="gpuheal-demo-"))
    return root.resolve()


@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """Ignore Ctrl-C and SIGTERM meanwhile (a teardown cut short leaves processes behind)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, signal.SIG_IGN) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM/SIGHUP end the demo like Ctrl-C does: through the teardown."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


_FAULT_WORDS = {
    "dies": (
        "the GPU fell off the bus: the job's CUDA process fails at once (exit 1), as on a",
        "real lost GPU, so the job is FAILED before gpuheal acts; gpuheal requeues it as the",
        "fault's victim and it resumes from its last interval checkpoint (the steps since: lost)",
    ),
    "hangs": (
        "the GPU hangs: the job's process is stuck in the driver and ignores SIGUSR1 and",
        "SIGTERM; after the requeue Slurm's SIGKILL (max(KillWait, 5 s)) gets it off the node",
        "and it resumes from its last interval checkpoint (the steps since: lost)",
    ),
    "gentle": (
        "the GPUs stay fine here (--fault gentle): the job trains on until requeued and",
        "checkpoints on the signal and on its way out: nothing lost",
    ),
}


def run_demo(root: Path, fault: str = "dies") -> int:
    t0 = time.monotonic()
    root = demo_root(root)
    settings = DemoSettings(fault=fault)
    print("gpuheal demo: XID 79 on a GPU node -> its Slurm job resumes from its checkpoint on a")
    print(f"spare node. All local and real: kube-apiserver + kwok, Slurm {DEFAULT_SLURM}, bridge, "
          "operator.")  # fmt: skip
    print(f"the fault: the job {fault} (--fault dies|hangs|gentle)")
    print(f"working directory: {root}")
    rc = 1
    result: DemoResult | None = None
    demo = Demo(root, settings, out=lambda line: print(line, flush=True))
    with _signals_raise():
        try:
            with demo:
                try:
                    result = demo.run()
                    demo.show_state()
                finally:
                    print(f"\ntearing down ({time.monotonic() - t0:.0f} s) ...", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            rc = 130
        except Exception as exc:  # report, after the teardown, and exit non-zero
            what = str(exc) if isinstance(exc, DemoFailed) else f"{type(exc).__name__}: {exc}"
            print(f"\nDEMO FAILED: {what}", flush=True)
            print(f"logs: {demo.logs}", flush=True)
        left = demo.leftovers()
    print(f"stopped: operator, bridge, Slurm, Kubernetes; processes left: {len(left)}")
    for line in left:
        print(f"  {line}")
    if result is not None and rc != 130:
        ok = result.ok and not left
        rc = 0 if ok else 1
        verdict = "story complete" if ok else f"story INCOMPLETE (missing: {result.missing})"
        print(f"\n{verdict}: {time.monotonic() - t0:.0f} s in all, "
              f"{result.seconds['after_sandbox']:.0f} s after the sandbox was up")  # fmt: skip
        print(f"timeline PNG: {result.png}")
    return rc
