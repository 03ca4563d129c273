"""A tiny training job that really trains, checkpoints atomically and resumes after a requeue.

It is the workload of ``make demo``, the end-to-end test and the recovery benchmarks: an MLP
(16 -> 32 tanh -> 4, softmax) learning a synthetic dataset with SGD + momentum, in **NumPy on
the CPU**. PyTorch would be the realistic choice, but it is a large download (hundreds of MiB for
the CPU-only wheel, gigabytes with the default wheel's CUDA libraries) and slow to import; on a
fresh 2-core CI machine that costs more than the whole demo, and the story here is
checkpoint/resume under Slurm, not the framework. The resume
logic imitates the usual PyTorch pattern (Crusoe's self-healing Slurm guide, KempnerForge's
launch scripts): ``#SBATCH --requeue --open-mode=append``, resume from the newest checkpoint on
start, ``SLURM_RESTART_COUNT`` logged, a signal handler that checkpoints before Slurm kills us.

    python -m gpuheal_dev.demo_job --workdir DIR --steps 300 --ckpt-every 20 --step-seconds 0.15
    python -m gpuheal_dev.demo_job --workdir DIR ... --sbatch > job.sh   # the batch script

Files in ``DIR``: ``ckpt/step-NNNNNNNN.npz`` (atomic; newest two kept), ``metrics.jsonl``
(JSON lines, see :mod:`gpuheal_dev.demo_job.metrics`), ``model.npz`` (final), ``slurm-<job>.out``.
Determinism: data order is a function of (seed, step), the augmentation RNG's state is in the
checkpoint, so a resumed run ends with a model bit-identical to an uninterrupted one.
"""

from gpuheal_dev.demo_job.checkpoint import CheckpointMismatch, TrainState, load_latest, load_state
from gpuheal_dev.demo_job.metrics import Run, read_records, split_runs, steps_lost
from gpuheal_dev.demo_job.model import ModelConfig
from gpuheal_dev.demo_job.sbatch import job_argv, render_sbatch, write_sbatch
from gpuheal_dev.demo_job.train import METRICS_FILE, MODEL_FILE, Outcome, RunConfig, train

__all__ = [
    "METRICS_FILE",
    "MODEL_FILE",
    "CheckpointMismatch",
    "ModelConfig",
    "Outcome",
    "Run",
    "RunConfig",
    "TrainState",
    "job_argv",
    "load_latest",
    "load_state",
    "read_records",
    "render_sbatch",
    "split_runs",
    "steps_lost",
    "train",
    "write_sbatch",
]
