"""Tools for the operator benchmarks: the operator (or a baseline) as a measured process, raw
Kubernetes HTTP (fast patches, streaming watches) from a kubeconfig, background node churn,
and the pure parsing/statistics helpers they need (unit-tested in tests/unit/test_bench_*).

Everything talks to loopback only; every loop is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.harness import REPO, percentile

PYTHONPATH = f"{REPO / 'operator'}:{REPO / 'slurm-bridge'}:{REPO}"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- pure helpers (unit-tested) -------------------------------------------------------------


def parse_prometheus(text: str, prefix: str = "") -> dict[str, float]:
    """``{"name{labels}": value}`` for every sample line starting with ``prefix``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or not line.startswith(prefix):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def metric_sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (exact name match)."""
    total = 0.0
    for key, value in metrics.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


def parse_proc_status(text: str) -> dict[str, int]:
    """``VmRSS``/``VmHWM``/... of /proc/PID/status in KiB."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key.startswith("Vm") and len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0])
    return out


def parse_proc_stat_cpu(text: str) -> float:
    """utime + stime of /proc/PID/stat in clock ticks (the comm field may hold spaces)."""
    fields = text.rpartition(")")[2].split()
    return float(int(fields[11]) + int(fields[12]))


def classify_request(method: str, url: str) -> tuple[str, str]:
    """Kubernetes API request -> (verb, resource), the way the apiserver counts them:
    ``watch`` for ``watch=true``, ``list`` for a GET on a collection, else the HTTP verb."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    segs = [s for s in parts.path.split("/") if s]
    # /api/v1/..., /apis/<group>/<version>/...
    rest = segs[2:] if segs[:1] == ["api"] else segs[3:] if segs[:1] == ["apis"] else segs
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]  # namespaced: drop namespaces/<ns>
    resource = rest[0] if rest else (segs[-1] if segs else "")
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"  # subresource: nodes/status, pods/eviction
    m = method.upper()
    if m == "GET" and query.get("watch", [""])[0] in ("true", "1"):
        verb = "watch"
    elif m == "GET":
        verb = "list" if len(rest) == 1 else "get"
    else:
        verb = m.lower()
    return verb, resource


def sustained_rate(levels: Sequence[dict[str, Any]], lag_limit: float = 1.0) -> float | None:
    """The highest achieved event rate of consecutive levels (in order) whose p99 lag stayed
    within ``lag_limit``; None when the first level already exceeded it."""
    best: float | None = None
    for level in levels:
        p99 = level.get("lag_p99")
        if p99 is None or p99 > lag_limit:
            break
        best = float(level["achieved_rate"])
    return best


def first_at_least(series: Sequence[tuple[float, float]], threshold: float) -> float | None:
    """The first time in ``[(t, value), ...]`` whose value reaches ``threshold``."""
    for t, v in series:
        if v >= threshold:
            return t
    return None


def pstats(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, p50, p99, max (rounded to ms)."""
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 4),
        "p99": round(percentile(values, 99), 4),
        "max": round(max(values), 4),
    }


def abba(a: str, b: str, pairs: int) -> list[str]:
    """The order of a paired comparison: A B, B A, A B, ... (``pairs`` of each), so that
    neither variant always runs first as the machine warms up or its load drifts."""
    return [x for i in range(pairs) for x in ((a, b) if i % 2 == 0 else (b, a))]


