"""``python -m gpuheal_dev.demo_job``: train (resuming), or print its sbatch script (--sbatch)."""

from __future__ import annotations

import time

PROC_START = time.time()  # before numpy is imported: lets the benchmarks see process start

import argparse  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    from gpuheal_dev.demo_job.model import ModelConfig

    d = ModelConfig()
    p = argparse.ArgumentParser(
        prog="python -m gpuheal_dev.demo_job",
        description="Tiny NumPy MLP that checkpoints atomically and resumes after a requeue.",
    )
    p.add_argument("--workdir", type=Path, required=True, help="checkpoints, metrics, model")
    p.add_argument("--steps", type=int, default=300, help="train until this step")
    p.add_argument("--ckpt-every", type=int, default=20, help="checkpoint every K steps")
    p.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step")
    p.add_argument("--keep", type=int, default=2, help="checkpoints to keep")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--n-samples", type=int, default=d.n_samples)
    p.add_argument("--n-features", type=int, default=d.n_features)
    p.add_argument("--n-classes", type=int, default=d.n_classes)
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--momentum", type=float, default=d.momentum)
    p.add_argument("--jitter", type=float, default=d.jitter)
    p.add_argument("--sbatch", action="store_true", help="print the batch script and exit")
    p.add_argument("--job-name", default="gpuheal-demo", help="with --sbatch")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from gpuheal_dev.demo_job.model import ModelConfig
    from gpuheal_dev.demo_job.sbatch import render_sbatch
    from gpuheal_dev.demo_job.train import RunConfig, train

    args = build_parser().parse_args(argv)
    cfg = ModelConfig(
        seed=args.seed,
        n_samples=args.n_samples,
        n_features=args.n_features,
        n_classes=args.n_classes,
        hidden=args.hidden,
        batch_size=args.batch_size,
        lr=args.lr,
        momentum=args.momentum,
        jitter=args.jitter,
    )
    run = RunConfig(
        workdir=args.workdir.absolute(),
        steps=args.steps,
        ckpt_every=args.ckpt_every,
        step_seconds=args.step_seconds,
        keep=args.keep,
    )
    if args.sbatch:
        sys.stdout.write(render_sbatch(cfg, run, job_name=args.job_name))
        return 0
    outcome = train(cfg, run, proc_start=PROC_START, say=lambda m: print(m, flush=True))
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
