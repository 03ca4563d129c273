"""The training loop: resume, train, checkpoint, react to signals, write the final model.

Signals (the handlers only set a flag; the loop acts at the next step boundary, which is at
most one step's compute away because the step sleep is cut short):

- ``SIGUSR1``: write a checkpoint now and keep training (what the bridge's optional checkpoint
  signal and ``sbatch --signal=B:USR1@T`` send);
- ``SIGTERM`` / ``SIGINT``: write a checkpoint now and exit 143 / 130. ``scontrol requeue`` and
  ``scancel`` send SIGTERM and allow ``KillWait`` seconds before SIGKILL, so a requeued job
  loses no finished step; only a hard kill (node lost, SIGKILL) loses the steps since the last
  interval checkpoint. Exiting non-zero keeps an unfinished run from looking COMPLETED.

The sandbox's fake GPUs (``GPUHEAL_FAKE_GPUS``, see ``gpuheal_dev.sandbox.faults``) are
looked at before every step, as a CUDA call would touch the GPU: ``lost`` fails the step the
way CUDA does when the GPU fell off the bus (a ``gpu_error`` record, then the process exits 1
with the error: no checkpoint, the steps since the last one are lost); ``hung`` blocks every
catchable signal and sleeps (only SIGKILL ends it); ``wedged`` blocks in uninterruptible sleep.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from gpuheal_dev.demo_job.checkpoint import (
    TrainState,
    atomic_savez,
    load_latest,
    load_state,
    save_checkpoint,
    state_arrays,
)
from gpuheal_dev.demo_job.metrics import MetricsWriter
from gpuheal_dev.demo_job.model import (
    PARAM_NAMES,
    ModelConfig,
    accuracy,
    init_params,
    jitter_rng,
    loss,
    make_dataset,
    sgd_step,
    zeros_like,
)
from gpuheal_dev.sandbox.faults import GpuState, read_gpu_state

log = logging.getLogger("gpuheal_dev.demo_job")

MODEL_FILE = "model.npz"
METRICS_FILE = "metrics.jsonl"
#: Longest uninterrupted sleep; bounds how late a signal is acted on.
_SLEEP_SLICE = 0.02
_EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}


@dataclass(frozen=True)
class RunConfig:
    """How this process runs (may change between restarts, unlike ``ModelConfig``)."""

    workdir: Path
    steps: int = 300
    ckpt_every: int = 20
    step_seconds: float = 0.0
    keep: int = 2

    def __post_init__(self) -> None:
        if self.steps < 1 or self.ckpt_every < 1 or self.step_seconds < 0 or self.keep < 1:
            raise ValueError("steps, ckpt_every and keep must be >= 1, step_seconds >= 0")


class GpuLost(RuntimeError):
    """The (fake) GPU fell off the bus under a step: what CUDA raises."""


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    step: int
    resume_step: int
    restart: int
    reason: str  # "done", "already done", "SIGTERM", ...


class _Signals:
    def __init__(self) -> None:
        self.checkpoint_now: list[str] = []
        self.stop: signal.Signals | None = None
        self._old: dict[signal.Signals, object] = {}

    def _on(self, signum: int, _frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        self.checkpoint_now.append(sig.name)
        if sig in _EXIT_CODES:
            self.stop = sig

    def install(self) -> None:
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._on)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]


def slurm_identity(env: dict[str, str] | None = None) -> dict[str, object]:
    e = os.environ if env is None else env
    return {
        "host": e.get("SLURMD_NODENAME") or socket.gethostname(),
        "restart": int(e.get("SLURM_RESTART_COUNT") or 0),
        "job_id": e.get("SLURM_JOB_ID"),
    }


def train(
    cfg: ModelConfig,
    run: RunConfig,
    *,
    env: dict[str, str] | None = None,
    proc_start: float | None = None,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.time,
    handle_signals: bool = True,
) -> Outcome:
    """Train to ``run.steps``, resuming from ``run.workdir``'s newest checkpoint.

    ``env`` stands in for ``os.environ`` (SLURMD_NODENAME, SLURM_RESTART_COUNT, SLURM_JOB_ID);
    ``handle_signals=False`` leaves the process's signal handlers alone (tests).
    """
    run.workdir.mkdir(parents=True, exist_ok=True)
    trainer = _Trainer(cfg, run, slurm_identity(env), say, clock)
    trainer.env = os.environ if env is None else env
    try:
        done = trainer.already_done(proc_start)
        if done is not None:
            return done
        trainer.resume(proc_start)
        sigs = _Signals()
        if handle_signals:
            sigs.install()
        try:
            return trainer.loop(sigs)
        finally:
            if handle_signals:
                sigs.restore()
    finally:
        trainer.metrics.close()


class _Trainer:
    def __init__(
        self,
        cfg: ModelConfig,
        run: RunConfig,
        ident: dict[str, object],
        say: Callable[[str], None],
        clock: Callable[[], float],
    ) -> None:
        self.cfg, self.run, self.ident, self.say, self.clock = cfg, run, ident, say, clock
        self.restart = int(str(ident["restart"]))
        self.metrics = MetricsWriter(run.workdir / METRICS_FILE, ident)
        self.model_path = run.workdir / MODEL_FILE
        self.data = make_dataset(cfg)
        params = init_params(cfg)
        self.rng = jitter_rng(cfg)
        rng_state = dict(self.rng.bit_generator.state)
        self.state = TrainState(cfg, 0, params, zeros_like(params), rng_state)
        self.resume_step = 0
        self.last_ckpt = 0
        self.env: Mapping[str, str] = os.environ

    def already_done(self, proc_start: float | None) -> Outcome | None:
        """A restart after the final model was written: report it, train nothing."""
        if not self.model_path.exists():
            return None
        done = load_state(self.model_path)
        if done.config != self.cfg or done.step < self.run.steps:
            return None
        self.say(f"START host={self.ident['host']} restart_count={self.restart}: already done")
        now = self.clock()
        self.metrics.write(
            "start",
            now,
            resume_step=done.step,
            steps=self.run.steps,
            checkpoint=str(self.model_path),
            proc_start=proc_start,
        )
        self.metrics.write(
            "done",
            now,
            step=done.step,
            model=str(self.model_path),
            loss=round(loss(done.params, self.data), 6),
            accuracy=round(accuracy(done.params, self.data), 6),
        )
        return Outcome(0, done.step, done.step, self.restart, "already done")

    def resume(self, proc_start: float | None) -> None:
        found = load_latest(self.run.workdir, self.cfg)
        ckpt_name = None
        if found is not None:
            self.state, ckpt = found
            ckpt_name = str(ckpt)
            self.rng.bit_generator.state = self.state.rng_state
        self.resume_step = self.last_ckpt = self.state.step
        self.say(
            f"START host={self.ident['host']} restart_count={self.restart} "
            f"job={self.ident['job_id']} resume_step={self.resume_step} of {self.run.steps}"
            + (f" from {ckpt_name}" if ckpt_name else " (fresh start)")
        )
        self.metrics.write(
            "start",
            self.clock(),
            resume_step=self.resume_step,
            steps=self.run.steps,
            checkpoint=ckpt_name,
            proc_start=proc_start,
        )

    def _meta(self) -> dict[str, object]:
        return {"host": self.ident["host"], "restart": self.restart}

    def checkpoint(self, reason: str) -> None:
        t0 = time.perf_counter()
        self.state.rng_state = dict(self.rng.bit_generator.state)
        path = save_checkpoint(
            self.run.workdir, self.state, keep=self.run.keep, extra_meta=self._meta()
        )
        seconds = time.perf_counter() - t0
        self.last_ckpt = self.state.step
        self.metrics.write(
            "checkpoint",
            self.clock(),
            step=self.state.step,
            reason=reason,
            seconds=round(seconds, 6),
            path=str(path),
        )
        if reason != "interval":
            self.say(f"CHECKPOINT step={self.state.step} reason={reason} ({seconds * 1000:.1f} ms)")

    def loop(self, sigs: _Signals) -> Outcome:
        state, run = self.state, self.run
        while state.step < run.steps:
            step = state.step + 1
            self.gpu_call(step)
            batch_loss = sgd_step(self.cfg, state.params, state.velocity, self.data, step, self.rng)
            state.step = step
            state.losses.append(batch_loss)
            self.metrics.write("step", self.clock(), step=step, loss=round(batch_loss, 6))
            if step % run.ckpt_every == 0:
                self.checkpoint("interval")
            if _sleep_or_signal(run.step_seconds, sigs):
                stopped = self.on_signals(sigs)
                if stopped is not None:
                    return stopped
        return self.finish()

    def gpu_call(self, step: int) -> None:
        """What the GPU does to this step (the sandbox's fake GPU state for this node)."""
        gpu, wedge = read_gpu_state(self.env)
        if gpu is GpuState.OK:
            return
        if gpu is GpuState.LOST:
            error = "CUDA error: unspecified launch failure (GPU has fallen off the bus)"
            self.metrics.write("gpu_error", self.clock(), step=step, error=error)
            self.metrics.sync()
            raise GpuLost(error)
        self.metrics.write("gpu_hang", self.clock(), step=step, state=gpu.value)
        self.metrics.sync()
        self.say(f"step {step}: stuck in the driver ({gpu.value})")
        if gpu is GpuState.WEDGED and wedge:
            os.stat(wedge)  # uninterruptible: not even SIGKILL gets it out
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:  # a CUDA sync that never returns: only SIGKILL ends it
            time.sleep(3600)

    def on_signals(self, sigs: _Signals) -> Outcome | None:
        reasons = sorted(set(sigs.checkpoint_now))
        sigs.checkpoint_now.clear()
        for name in reasons:
            self.metrics.write("signal", self.clock(), signal=name, step=self.state.step)
        if self.last_ckpt != self.state.step:
            self.checkpoint("+".join(reasons))
        if sigs.stop is None:
            return None
        name = sigs.stop.name
        self.say(f"EXIT on {name} at step {self.state.step}: checkpointed, bye")
        self.metrics.write("exit", self.clock(), step=self.state.step, reason=name)
        self.metrics.sync()
        return Outcome(
            _EXIT_CODES[sigs.stop], self.state.step, self.resume_step, self.restart, name
        )

    def finish(self) -> Outcome:
        state = self.state
        if self.last_ckpt != state.step:
            self.checkpoint("final")
        state.rng_state = dict(self.rng.bit_generator.state)
        atomic_savez(self.model_path, state_arrays(state, self._meta()))
        final_loss = loss(state.params, self.data)
        acc = accuracy(state.params, self.data)
        self.say(
            f"DONE step={state.step} loss={final_loss:.4f} accuracy={acc:.3f} "
            f"model={self.model_path}"
        )
        self.metrics.write(
            "done",
            self.clock(),
            step=state.step,
            model=str(self.model_path),
            loss=round(final_loss, 6),
            accuracy=round(acc, 6),
        )
        self.metrics.sync()
        return Outcome(0, state.step, self.resume_step, self.restart, "done")


def _sleep_or_signal(seconds: float, sigs: _Signals) -> bool:
    """Sleep ``seconds`` in short slices; True as soon as a signal asked for something."""
    if seconds <= 0 or sigs.checkpoint_now:
        return bool(sigs.checkpoint_now)
    deadline = time.monotonic() + seconds
    while not sigs.checkpoint_now:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, _SLEEP_SLICE))
    return True


def load_model(path: Path) -> dict[str, object]:
    """The final model's arrays (``p_w1``, ...) and step, for comparisons."""
    state = load_state(path)
    return {"step": state.step, **{f"p_{n}": state.params[n] for n in PARAM_NAMES}}