def paired(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Pairs (a[i], b[i]) taken side by side: each pair's difference b - a, their median,
    how many pairs b was lower in, and each side's median (None where a side is missing)."""
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    if not diffs:
        return {"pairs": 0, "diffs": [], "median_diff": None, "b_lower": 0,
                "median_a": None, "median_b": None}  # fmt: skip
    return {
        "pairs": len(diffs),
        "diffs": [round(d, 4) for d in diffs],
        "median_diff": round(statistics.median(diffs), 4),
        "b_lower": sum(d < 0 for d in diffs),
        "median_a": round(statistics.median(a), 4),
        "median_b": round(statistics.median(b), 4),
    }


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> dict[str, Any]:
    """Least-squares ``y = a + b*x``: ``a``, ``b``, each point's residual (measured - fitted)
    and the largest one in absolute value; needs two distinct x."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError(f"fit_line needs two or more distinct x, got {list(xs)}")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    residuals = [y - (a + b * x) for x, y in zip(xs, ys, strict=True)]
    return {"a": a, "b": b, "residuals": residuals, "max_abs_residual": max(map(abs, residuals))}


def collapsed_top(raw: str, n: int = 12) -> dict[str, Any]:
    """py-spy's raw (collapsed) output ``frame;frame;... count`` per line -> the samples, the
    ``n`` frames with the most samples on top of the stack (self) and the ``n`` gpuheal
    frames with the most samples anywhere in the stack (inclusive)."""
    total = 0
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        total += k
        frames = stack.split(";")
        own[frames[-1]] = own.get(frames[-1], 0) + k
        for frame in set(frames):
            if "gpuheal/" in frame:
                incl[frame] = incl.get(frame, 0) + k

    def top(d: dict[str, int]) -> list[tuple[str, int]]:
        return sorted(d.items(), key=lambda kv: -kv[1])[:n]

    return {"samples": total, "self": top(own), "gpuheal_inclusive": top(incl)}


# ---- processes ------------------------------------------------------------------------------


def proc_sample(pid: int) -> dict[str, float]:
    """RSS and high-water mark (MiB) and CPU seconds (user+system) of ``pid``."""
    st = parse_proc_status(Path(f"/proc/{pid}/status").read_text())
    cpu = parse_proc_stat_cpu(Path(f"/proc/{pid}/stat").read_text()) / CLK_TCK
    return {
        "rss_mib": st.get("VmRSS", 0) / 1024,
        "hwm_mib": st.get("VmHWM", 0) / 1024,
        "cpu_s": cpu,
    }


def free_port() -> int:
    from gpuheal_dev.sandbox._proc import free_tcp_ports

    [port] = free_tcp_ports(1)
    return port


def wait_until(check: Callable[[], Any], what: str, timeout: float, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    value: Any = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; last: {value!r}")


@dataclass
class Measured:
    """A process we started, with its log, metrics endpoint and /proc numbers."""

    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    started_wall: float = 0.0
    started_mono: float = 0.0

    def start(self) -> Measured:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        env = {**os.environ, "PYTHONPATH": PYTHONPATH, **self.env}
        self.started_wall, self.started_mono = time.time(), time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def check_alive(self) -> None:
        if not self.alive():
            code = self.proc.returncode if self.proc else None
            raise RuntimeError(f"{self.argv[2:4]} exited ({code}):\n{self.log()[-3000:]}")

    def metrics(self, prefix: str = "gpuheal_") -> dict[str, float]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return parse_prometheus(resp.read().decode(), prefix)

    def sample(self) -> dict[str, float]:
        return proc_sample(self.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def operator_process(
    kubeconfig: Path,
    log_path: Path,
    *,
    bridge_url: str | None = None,
    bridge_token_file: Path | None = None,
    sources: str = "conditions,events",
    count_api: bool = True,
) -> Measured:
    """``gpuheal run`` as a process (the flags tests use, production intervals), through
    ``bench.api_count`` so its Kubernetes API requests show as a metric."""
    mport, hport = free_port(), free_port()
    entry = ["-m", "bench.api_count"] if count_api else ["-m", "gpuheal"]
    argv = [
        sys.executable, *entry, "run",
        "--kubeconfig", str(kubeconfig),
        "--metrics-port", str(mport),
        "--health-port", str(hport),
        "--namespace", "default",
        "--log-format", "json",
        "--sources", sources,
        "--trusted-reporters", "gpuheal-agent,kernel-monitor",  # bench faults: NPD's Events
    ]  # fmt: skip
    if bridge_url:
        argv += ["--bridge-url", bridge_url, "--bridge-token-file", str(bridge_token_file)]
    return Measured(argv, log_path, metrics_port=mport)


def baseline_process(
    kubeconfig: Path, log_path: Path, expect_nodes: int = 0, *, mode: str = "memory"
) -> Measured:
    """A plain kopf baseline (``bench/kopf_baseline.py``): ``memory``, the ``on.event('nodes')``
    handler; ``cordon``, the ``on.event('events')`` handler that cordons on a GpuXid Event."""
    argv = [sys.executable, "-m", "bench.kopf_baseline"]
    env = {
        "KUBECONFIG": str(kubeconfig),
        "BENCH_EXPECT_NODES": str(expect_nodes),
        "BENCH_MODE": mode,
    }
    return Measured(argv, log_path, env=env)


class RssSampler:
    """Samples RSS / CPU of a process every ``every`` seconds in a thread."""

    def __init__(self, proc: Measured, every: float = 0.5) -> None:
        self.proc = proc
        self.every = every
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss")

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                sample = self.proc.sample()
            except OSError:
                return
            if not sample["hwm_mib"]:  # a zombie (exited, not yet reaped) has no memory lines
                return
            self.samples.append((time.monotonic(), sample))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def between(self, t0: float, t1: float, key: str = "rss_mib") -> list[float]:
        return [s[key] for t, s in self.samples if t0 <= t <= t1]


# ---- Kubernetes over raw HTTP ---------------------------------------------------------------


@dataclass(frozen=True)
class KubeAccess:
    """Server URL and TLS material of a kubeconfig with file-based client certificates."""

    server: str
    ca: str
    cert: str
    key: str

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeAccess:
        cfg = yaml.safe_load(path.read_text())
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        return cls(
            server=cluster["server"],
            ca=cluster["certificate-authority"],
            cert=user["client-certificate"],
            key=user["client-key"],
        )

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.server, verify=self.ssl_context(), timeout=timeout)

    def async_client(self, limits: int = 32) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.server,
            verify=self.ssl_context(),
            timeout=30.0,
            limits=httpx.Limits(max_connections=limits, max_keepalive_connections=limits),
        )


class Watcher:
    """A streaming watch (raw JSON lines) in a thread: ``on_event(type, obj, t_received)``.
    Starts at the collection's current resourceVersion; stops when asked or after
    ``max_seconds``."""

    def __init__(
        self,
        access: KubeAccess,
        path: str,
        on_event: Callable[[str, dict[str, Any], float], None],
        *,
        params: dict[str, str] | None = None,
        max_seconds: float = 900,
    ) -> None:
        self.access, self.path, self.on_event = access, path, on_event
        self.params = params or {}
        self.max_seconds = max_seconds
        self.events = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch {path}")

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        try:
            with self.access.client(timeout=60) as http:
                listing = http.get(self.path, params={**self.params, "limit": "1"})
                listing.raise_for_status()
                rv = listing.json()["metadata"]["resourceVersion"]
                while not self._stop.is_set() and time.monotonic() < deadline:
                    params = {**self.params, "watch": "true", "resourceVersion": rv,
                              "timeoutSeconds": "60"}  # fmt: skip
                    with http.stream("GET", self.path, params=params, timeout=None) as resp:
                        resp.raise_for_status()
                        self._ready.set()
                        for line in resp.iter_lines():
                            now = time.time()
                            if self._stop.is_set() or time.monotonic() > deadline:
                                return
                            if not line:
                                continue
                            ev = json.loads(line)
                            obj = ev.get("object") or {}
                            if ev.get("type") == "ERROR":
                                raise RuntimeError(f"watch {self.path}: {obj}")
                            rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                            self.events += 1
                            self.on_event(str(ev.get("type")), obj, now)
        except BaseException as exc:  # reported by the benchmark
            self.error = exc
            self._ready.set()

    def __enter__(self) -> Watcher:
        self._thread.start()
        if not self._ready.wait(30) or self.error is not None:
            raise RuntimeError(f"watch {self.path} did not start: {self.error}")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()  # the stream ends at its next line or timeoutSeconds
        self._thread.join(2)


class Churn:
    """Background node churn: merge-patches an annotation on random nodes at ``rate``/s from
    an asyncio loop in a thread (httpx, up to 32 requests in flight). ``set_rate`` changes it;
    ``sent``/``errors`` count what was done."""

    def __init__(self, access: KubeAccess, nodes: Sequence[str], rate: float, seed: int = 7):
        self.access, self.nodes, self.rate = access, list(nodes), rate
        self.sent = 0
        self.errors = 0
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="churn")

    def set_rate(self, rate: float) -> None:
        self.rate = rate

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        sem = asyncio.Semaphore(32)
        tasks: set[asyncio.Task[None]] = set()
        async with self.access.async_client() as http:

            async def patch(name: str, k: int) -> None:
                try:
                    body = {"metadata": {"annotations": {"bench.gpuheal.io/churn": str(k)}}}
                    resp = await http.patch(
                        f"/api/v1/nodes/{name}",
                        content=json.dumps(body),
                        headers={"Content-Type": "application/merge-patch+json"},
                    )
                    if resp.status_code >= 300:
                        self.errors += 1
                    else:
                        self.sent += 1
                except httpx.HTTPError:
                    self.errors += 1
                finally:
                    sem.release()

            k = 0
            next_t = time.monotonic()
            deadline = time.monotonic() + 1800
            while not self._stop.is_set() and time.monotonic() < deadline:
                if self.rate <= 0:
                    await asyncio.sleep(0.05)
                    next_t = time.monotonic()
                    continue
                next_t += 1.0 / self.rate
                delay = next_t - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -1.0:
                    next_t = time.monotonic()  # fell behind by a second: do not burst
                await sem.acquire()
                k += 1
                t = asyncio.create_task(patch(self._rng.choice(self.nodes), k))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks, timeout=10)

    def __enter__(self) -> Churn:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(15)


def create_nodes(access: KubeAccess, names: Sequence[str], in_flight: int = 32) -> int:
    """POST a kwok GPU node (``gpu_node_manifest``) per name, ``in_flight`` at once from one
    asyncio loop: ~5x the Python client's rate on a loaded 2-core machine, which matters at
    20,000 nodes. An existing node is left alone; returns how many were created."""
    from gpuheal_dev.sandbox.nodes import gpu_node_manifest

    async def main() -> int:
        sem = asyncio.Semaphore(in_flight)
        created = 0
        async with access.async_client(limits=in_flight) as http:

            async def one(name: str) -> None:
                nonlocal created
                async with sem:
                    resp = await http.post("/api/v1/nodes", json=gpu_node_manifest(name))
                if resp.status_code == 409:
                    return
                resp.raise_for_status()
                created += 1

            await asyncio.gather(*(one(n) for n in names))
        return created

    return asyncio.run(main())


# ---- sandbox pieces -------------------------------------------------------------------------


def apply_crds(sandbox: Any) -> None:
    sandbox.kubectl("apply", "-f", str(REPO / "crds"))
    for plural in ("noderemediations", "remediationpolicies", "reservepools"):
        sandbox.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.gpuheal.io", "--timeout=60s"
        )


def bench_policy(
    name: str,
    steps: list[dict[str, Any]],
    *,
    max_unhealthy: int | str = "100%",
    rate_limit: int = 10_000,
    return_to_service: bool = False,
) -> dict[str, Any]:
    """A policy over every GPU node, one XID 79 rule with ``steps``; breaker and rate limit
    as given (generous by default); return to service off, or on after 1 h healthy."""
    return {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {"nvidia.com/gpu.present": "true"}},
            "priority": 10,
            "safety": {
                "maxUnhealthy": max_unhealthy,
                "rateLimit": {"remediations": rate_limit, "window": "1h"},
                "stormCooldown": "0s",
            },
            "returnToService": {"enabled": True, "healthyFor": "1h"}
            if return_to_service
            else {"enabled": False},
            "rules": [
                {
                    "name": "fell-off-bus",
                    "signals": {"xids": [79]},
                    "ladder": [{"name": "remediate", "steps": steps}],
                }
            ],
        },
    }


def create_policy(http: httpx.Client, body: dict[str, Any]) -> None:
    resp = http.post("/apis/gpuheal.io/v1alpha1/remediationpolicies", json=body)
    resp.raise_for_status()


def post_xid_event(http: httpx.Client, node: str, uid: str, xid: int = 79) -> float:
    """Create the Event node-problem-detector would (``gpuheal simulate xid``); returns the
    wall time just before the request was sent."""
    from gpuheal.cli.simulate import kernel_line, xid_event

    body = xid_event({"metadata": {"name": node, "uid": uid}}, kernel_line(xid))
    t0 = time.time()
    resp = http.post("/api/v1/namespaces/default/events", json=body)
    resp.raise_for_status()
    return t0


def node_uids(http: httpx.Client) -> dict[str, str]:
    resp = http.get("/api/v1/nodes")
    resp.raise_for_status()
    return {n["metadata"]["name"]: n["metadata"]["uid"] for n in resp.json()["items"]}


def list_custom(http: httpx.Client, plural: str) -> list[dict[str, Any]]:
    resp = http.get(f"/apis/gpuheal.io/v1alpha1/{plural}")
    resp.raise_for_status()
    items: list[dict[str, Any]] = resp.json()["items"]
    return items


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class Bridge:
    """The Slurm bridge as its own process (the production CLI, CLI backend)."""

    proc: Measured
    url: str
    token_file: Path
    #: where its Slurm clients are (None: the host's PATH)
    slurm_bin_dir: Path | None = None
    #: what else lives as long as the bridge (its Slurm clients' namespace holder)
    resources: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def stop(self) -> None:
        """The bridge process, then what it used."""
        try:
            self.proc.stop()
        finally:
            self.resources.close()


def start_bridge(cluster: Any, workdir: Path, token: str) -> Bridge:
    """The bridge with that Slurm's own clients. A release in a root of its own (26.05): the
    root's clients, joining one held namespace (``slurmclients.joined_clients``), as a bridge
    image with that release's client runs them; not the root's per-call way in, which costs
    ~30 ms per call here and which production never pays."""
    port = free_port()
    tokens = workdir / "bridge-tokens"
    tokens.write_text(f"operator:{token}\n")
    token_file = workdir / "operator-token"
    token_file.write_text(token)
    state = workdir / "bridge-state"
    state.mkdir(exist_ok=True)
    argv = [
        sys.executable, "-c", "import sys; from gpuheal_bridge.cli import main; sys.exit(main())",
        "--listen", f"127.0.0.1:{port}", "--token-file", str(tokens),
        "--slurm-conf", str(cluster.conf_path), "--state-dir", str(state),
        "--expedite-timeout", "15", "--log-level", "warning",
    ]  # fmt: skip
    resources = contextlib.ExitStack()
    try:
        root = getattr(cluster, "slurm_root", None)
        bin_dir: Path | None = getattr(cluster, "bin_dir", None)
        if root is not None:
            from gpuheal_dev.sandbox.slurmclients import joined_clients

            bin_dir = resources.enter_context(joined_clients(root, workdir / "slurm-clients"))
        if bin_dir is not None:
            argv += ["--slurm-bin-dir", str(bin_dir)]
        proc = Measured(argv, workdir / "bridge.log", env=dict(cluster.subprocess_env())).start()
        bridge = Bridge(proc, f"http://127.0.0.1:{port}", token_file, bin_dir, resources)
    except BaseException:
        resources.close()
        raise

    def ready() -> bool:
        proc.check_alive()
        try:
            with urllib.request.urlopen(f"{bridge.url}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    try:
        wait_until(ready, "bridge ready", timeout=30, every=0.2)
    except BaseException:
        bridge.stop()
        raise
    return bridge


def chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
