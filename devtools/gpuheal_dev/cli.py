"""`gpuheal-dev`: the local sandbox (kube-apiserver + kwok GPU nodes + Slurm) and the demo."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from gpuheal_dev.sandbox import Sandbox, SandboxConfig, SandboxError, default_root
from gpuheal_dev.sandbox.slurmroot import DEFAULT_SLURM, HOST_SLURM, SLURM_VERSIONS


def _sandbox_up(args: argparse.Namespace) -> int:
    config = SandboxConfig(
        root=args.dir,
        gpu_nodes=args.nodes,
        spare_nodes=args.spares,
        slurm=not args.no_slurm,
        slurm_restd=args.restd,
        real_node=args.real_node or bool(args.image),
        real_node_images=tuple(args.image),
        slurm_version=args.slurm,
    )
    sandbox = Sandbox.up(config)
    _print_summary(sandbox)
    return 0


def _print_summary(sandbox: Sandbox) -> None:
    cp = sandbox.control_plane
    print(f"sandbox under {sandbox.root} (up in {sandbox.timings.get('total_s', 0):.1f}s)")
    print(f"  kube-apiserver  {cp.server}")
    for name, pid in cp.pids.items():
        print(f"  {name:<24} pid {pid:<8} log {cp.log_path(name)}")
    print(f"  export KUBECONFIG={sandbox.kubeconfig}")
    slurm = sandbox.slurm
    # that Slurm's own sbatch/squeue/scontrol first (wrappers into its root, when it has one)
    slurm_bin = f"{slurm.bin_dir}:" if slurm is not None and slurm.bin_dir else ""
    print(f"  export PATH={slurm_bin}{cp.bin_dir}:$PATH")
    if slurm is not None:
        print(f"  export SLURM_CONF={slurm.conf_path}")
        print(f"  slurm {slurm.release}" + (f" from {slurm.bin_dir}" if slurm.bin_dir else ""))
        if slurm.restd_url:
            print(f"  slurmrestd {slurm.restd_url}", end="")
            token = slurm.restd_token_file
            print(f" (JWT for root in {token})" if token else "")
    if sandbox.real_node is not None:
        node = sandbox.real_node
        print(f"  real node {node.name}: containerd socket {node.socket}")
        for name, pid in node.pids.items():
            print(f"  {name:<24} pid {pid:<8} log {node.layout.log_path(name)}")


def _sandbox_down(args: argparse.Namespace) -> int:
    sandbox = Sandbox.load(args.dir)
    if sandbox is None:
        print(f"no sandbox under {args.dir}")
        return 0
    sandbox.down()
    print(f"sandbox under {args.dir} stopped")
    return 0


def _sandbox_status(args: argparse.Namespace) -> int:
    sandbox = Sandbox.load(args.dir)
    if sandbox is None:
        print(f"no sandbox under {args.dir}")
        return 1
    running = sandbox.control_plane.running()
    if not running:
        print("control plane: stopped")
    for name, up in running.items():
        print(f"  {name:<24} {'running' if up else 'STOPPED'}")
    ok = bool(running) and all(running.values())
    if sandbox.slurm is not None:
        status = sandbox.slurm.status()
        daemons_up = bool(status.daemons) and all(d.alive for d in status.daemons)
        print(f"slurm: {'running' if daemons_up else 'stopped'}")
        for d in status.daemons:
            print(f"  {d.name:<24} {'running' if d.alive else 'STOPPED'}")
        for node, state in status.nodes.items():
            print(f"  node {node:<19} {state}")
        ok = ok and daemons_up
    if sandbox.real_node is not None:
        from gpuheal_dev.sandbox._proc import pid_alive

        node = sandbox.real_node
        alive = {name: pid_alive(pid) for name, pid in node.pids.items()}
        node_up = bool(alive) and all(alive.values())
        print(f"real node {node.name}: {'running' if node_up else 'stopped'}")
        for name, up in alive.items():
            print(f"  {name:<24} {'running' if up else 'STOPPED'}")
        ok = ok and node_up
    if ok:
        _print_summary(sandbox)
    return 0 if ok else 1


def _demo(args: argparse.Namespace) -> int:
    from gpuheal_dev.demo import run_demo

    return run_demo(args.dir, args.fault)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuheal-dev", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    sandbox = sub.add_parser("sandbox", help="local Kubernetes (kwok GPU nodes) + Slurm")
    sandbox_sub = sandbox.add_subparsers(dest="action", required=True)
    up = sandbox_sub.add_parser("up", help="start the sandbox")
    up.add_argument("--nodes", type=int, default=4, help="GPU nodes in service")
    up.add_argument("--spares", type=int, default=1, help="spare GPU nodes (reserve pool)")
    up.add_argument("--no-slurm", action="store_true", help="Kubernetes only")
    up.add_argument("--restd", action="store_true", help="also start slurmrestd")
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also one GPU node run by a real kubelet + containerd (pods there really run; "
        "needs root and `make realnode-deps`)",
    )
    up.add_argument(
        "--image",
        type=Path,
        action="append",
        default=[],
        metavar="TAR",
        help="an image tar to import into the real node's containerd (repeatable; implies "
        "--real-node)",
    )
    up.add_argument(
        "--slurm",
        choices=SLURM_VERSIONS,
        default=DEFAULT_SLURM,
        help=f"Slurm release (default {DEFAULT_SLURM}: Debian unstable's in a root of its own, "
        f"built once into ~/.cache/gpuheal/slurm-roots; {HOST_SLURM}: the host's packages)",
    )
    up.set_defaults(func=_sandbox_up)
    sandbox_sub.add_parser("down", help="stop the sandbox").set_defaults(func=_sandbox_down)
    sandbox_sub.add_parser(
        "status", help="which sandbox processes run (exit 1 if any is down)"
    ).set_defaults(func=_sandbox_status)
    for p in sandbox_sub.choices.values():
        p.add_argument("--dir", type=Path, default=default_root(), help="sandbox directory")

    demo = sub.add_parser("demo", help="the whole story on the sandbox (used by `make demo`)")
    demo.add_argument(
        "--dir",
        type=Path,
        default=default_root() / "demo",
        help="working directory of the demo (its sandbox, logs, job output)",
    )
    demo.add_argument(
        "--fault",
        choices=("dies", "hangs", "gentle"),
        default="dies",
        help="what the fault does to the job: its process dies with the GPU (default), hangs "
        "in the driver, or nothing (gentle: it checkpoints on the signal, nothing lost)",
    )
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        rc: int = args.func(args)
    except SandboxError as exc:
        print(f"gpuheal-dev: {exc}", file=sys.stderr)
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
