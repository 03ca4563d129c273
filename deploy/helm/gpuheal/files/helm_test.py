"""`helm test` checks of the gpuheal chart: `python helm_test.py crds|operator|bridge`.

Runs in the test pods (the operator image: Python's standard library only) with a read-only
ServiceAccount of its own, and from the repository's integration tests against the sandbox.
Every setting comes from the environment (the chart sets them); exit status 0 means the
check passed, 1 that it failed, with one `FAIL: ...` line that says what to look at.

  crds      each of GPUHEAL_TEST_CRDS is Established and its names accepted
  operator  the Deployment GPUHEAL_TEST_DEPLOYMENT has an available replica; the Lease
            GPUHEAL_TEST_LEASE is held by one of its pods and renewed while we watch; that
            pod's kopf answers /healthz (start-up finished: watches and sources running);
            the first two may take GPUHEAL_TEST_WAIT seconds (default 60) to come true
  bridge    GPUHEAL_TEST_BRIDGE_URL answers /readyz 200 (slurmctld reachable), accepts the
            token in GPUHEAL_TEST_BRIDGE_TOKEN_FILE and refuses a request without it

The Kubernetes API is reached in-cluster (KUBERNETES_SERVICE_HOST, the pod's ServiceAccount
token and CA); GPUHEAL_TEST_API_SERVER, GPUHEAL_TEST_API_TOKEN_FILE and GPUHEAL_TEST_API_CA_FILE
point it elsewhere, and GPUHEAL_TEST_HEALTH_URL replaces the holder pod's health URL (outside
the cluster, pod IPs cannot be reached).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
T = TypeVar("T")
TIMEOUT = 10.0


class CheckFailed(Exception):
    pass


def env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise CheckFailed(f"{name} is not set")
    return value


def ssl_context(ca_file: str | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_file or None)


def http_get(
    url: str, headers: dict[str, str] | None = None, ca_file: str | None = None
) -> tuple[int, bytes]:
    """GET -> (status, body); HTTP error statuses are answers, not exceptions."""
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 - URLs from the chart
    context = ssl_context(ca_file) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as resp:  # noqa: S310
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


class Kube:
    def __init__(self) -> None:
        server = os.environ.get("GPUHEAL_TEST_API_SERVER")
        if not server:
            host = env("KUBERNETES_SERVICE_HOST")
            port = env("KUBERNETES_SERVICE_PORT", "443")
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        self.server = server.rstrip("/")
        token_file = env("GPUHEAL_TEST_API_TOKEN_FILE", str(SA_DIR / "token"))
        self.token = Path(token_file).read_text().strip()
        self.ca_file = env("GPUHEAL_TEST_API_CA_FILE", str(SA_DIR / "ca.crt"))

    def get(self, path: str) -> dict[str, Any] | None:
        """The object at `path`, or None when it does not exist (404)."""
        try:
            status, body = http_get(
                self.server + path,
                headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
                ca_file=self.ca_file,
            )
        except OSError as exc:  # refused, timed out, TLS: the check fails, saying so
            raise CheckFailed(
                f"the API server {self.server} does not answer GET {path}: {exc} "
                "(a NetworkPolicy on the test pod's egress, or the API server down)"
            ) from exc
        if status == 404:
            return None
        if status != 200:
            raise CheckFailed(f"GET {path}: HTTP {status}: {body[:300].decode(errors='replace')}")
        answer: dict[str, Any] = json.loads(body)
        return answer


def _condition(obj: dict[str, Any], type_: str) -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return str(cond.get("status"))
    return None


def check_crds() -> str:
    kube = Kube()
    names = [n for n in env("GPUHEAL_TEST_CRDS").split(",") if n]
    for name in names:
        crd = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        if crd is None:
            raise CheckFailed(
                f"CRD {name} does not exist (crds.enabled=false? kubectl apply -f crds/)"
            )
        for type_ in ("NamesAccepted", "Established"):
            if _condition(crd, type_) != "True":
                raise CheckFailed(f"CRD {name}: condition {type_} is not True")
    return f"{len(names)} CRDs established: {', '.join(names)}"


def _lease_holder(kube: Kube, namespace: str, name: str) -> tuple[str, str]:
    lease = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")
    if lease is None:
        raise CheckFailed(
            f"no Lease {namespace}/{name}: no operator copy got through start-up "
            f"(kubectl -n {namespace} logs deploy/<release>-gpuheal)"
        )
    spec = lease.get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    if not holder:
        raise CheckFailed(f"Lease {namespace}/{name} is not held: no operator copy is active")
    return holder, str(spec.get("renewTime") or "")


def check_operator() -> str:
    kube = Kube()
    namespace = env("GPUHEAL_TEST_NAMESPACE")
    deployment = env("GPUHEAL_TEST_DEPLOYMENT")
    lease_name = env("GPUHEAL_TEST_LEASE", "gpuheal-operator")
    lease_duration = float(env("GPUHEAL_TEST_LEASE_DURATION", "15"))

    # Right after `helm install` the pods may still be starting: give them `wait` seconds.
    deadline = time.monotonic() + float(env("GPUHEAL_TEST_WAIT", "60"))

    def eventually(probe: Callable[[], T]) -> T:
        while True:
            try:
                return probe()
            except CheckFailed:
                if time.monotonic() > deadline:
                    raise
            time.sleep(1.0)

    def available_replicas() -> int:
        dep = kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}")
        if dep is None:
            raise CheckFailed(f"Deployment {namespace}/{deployment} does not exist")
        available = int((dep.get("status") or {}).get("availableReplicas") or 0)
        if available < 1:
            raise CheckFailed(
                f"Deployment {namespace}/{deployment} has no available replica "
                f"(kubectl -n {namespace} describe deploy {deployment})"
            )
        return available

    available = eventually(available_replicas)

    # Held, and renewed while we watch (every third of the duration): an active copy, with no
    # comparison of our clock with the holder's.
    holder, renewed = eventually(lambda: _lease_holder(kube, namespace, lease_name))
    deadline = time.monotonic() + lease_duration + 5
    while True:
        time.sleep(1.0)
        holder_now, renewed_now = _lease_holder(kube, namespace, lease_name)
        if holder_now == holder and renewed_now != renewed:
            break
        if holder_now != holder:  # a failover while we looked: watch the new holder
            holder, renewed = holder_now, renewed_now
        if time.monotonic() > deadline:
            raise CheckFailed(
                f"Lease {namespace}/{lease_name} held by {holder} was not renewed for "
                f"{lease_duration:.0f}s: the holder is stuck or gone"
            )

    pod = _holder_pod(kube, namespace, lease_name, holder)
    _holder_healthy(pod)
    name = pod["metadata"]["name"]
    return f"{deployment}: {available} available; {name} holds the Lease, /healthz 200"


def _holder_pod(kube: Kube, namespace: str, lease_name: str, holder: str) -> dict[str, Any]:
    """The release's operator pod that holds the Lease (gpuheal's identity is
    "<pod name>-<6 hex>", remediation/lease.py)."""
    query = urllib.parse.urlencode({"labelSelector": env("GPUHEAL_TEST_SELECTOR")})
    pods = (kube.get(f"/api/v1/namespaces/{namespace}/pods?{query}") or {}).get("items") or []
    mine = [p for p in pods if holder.rsplit("-", 1)[0] == p["metadata"]["name"]]
    if not mine:
        names = sorted(p["metadata"]["name"] for p in pods)
        raise CheckFailed(
            f"Lease {namespace}/{lease_name} is held by {holder}, which is none of this "
            f"release's operator pods {names}: another gpuheal runs in {namespace}"
        )
    return dict(mine[0])


def _holder_healthy(pod: dict[str, Any]) -> None:
    """kopf serves /healthz once start-up finished (watches and sources running)."""
    name = pod["metadata"]["name"]
    url = os.environ.get("GPUHEAL_TEST_HEALTH_URL")
    if not url:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            raise CheckFailed(f"pod {name} holds the Lease but has no IP")
        host = f"[{ip}]" if ":" in ip else ip
        url = f"http://{host}:{env('GPUHEAL_TEST_HEALTH_PORT')}/healthz"
    try:
        status, body = http_get(url)
    except OSError as exc:
        raise CheckFailed(
            f"{name} holds the Lease but its /healthz ({url}) does not answer: {exc} "
            "(still starting, or a NetworkPolicy blocks the port)"
        ) from exc
    if status != 200:
        raise CheckFailed(f"{url}: HTTP {status}: {body[:300].decode(errors='replace')}")


def check_bridge() -> str:
    url = env("GPUHEAL_TEST_BRIDGE_URL").rstrip("/")
    token = Path(env("GPUHEAL_TEST_BRIDGE_TOKEN_FILE")).read_text().strip()
    ca_file = os.environ.get("GPUHEAL_TEST_BRIDGE_CA_FILE") or None
    auth = {"Authorization": f"Bearer {token}"}

    def get(path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        try:
            return http_get(url + path, headers=headers, ca_file=ca_file)
        except OSError as exc:
            raise CheckFailed(f"bridge {url}: {path}: {exc}") from exc

    status, body = get("/readyz", auth)
    text = body[:300].decode(errors="replace")
    if status == 503:
        raise CheckFailed(f"bridge {url} answers but slurmctld is not reachable: {text}")
    try:
        ready: dict[str, Any] = json.loads(body) if status == 200 else {}
    except ValueError:
        ready = {}
    if not ready.get("ready"):
        raise CheckFailed(f"bridge {url}/readyz: HTTP {status}: {text}")
    # An authenticated route that never reaches Slurm: an invalid job id is refused (422)
    # after the token was checked (401 before).
    probe = "/v1/jobs/helm-test"
    status, _ = get(probe, auth)
    if status == 401:
        raise CheckFailed(f"bridge {url} refuses the operator's token (401): the Secret differs")
    status_anonymous, _ = get(probe, {})
    if status_anonymous != 401:
        raise CheckFailed(
            f"bridge {url} answered {status_anonymous} without a token: authentication is off"
        )
    return f"bridge {url}: ready (backend {ready.get('backend')}), token accepted"


CHECKS = {"crds": check_crds, "operator": check_operator, "bridge": check_bridge}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in CHECKS:
        print(f"usage: {argv[0]} {'|'.join(CHECKS)}", file=sys.stderr)
        return 2
    try:
        print(f"PASS: {CHECKS[argv[1]]()}")
    except CheckFailed as exc:
        print(f"FAIL: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
