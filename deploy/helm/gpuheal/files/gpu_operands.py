"""The gpu-reset Job's `operands` sidecar: takes what holds the GPUs off the node for the
reset, and puts it back afterwards. Python standard library only (it runs in gpuheal's
image), talking to the API server with the pod's ServiceAccount token.

The NVIDIA GPU operator deploys each of its DaemonSets on nodes labelled
`nvidia.com/gpu.deploy.<operand>=true` and removes its pod from a node whose label says
`false`; gpuheal's agent (with NVML) keeps off nodes labelled `gpuheal.io/gpu-reset`. So:

  hold     stop, then wait for SIGTERM (Kubernetes sends it when the reset container has
           ended, or when the Job is stopped), then restore;
  stop     record the labels as they are in the node's annotation
           gpuheal.io/gpu-reset-labels-before (kept when already there: a Job run again
           after a crash restores the labels from before the first), set the operands'
           labels to false and gpuheal.io/gpu-reset=<incident>, and wait until no pod of
           theirs is left on the node; then write $GPUHEAL_STATE_DIR/operands-stopped (or
           operands-failed, with why);
  restore  put the recorded labels back (a label that was absent is removed again) and
           drop the annotation; nothing to do without it.

Environment: NODE_NAME, GPUHEAL_INCIDENT (set by gpuheal), GPU_OPERANDS (operand names,
comma-separated), GPU_OPERAND_PODS (label selectors of their pods, `;`-separated: a pod that
matches one and runs on the node is waited for), GPUHEAL_OPERANDS_WAIT_SECONDS;
GPUHEAL_KUBE_API and GPUHEAL_KUBE_TOKEN_FILE (tests) in place of the in-cluster address and
token.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

SA = Path("/var/run/secrets/kubernetes.io/serviceaccount")
BEFORE = "gpuheal.io/gpu-reset-labels-before"
RESETTING = "gpuheal.io/gpu-reset"
DEPLOY = "nvidia.com/gpu.deploy."


class Api:
    def __init__(self) -> None:
        host, port = (
            os.environ.get("KUBERNETES_SERVICE_HOST"),
            os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
        )
        self.base = os.environ.get("GPUHEAL_KUBE_API") or f"https://{host}:{port}"
        self.token_file = Path(os.environ.get("GPUHEAL_KUBE_TOKEN_FILE") or SA / "token")
        ca = SA / "ca.crt"
        self.tls = ssl.create_default_context(cafile=str(ca)) if ca.exists() else None

    def call(self, method: str, path: str, body: Any = None) -> Any:
        if not self.base.startswith(("https://", "http://")):
            raise ValueError(f"API server address {self.base!r} is not http(s)")
        headers = {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/merge-patch+json"
        request = urllib.request.Request(  # noqa: S310 - http(s) only, checked above
            self.base + path, data=data, method=method, headers=headers
        )
        with urllib.request.urlopen(request, timeout=30, context=self.tls) as resp:  # noqa: S310
            return json.loads(resp.read() or b"{}")


def _items(name: str, sep: str) -> list[str]:
    return [v.strip() for v in os.environ.get(name, "").split(sep) if v.strip()]


def _node_path(node: str) -> str:
    return f"/api/v1/nodes/{urllib.parse.quote(node)}"


def _say(text: str) -> None:
    incident, node = os.environ.get("GPUHEAL_INCIDENT", "?"), os.environ.get("NODE_NAME", "?")
    print(f"gpuheal {incident} on {node}: {text}", flush=True)


def stop(api: Api, node: str, state: Path) -> None:
    body = api.call("GET", _node_path(node))
    meta = body.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    keys = [DEPLOY + o for o in _items("GPU_OPERANDS", ",")] + [RESETTING]
    patch: dict[str, Any] = {"labels": {k: "false" for k in keys[:-1]}}
    patch["labels"][RESETTING] = (os.environ.get("GPUHEAL_INCIDENT") or "true")[:63]
    if BEFORE not in annotations:
        patch["annotations"] = {BEFORE: json.dumps({k: labels.get(k) for k in keys})}
    api.call("PATCH", _node_path(node), {"metadata": patch})
    _say(f"labelled {', '.join(f'{k}={v}' for k, v in patch['labels'].items())}")
    selectors = _items("GPU_OPERAND_PODS", ";")
    wait = float(os.environ.get("GPUHEAL_OPERANDS_WAIT_SECONDS", "300"))
    deadline = time.monotonic() + wait
    field = urllib.parse.quote(f"spec.nodeName={node}")
    while True:
        left = []
        for selector in selectors:
            query = f"fieldSelector={field}&labelSelector={urllib.parse.quote(selector)}"
            pods = api.call("GET", f"/api/v1/pods?{query}").get("items") or []
            left += [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods]
        if not left:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods still on the node after {wait:.0f}s: {', '.join(left)}")
        time.sleep(1)
    (state / "operands-stopped").write_text(
        f"GPU operands off the node ({', '.join(selectors) or 'none named'})\n"
    )


def restore(api: Api, node: str) -> None:
    body = api.call("GET", _node_path(node))
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if BEFORE not in annotations:
        _say("nothing to restore")
        return
    before = json.loads(annotations[BEFORE])
    patch = {"metadata": {"labels": before, "annotations": {BEFORE: None}}}
    api.call("PATCH", _node_path(node), patch)
    _say(f"labels restored: {', '.join(f'{k}={v}' for k, v in before.items())}")


def hold(api: Api, node: str, state: Path) -> None:
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        stop(api, node, state)
    except Exception as exc:
        (state / "operands-failed").write_text(f"GPU operands not stopped: {exc}\n")
        _say(f"GPU operands not stopped: {exc}")
    while not done.wait(1.0):
        pass
    # Within the pod's termination grace (60 s): a node left with the operands off would
    # keep its GPUs unallocatable (the annotation still says what to put back).
    for attempt in range(10):
        try:
            restore(api, node)
            return
        except Exception as exc:  # retried, then raised
            _say(f"labels not restored yet ({exc})")
            if attempt == 9:
                raise
            time.sleep(3)


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "hold"
    node = os.environ["NODE_NAME"]
    state = Path(os.environ.get("GPUHEAL_STATE_DIR", "/run/gpuheal"))
    api = Api()
    if command == "hold":
        hold(api, node, state)
    elif command == "stop":
        stop(api, node, state)
    elif command == "restore":
        restore(api, node)
    else:
        print(f"usage: {argv[0]} hold|stop|restore", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
