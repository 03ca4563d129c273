"""The batch script that runs the demo job under Slurm.

``exec`` makes the Python process *be* the batch shell, so a signal sent with
``scancel --batch`` or ``--full`` (the bridge's checkpoint signal) or Slurm's SIGTERM on requeue
reaches the training loop itself; a bash parent without a trap would die on SIGUSR1 instead.
No ``srun``: one task, one (fake) GPU. BLAS threads are pinned to 1 so that the numbers do not
depend on how many cores the node offers (and the run stays bit-identical across nodes).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuheal_dev.demo_job.model import ModelConfig
from gpuheal_dev.demo_job.train import RunConfig


def job_argv(cfg: ModelConfig, run: RunConfig, python: str | None = None) -> list[str]:
    """The ``python -m gpuheal_dev.demo_job ...`` command for this config."""
    argv = [
        python or sys.executable,
        "-m",
        "gpuheal_dev.demo_job",
        "--workdir",
        str(run.workdir),
        "--steps",
        str(run.steps),
        "--ckpt-every",
        str(run.ckpt_every),
        "--step-seconds",
        repr(run.step_seconds),
        "--keep",
        str(run.keep),
    ]
    defaults = ModelConfig()
    for name, value in cfg.to_dict().items():
        if value != getattr(defaults, name):
            argv += [f"--{name.replace('_', '-')}", repr(value)]
    return argv


def render_sbatch(
    cfg: ModelConfig,
    run: RunConfig,
    *,
    job_name: str = "gpuheal-demo",
    output: str | None = None,
    python: str | None = None,
    extra_directives: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> str:
    """A batch script: requeueable, appending its output across restarts, one GPU.

    ``output`` defaults to ``<workdir>/slurm-%j.out``; ``extra_directives`` are added as
    ``#SBATCH`` lines (e.g. ``"--partition=main"``); ``env`` is exported before the job runs
    (e.g. the sandbox's fake GPUs).
    """
    out = output or str(Path(run.workdir) / "slurm-%j.out")
    directives = [
        f"--job-name={job_name}",
        "--requeue",
        "--open-mode=append",
        "--gres=gpu:1",
        "--ntasks=1",
        f"--output={out}",
        *extra_directives,
    ]
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives)]
    lines += [
        "# gpuheal demo job: resumes from its newest checkpoint after a requeue",
        "export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1",
        *(f"export {k}={shlex.quote(v)}" for k, v in sorted((env or {}).items())),
        'echo "batch start $(date -Is) host=$SLURMD_NODENAME job=$SLURM_JOB_ID'
        ' restart=${SLURM_RESTART_COUNT:-0} gpus=${CUDA_VISIBLE_DEVICES:-none}"',
        "exec " + shlex.join(job_argv(cfg, run, python)),
    ]
    return "\n".join(lines) + "\n"


def write_sbatch(
    path: Path,
    cfg: ModelConfig,
    run: RunConfig,
    *,
    job_name: str = "gpuheal-demo",
    output: str | None = None,
    python: str | None = None,
    extra_directives: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Path:
    """``render_sbatch`` into an executable file at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_sbatch(
        cfg,
        run,
        job_name=job_name,
        output=output,
        python=python,
        extra_directives=extra_directives,
        env=env,
    )
    path.write_text(text)
    path.chmod(0o755)
    return path
