"""Atomic checkpoints: ``<workdir>/ckpt/step-00000040.npz``, newest first on resume.

A checkpoint is written to a temporary file in the same directory, flushed and fsynced, then
``os.replace``d over its final name and the directory fsynced: a crash (or SIGKILL after
Slurm's KillWait) leaves either the previous checkpoint or the new one, never a torn file.
The last ``keep`` checkpoints are kept; on resume the newest one that loads is used (a
damaged newest file falls back to the one before it instead of restarting from step 0).

The ``.npz`` holds arrays only (loaded with ``allow_pickle=False``): the parameters
(``p_<name>``), the optimizer's momentum (``v_<name>``), the loss history, and a JSON string
with the step, the model config, the augmentation RNG's state and provenance.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpuheal_dev.demo_job.model import PARAM_NAMES, Array, ModelConfig

log = logging.getLogger("gpuheal_dev.demo_job")

FORMAT_VERSION = 1
_NAME_RE = re.compile(r"^step-(\d{8})\.npz$")


class CheckpointMismatch(RuntimeError):
    """The checkpoint belongs to a run with a different model config."""


@dataclass
class TrainState:
    """Everything a resumed run needs to continue bit-identically."""

    config: ModelConfig
    step: int
    params: dict[str, Array]
    velocity: dict[str, Array]
    rng_state: dict[str, Any]
    #: minibatch loss of steps 1..step
    losses: list[float] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def checkpoint_dir(workdir: Path) -> Path:
    return workdir / "ckpt"


def checkpoint_path(workdir: Path, step: int) -> Path:
    return checkpoint_dir(workdir) / f"step-{step:08d}.npz"


def list_checkpoints(workdir: Path) -> list[tuple[int, Path]]:
    """(step, path) of the checkpoints in ``workdir``, newest first."""
    found = []
    directory = checkpoint_dir(workdir)
    if directory.is_dir():
        for path in directory.iterdir():
            m = _NAME_RE.match(path.name)
            if m:
                found.append((int(m.group(1)), path))
    return sorted(found, reverse=True)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_savez(path: Path, arrays: dict[str, Any]) -> None:
    """``np.savez`` to ``path`` via tmp + fsync + ``os.replace`` + directory fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def state_arrays(state: TrainState, extra_meta: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {
        "format": FORMAT_VERSION,
        "step": state.step,
        "config": state.config.to_dict(),
        "rng_state": state.rng_state,
        **state.meta,
        **(extra_meta or {}),
    }
    arrays: dict[str, Any] = {"meta": np.array(json.dumps(meta))}
    for name in PARAM_NAMES:
        arrays[f"p_{name}"] = state.params[name]
        arrays[f"v_{name}"] = state.velocity[name]
    arrays["losses"] = np.asarray(state.losses, dtype=np.float64)
    return arrays


def save_checkpoint(
    workdir: Path, state: TrainState, *, keep: int = 2, extra_meta: dict[str, Any] | None = None
) -> Path:
    """Write ``state`` atomically; drop all but the newest ``keep`` checkpoints."""
    path = checkpoint_path(workdir, state.step)
    atomic_savez(path, state_arrays(state, extra_meta))
    for _, old in list_checkpoints(workdir)[max(1, keep) :]:
        with contextlib.suppress(OSError):
            old.unlink()
    return path


def load_state(path: Path) -> TrainState:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"{path}: checkpoint format {meta.get('format')!r}")
        params = {name: z[f"p_{name}"].copy() for name in PARAM_NAMES}
        velocity = {name: z[f"v_{name}"].copy() for name in PARAM_NAMES}
        losses = [float(v) for v in z["losses"]]
    cfg = ModelConfig.from_dict(meta.pop("config"))
    step = int(meta.pop("step"))
    rng_state = meta.pop("rng_state")
    meta.pop("format")
    if len(losses) != step:
        raise ValueError(f"{path}: {len(losses)} losses for step {step}")
    return TrainState(cfg, step, params, velocity, rng_state, losses, meta)


def load_latest(workdir: Path, cfg: ModelConfig) -> tuple[TrainState, Path] | None:
    """The newest checkpoint that loads, or None. Raises CheckpointMismatch when it was
    written by a run with another config (resuming it would silently mix two runs)."""
    for _, path in list_checkpoints(workdir):
        try:
            state = load_state(path)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            log.warning("checkpoint %s unreadable (%s); trying the one before", path, exc)
            continue
        if state.config != cfg:
            raise CheckpointMismatch(
                f"{path} was written with {state.config}, this run has {cfg}; "
                "use another --workdir or the same settings"
            )
        return state, path
    return None
