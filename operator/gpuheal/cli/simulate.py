"""`gpuheal simulate xid|condition`: produce exactly what a real GPU fault producer would.

An XID becomes what node-problem-detector's kernel monitor writes when it matches an
``NVRM: Xid`` line: a Warning Event on the Node (reason ``GpuXid``, component
``kernel-monitor``, message = the kernel line) and, with ``--condition``, a permanent node
condition ``GpuXid=True`` (reason ``Xid<N>``, message = the kernel line). The operator reads
both through the same XID parser it uses for real producers; nothing here is special-cased.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any, cast

from kubernetes import client

from gpuheal.cli._common import add_cluster_flags
from gpuheal.xid.parse import XID_CONDITION_TYPE, XID_EVENT_REASON, format_kernel_line

EVENT_REASON = XID_EVENT_REASON
CONDITION_TYPE = XID_CONDITION_TYPE
COMPONENT = "kernel-monitor"

# Kernel-log tails per XID (as NVIDIA drivers print them); others get a generic text.
_TAILS = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "ch 0000000a, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f2a_2c000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    43: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
    "at partition 0, subpartition 0.",
    62: "Internal micro-controller halt (0x6a0, 0x0, 0x0)",
    63: "Row Remapper: New row (0x00000000023d8000) Marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row (0x00000000023d8000)",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76",
    120: "GSP task exception: TRAP_PC 0x1234",
}


def kernel_line(
    xid: int, *, pci: str = "0000:3b:00", pid: int | None = 4242, process: str = "python"
) -> str:
    """The line ``dmesg`` shows for this XID (current drivers' format)."""
    tail = _TAILS.get(xid, f"Xid {xid} reported by the driver.")
    return format_kernel_line(xid, pci, tail, pid=pid, process=process)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def xid_event(node: dict[str, Any], message: str, *, namespace: str = "default") -> dict[str, Any]:
    """The Event node-problem-detector's kernel monitor posts for a matched line."""
    meta = node["metadata"]
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": meta["name"],
            "uid": meta.get("uid", meta["name"]),
        },
        "reason": EVENT_REASON,
        "message": message,
        "type": "Warning",
        "source": {"component": COMPONENT, "host": meta["name"]},
        "reportingComponent": COMPONENT,
        "reportingInstance": meta["name"],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def condition_patch(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
    """Strategic-merge patch of ``status.conditions`` (merge key ``type``: other conditions,
    the kubelet's included, are untouched)."""
    now = _now()
    return {
        "status": {
            "conditions": [
                {
                    "type": type_,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ]
        }
    }


def simulate_xid(
    core: client.CoreV1Api,
    node: str,
    xid: int,
    *,
    pci: str = "0000:3b:00",
    condition: bool = False,
    event: bool = True,
    namespace: str = "default",
    message: str | None = None,
) -> dict[str, Any]:
    """Inject one XID on ``node``; returns what was created (the Event's name, the line)."""
    body = core.api_client.sanitize_for_serialization(core.read_node(node))
    line = message or kernel_line(xid, pci=pci)
    out: dict[str, Any] = {"node": node, "xid": xid, "line": line}
    if event:
        created = core.create_namespaced_event(
            namespace, cast(client.CoreV1Event, xid_event(body, line, namespace=namespace))
        )
        out["event"] = f"{namespace}/{created.metadata.name}"
        out["event_uid"] = created.metadata.uid
    if condition:
        core.patch_node_status(node, condition_patch(CONDITION_TYPE, "True", f"Xid{xid}", line))
        out["condition"] = CONDITION_TYPE
    return out


def simulate_condition(
    core: client.CoreV1Api, node: str, *, type_: str, status: str, reason: str, message: str
) -> dict[str, Any]:
    core.patch_node_status(node, condition_patch(type_, status, reason, message))
    return {"node": node, "condition": type_, "status": status, "reason": reason}


def _core(args: argparse.Namespace) -> client.CoreV1Api:
    from gpuheal.cli._cluster import api

    return client.CoreV1Api(api(args.kubeconfig, args.context))


def _run_xid(args: argparse.Namespace) -> int:
    from gpuheal.cli._cluster import said_plainly

    core = _core(args)
    for node in args.node:
        with said_plainly(f"node {node}"):
            out = simulate_xid(
                core,
                node,
                args.xid,
                pci=args.gpu,
                condition=args.condition,
                event=not args.no_event,
                namespace=args.event_namespace,
                message=args.message,
            )
        what = " and ".join(k for k in ("event", "condition") if k in out)
        print(f"{node}: XID {args.xid} injected ({what}): {out['line']}")
    return 0


def _run_condition(args: argparse.Namespace) -> int:
    from gpuheal.cli._cluster import said_plainly

    core = _core(args)
    for node in args.node:
        with said_plainly(f"node {node}"):
            simulate_condition(
                core,
                node,
                type_=args.type,
                status=args.status,
                reason=args.reason,
                message=args.message,
            )
        print(f"{node}: condition {args.type}={args.status} ({args.reason})")
    return 0


def add_arguments(sim: argparse.ArgumentParser) -> None:
    """`gpuheal simulate xid ...` and `gpuheal simulate condition ...`."""
    sub = sim.add_subparsers(dest="simulate", required=True, metavar="WHAT")

    xid = sub.add_parser("xid", help="an XID on a node: Event (and optionally the condition)")
    xid.add_argument("--node", action="append", required=True, help="node name (repeatable)")
    xid.add_argument("--xid", type=int, required=True, help="XID code, e.g. 79")
    xid.add_argument("--gpu", default="0000:3b:00", help="PCI bus id of the GPU")
    xid.add_argument("--condition", action="store_true", help=f"also set {CONDITION_TYPE}=True")
    xid.add_argument("--no-event", action="store_true", help="only the condition")
    xid.add_argument("--message", help="the kernel line to report (default: a driver line)")
    xid.add_argument(
        "--event-namespace",
        default="default",
        metavar="NS",
        help="namespace of the Event (default: default, where Node Events belong)",
    )
    xid.set_defaults(func=_run_xid)

    cond = sub.add_parser("condition", help="set a node condition (NPD / GPU operator style)")
    cond.add_argument("--node", action="append", required=True, help="node name (repeatable)")
    cond.add_argument("--type", required=True, help="condition type, e.g. GpuXid")
    cond.add_argument(
        "--status", default="True", choices=["True", "False", "Unknown"], help="its status"
    )
    cond.add_argument("--reason", default="Simulated", help="its reason (one CamelCase word)")
    cond.add_argument("--message", default="set by gpuheal simulate", help="its message")
    cond.set_defaults(func=_run_condition)

    for p in (xid, cond):
        add_cluster_flags(p)
